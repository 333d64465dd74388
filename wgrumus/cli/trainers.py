"""Trainers: one per parallel layout behind one interface, so loop.py never looks at the layout:
``step(x, y) -> loss``, ``predict(x)``, dense ``state_dict``/``load_state_dict``,
``agree_stop(flag)``, ``device_stats(seconds)``, ``is_main``, ``close()``."""
from __future__ import annotations

import numpy as np

import wgrumus as wr

from ..distributed.launch import PER_PROCESS
from .common import UsageError


def make_trainer(cfg, task):
    """gpt: every layout (1x1x1 too) runs the 3D engine, so all agree step by step."""
    lay = cfg.layout
    if cfg.model == "gpt":
        from .trainers_3d import ThreeDTrainer
        return ThreeDTrainer(cfg, task)
    if lay.backend in PER_PROCESS and lay.pp > 1:
        raise UsageError(f"--backend {lay.backend} runs --pp for the gpt model; for mlp/cnn "
                         f"use --backend {lay.backend} with --dp only, or --pp with the "
                         "threads backend")
    from .trainers_parallel import DataParallelTrainer, PipelineTrainer
    if lay.pp > 1:
        return PipelineTrainer(cfg, task)
    if lay.dp > 1 or lay.backend in PER_PROCESS:
        return DataParallelTrainer(cfg, task)
    return SingleTrainer(cfg, task)


def to_tensor(arr: np.ndarray, device):
    dtype = wr.int32 if np.issubdtype(arr.dtype, np.integer) else wr.float32
    return wr.tensor(np.ascontiguousarray(arr), device=device, dtype=dtype)


def eval_forward(model, x, device) -> np.ndarray:
    """Dense outputs of ``model`` on ``x`` in eval mode, without gradients."""
    model.eval()
    with wr.no_grad():
        out = model(to_tensor(x, device)).numpy()
    model.train()
    return out


def with_bookkeeping(opts, run):
    """``run()`` between the optimizers' host bookkeeping, which a wr.jit replay skips."""
    ts = [o.begin_step() for o in opts]
    out = run()
    for o, t in zip(opts, ts):
        o.end_step(t)
    return out


class TrainerBase:
    """Defaults shared by the trainers: rank 0 prints; under MPI every process stops after the
    same step (others would wait for a rank that left); one ``model`` with its replicas'
    optimizers ``opts`` (identical states) on ``device`` checkpoints and predicts."""
    is_main = True
    group = None

    def predict(self, x) -> np.ndarray:
        return eval_forward(self.model, x, self.device)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.opts[0].state_dict()}

    def load_state_dict(self, sd) -> None:
        self.model.load_state_dict(sd["model"])
        self._loaded()
        for o in self.opts:
            o.load_state_dict(sd["optimizer"])

    def _loaded(self) -> None:
        """The model's weights were replaced (replicas copy them here)."""

    def agree_stop(self, flag: bool) -> bool:
        if self.group is not None:  # one rank's Ctrl-C stops them all
            return bool(self.group.all_reduce(np.array([float(flag)]), "max")[0])
        return flag

    def join_mpi(self, timeout: float):
        """--backend processes / mpi: join the group (the launch's, else MPI's); returns this
        rank's device (rank % devices)."""
        from ..distributed.launch import init_process_group, rank_device
        self.group = init_process_group(None, timeout=timeout)
        self.is_main = self.group.rank == 0
        return rank_device(self.group.rank)

    def close(self) -> None:
        pass


class Precision:
    """--precision of a trainer: f32, or f16 (autocast + dynamic loss scaling, f32 master
    weights) through ``autocast()``, ``scaler.scale(loss)`` and ``step(opt, grads)``."""

    def __init__(self, precision: str, device):
        self.f16 = precision == "f16"
        self.device = device
        self.scaler = wr.amp.GradScaler(enabled=self.f16)

    def autocast(self):
        return wr.autocast(enabled=self.f16, device=self.device)

    def step(self, opt, grads) -> None:
        """The optimizer's device work (``clip_and_step``) through the scaler."""
        self.scaler.step(_DeviceWork(opt), grads)
        self.scaler.update()


class _DeviceWork:
    """A TrainOptimizer stepped by ``clip_and_step`` (unscaled first, by GradScaler.step)."""
    _step_supports_amp_scaling = True

    def __init__(self, opt):
        self.opt, self.param_groups = opt, opt.param_groups

    def step(self, grads=None, found_inf=None) -> None:
        self.opt.clip_and_step(grads, found_inf)


class SingleTrainer(TrainerBase):
    """Plain training on device 0: forward, backward on the tape, fused optimizer step."""

    def __init__(self, cfg, task):
        self.task = task
        self.device = wr.devices()[0]
        self.model = task.make_model(self.device)
        self.opt = task.make_optimizer(self.model.parameters())
        self.opts = [self.opt]
        self.amp = Precision(cfg.precision, self.device)
        self._step = wr.jit(self._train_step) if cfg.jit else self._train_step

    def _train_step(self, x, y):
        with self.amp.autocast():
            loss = self.task.loss(self.model(x), y)
        self.amp.step(self.opt, wr.autograd.backward(self.amp.scaler.scale(loss)))
        return loss

    def step(self, x, y) -> float:
        self.model.train()
        x, y = to_tensor(x, self.device), to_tensor(y, self.device)
        loss = with_bookkeeping([self.opt], lambda: self._step(x, y))
        return float(loss.item())

    def close(self) -> None:
        """Free the captured step's buffers now (the trainer and its jit form a cycle)."""
        if hasattr(self._step, "free"):
            self._step.free()

    def device_stats(self, seconds: float) -> list[dict]:
        d = self.device
        return [{"device": d.index, "name": d.name, "dispatches": d.dispatches,
                 "submits": d.submits}]

