"""The trainer of `wgrumus train` for every model and layout: ranks of dp x tp x pp (1 x 1 x 1
included) on the training engine (distributed/engine.py), threads of this process or this process
alone (--backend mpi / processes). Behind one interface, so loop.py never looks at the layout:
``step(step, x, y, next_batch) -> pending loss``, ``predict(x)``, dense ``state_dict`` /
``load_state_dict``, ``agree_stop(flag)``, ``device_stats(seconds)``, ``is_main``, ``close()``.
The same seed gives the same weights and batches in every layout, so all agree step by step."""
from __future__ import annotations

import numpy as np

import wgrumus as wr

from ..distributed import ThreeDParallelismConfig
from ..distributed.engine import RankEngine, RankPool, SyncOptions
from ..distributed.groups import ProcessGroupManager
from ..distributed.launch import init_process_group, rank_device
from ..distributed.parallel3d import (
    Layout3DError,
    RankTrainer,
    chunks_per_stage,
    gpt_shard_plan,
    validate_layout,
)
from ..distributed.tensor_parallel.shard import REPLICATE, shard_array, unshard_arrays
from ..nn import GPTConfig
from ..ops.elementwise import copy_into
from .common import UsageError
from .trainer_parts import GPTPart, ReplicaPart, StagePart

COLLECTIVE_TIMEOUT = 120.0  # a rank waiting longer on a peer gives up: that peer failed or hung
STEP_TIMEOUT = 900.0        # the longest the driver waits for one command on all ranks


def make_trainer(cfg, task):
    return EngineTrainer(cfg, task)


def to_tensor(arr: np.ndarray, device):
    dtype = wr.int32 if np.issubdtype(arr.dtype, np.integer) else wr.float32
    return wr.tensor(np.ascontiguousarray(arr), device=device, dtype=dtype)


def gpt_config(cfg, task) -> GPTConfig:
    g = cfg.gpt
    vocab = task.config["vocab_size"]
    # A multiple of 8, so tp in {1, 2, 4, 8} splits it and every layout trains the same model.
    padded = -(-vocab // 8) * 8
    return GPTConfig(vocab_size=padded, block_size=g["block_size"], n_layer=g["n_layer"],
                     n_head=g["n_head"], n_embd=g["n_embd"])


def sync_options(cfg) -> SyncOptions:
    return SyncOptions(comm_dtype=wr.float16 if cfg.grad_comm == "f16" else None,
                       grad_accum=cfg.grad_accum, sync_every=cfg.sync_every,
                       local_sgd_warmup=cfg.local_sgd_warmup)


def check_layout(cfg, task) -> None:
    """Every reason this layout cannot run this model, as one UsageError, before any rank."""
    lay = cfg.layout
    if cfg.model == "gpt":
        try:
            validate_layout(gpt_config(cfg, task), lay.dp, lay.tp, lay.pp, lay.world,
                            cfg.batch_size // cfg.grad_accum, lay.micro_batches, lay.schedule)
        except Layout3DError as e:
            raise UsageError(str(e)) from None
        return
    chunks = chunks_per_stage(lay.schedule) if lay.pp > 1 else 1
    n_layers = len(list(iter(task.make_model(wr.devices()[0]))))
    if lay.pp * chunks > n_layers:
        raise UsageError(f"--pp {lay.pp}{' x 2 interleaved chunks' if chunks > 1 else ''} "
                         f"needs at least {lay.pp * chunks} layers; {cfg.model} has {n_layers}")


class _EngineRank:
    """One rank: its model part, optimizer and RankEngine, and its share of each batch."""

    def __init__(self, group, cfg, task):
        lay = cfg.layout
        self.cfg, self.task, self.lay = cfg, task, lay
        self.device = group.device
        config = ThreeDParallelismConfig(lay.dp, lay.tp, lay.pp)
        self.gpt = cfg.model == "gpt"
        if self.gpt and lay.tp == lay.pp == lay.micro_batches == 1:
            # whole replicas: the dense model, its gradients averaged in buckets during backward
            self.gcfg = gpt_config(cfg, task)
            self.pgm = ProcessGroupManager(config, group)
            model = self.gcfg.build(cfg.seed, self.device)
            model.checkpoint = task.activation_checkpointing
            self.part = ReplicaPart(model, task.loss)
            self.plan = gpt_shard_plan(self.part.names)
        elif self.gpt:
            self.gcfg = gpt_config(cfg, task)
            rt = RankTrainer(group, self.gcfg, lay.dp, lay.tp, lay.pp, lay.schedule,
                             lay.micro_batches, cfg.seed, task.activation_checkpointing)
            self.pgm, self.part = rt.pgm, GPTPart(rt)
            self.plan = gpt_shard_plan(self.part.names)
        else:
            self.pgm = ProcessGroupManager(config, group)
            model = task.make_model(self.device)
            self.part = ReplicaPart(model, task.loss) if lay.pp == 1 else \
                StagePart(model, task.loss, self.pgm, lay.schedule, lay.micro_batches,
                          self.device)
            self.plan = {n: REPLICATE for n in self.part.names}
        m = self.pgm.mapping
        self.coords = (m.dp_rank, m.tp_rank, m.pp_rank)
        self.holds_loss = m.tp_rank == 0 and m.pp_rank == lay.pp - 1
        model_group = group.split(m.dp_rank, name=f"model-dp{m.dp_rank}") \
            if lay.tp * lay.pp > 1 else None
        clip = {}
        if task.clip is not None and model_group is not None:  # one norm over the replica
            dup = [p for n, p in zip(self.part.names, self.part.params)
                   if m.tp_rank > 0 and self.plan[n] == REPLICATE]
            clip = {"group": model_group, "counted_elsewhere": dup}
        self.opt = task.make_optimizer(self.part.params, **clip)
        self.engine = RankEngine(self.part, self.opt, self.device, dp_group=self.pgm.dp_group,
                                 model_group=model_group, sync=sync_options(cfg),
                                 precision=cfg.precision, jit=cfg.jit,
                                 timeout=COLLECTIVE_TIMEOUT, names=self.part.names)
        self._ready = None  # (step, micro-batches) uploaded ahead

    def _upload(self, x, y) -> list:
        """This replica's rows of the global batch as grad_accum micro-steps of m
        (inputs, targets) device pairs."""
        dp, k, m = self.lay.dp, self.cfg.grad_accum, self.lay.micro_batches
        per = len(x) // dp
        lo = self.coords[0] * per
        x, y = x[lo:lo + per], y[lo:lo + per]
        size = per // (k * m)
        out = []
        for i in range(k):
            mb = []
            for j in range(m):
                a = (i * m + j) * size
                mb += [to_tensor(x[a:a + size], self.device), to_tensor(y[a:a + size],
                                                                        self.device)]
            out.append(mb)
        return out

    def step(self, step: int, x, y, nxt):
        """Step ``step`` on the global batch (x, y); ``nxt``: the next one, uploaded now so that
        the device has it when the next step starts."""
        ready = self._ready
        mbs = ready[1] if ready is not None and ready[0] == step else self._upload(x, y)
        self._ready = None
        loss = self.engine.step(mbs)
        if nxt is not None:
            self._ready = (step + 1, self._upload(*nxt))
        return loss if self.holds_loss else None

    def state(self) -> dict:
        """This rank's shards (numpy) of parameters and optimizer state, keyed by name."""
        osd = self.opt.state_dict()
        names = self.part.names
        opt = {n: {k: (v.numpy() if hasattr(v, "numpy") else v)
                   for k, v in osd["state"].get(i, {}).items()} for i, n in enumerate(names)}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in osd["param_groups"]]
        return {"coords": self.coords,
                "params": {n: p.numpy() for n, p in zip(names, self.part.params)},
                "opt": opt, "groups": groups}

    def load(self, dense: dict) -> None:
        """Take this rank's shards of a dense state (any layout wrote it)."""
        tp, r = self.lay.tp, self.coords[1]
        heads = self.gcfg.n_head if self.gpt else 1
        names = self.part.names

        def shard(n, arr):
            return shard_array(np.asarray(arr, np.float32), self.plan[n], tp, r,
                               is_bias=n.endswith("bias"), num_heads=heads)
        with wr.no_grad():
            for n, p in zip(names, self.part.params):
                copy_into(p, wr.tensor(shard(n, dense["params"][n]), device=self.device))
        state = {i: {k: (shard(n, v) if isinstance(v, np.ndarray) and v.ndim > 0 else v)
                     for k, v in dense["opt"].get(n, {}).items()} for i, n in enumerate(names)}
        groups = [dict(g, params=list(range(len(names)))) for g in dense["groups"]]
        self.opt.load_state_dict({"state": state, "param_groups": groups})
        self.engine.set_step(int(groups[0].get("lr_step", 0)) if groups else 0)

    def stats(self) -> dict:
        s = self.pgm.stats()
        return {"coords": self.coords, "device": self.device.host_index,
                "comm_seconds": sum(s[k]["seconds"] for k in ("dp", "tp", "pp")),
                "comm_bytes": sum(s[k].get("bytes", 0) for k in ("dp", "tp", "pp")),
                "dispatches": self.device.dispatches}

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            if hasattr(self.part, "close"):
                self.part.close()


def _dense(states: list, lay, heads: int) -> dict:
    """Replica 0's shards merged into dense parameters and optimizer state."""
    by = {tuple(s["coords"]): s for s in states}
    params, opt = {}, {}
    for pp in range(lay.pp):
        shards = [by[(0, t, pp)] for t in range(lay.tp)]
        plan = gpt_shard_plan(list(shards[0]["params"]))
        for n in shards[0]["params"]:
            kw = {"is_bias": n.endswith("bias"), "num_heads": heads}
            mode = plan[n] if lay.tp > 1 else REPLICATE
            params[n] = unshard_arrays([s["params"][n] for s in shards], mode, **kw)
            opt[n] = {k: unshard_arrays([s["opt"][n][k] for s in shards], mode, **kw)
                      if isinstance(v, np.ndarray) and v.ndim > 0 else v
                      for k, v in shards[0]["opt"].get(n, {}).items()}
    return {"params": params, "opt": opt, "groups": by[(0, 0, 0)]["groups"]}


class _Pending:
    """A step's loss, read from the device only when asked (a step later)."""

    def __init__(self, read):
        self._read, self._value = read, None

    def __call__(self) -> float:
        if self._read is not None:
            self._value, self._read = float(self._read()), None
        return self._value


class EngineTrainer:
    """Every model and layout (see the module docstring)."""

    def __init__(self, cfg, task):
        self.cfg, self.task, self.lay = cfg, task, cfg.layout
        check_layout(cfg, task)
        self.is_main, self.group = True, None
        if self.lay.backend in ("mpi", "processes"):
            self.group = init_process_group(self.lay.backend, timeout=COLLECTIVE_TIMEOUT)
            self.is_main = self.group.rank == 0
            if self.group.device is None:
                self.group.device = rank_device(self.group.rank)
            self.pool = RankPool(self.lay.world, group=self.group, timeout=COLLECTIVE_TIMEOUT)
        else:
            self.pool = RankPool(self.lay.world, wr.devices()[:self.lay.world],
                                 timeout=COLLECTIVE_TIMEOUT)
        self.ranks = self.pool.run(lambda k: _EngineRank(self.pool.groups[k], cfg, task),
                                   STEP_TIMEOUT)
        self.device = wr.devices()[0]
        self._dense_model = None

    @property
    def dp(self) -> int:
        return self.lay.dp

    def step(self, step: int, x, y, nxt=None) -> _Pending:
        """Launch step ``step``; returns its global-batch loss, read when called."""
        self._dense_model = None
        losses = self.pool.run(lambda k: self.ranks[k].step(step, x, y, nxt), STEP_TIMEOUT)
        held = [v for v in losses if v is not None]
        if self.group is None:
            return _Pending(lambda: float(np.mean([float(v.item()) for v in held])))
        mine = held[0] if held else None

        def read():  # every rank reads in the same order: one small gather per step
            vals = [v for v in self.group.all_gather_object(
                None if mine is None else float(mine.item())) if v is not None]
            return float(np.mean(vals))
        return _Pending(read)

    def agree_stop(self, flag: bool) -> bool:
        if self.group is not None:  # one rank's Ctrl-C stops them all
            return bool(self.group.all_reduce(np.array([float(flag)]), "max")[0])
        return flag

    def _all(self, cmd, *args) -> list:
        out = self.pool.run(lambda k: getattr(self.ranks[k], cmd)(*args), STEP_TIMEOUT)
        if self.group is not None and cmd in ("state", "stats"):
            return self.group.all_gather_object(out[0])
        return out

    def _heads(self) -> int:
        return self.cfg.gpt["n_head"] if self.cfg.model == "gpt" else 1

    def _dense(self) -> dict:
        return _dense(self._all("state"), self.lay, self._heads())

    def state_dict(self) -> dict:
        """gpt: dense names; mlp / cnn: the model's state_dict and a dense optimizer's state."""
        dense = self._dense()
        if self.cfg.model == "gpt":
            return dense
        order = list(self._model_names())
        state = {i: dense["opt"][n] for i, n in enumerate(order) if dense["opt"].get(n)}
        groups = [dict(g, params=list(range(len(order)))) for g in dense["groups"]]
        return {"model": dense["params"],
                "optimizer": {"state": state, "param_groups": groups}}

    def _model_names(self) -> list:
        return [n for n, _ in self.task.make_model(self.device).named_parameters()]

    def load_state_dict(self, sd) -> None:
        if self.cfg.model != "gpt":
            order = self._model_names()
            o = sd["optimizer"]
            sd = {"params": sd["model"],
                  "opt": {order[int(i)]: v for i, v in o["state"].items()},
                  "groups": [{k: v for k, v in g.items() if k != "params"}
                             for g in o["param_groups"]]}
        self._all("load", sd)
        self._dense_model = None

    def predict(self, x) -> np.ndarray:
        """The gathered weights in a dense model on device 0 (evaluation and sampling)."""
        if self._dense_model is None:
            params = self._dense()["params"]
            if self.cfg.model == "gpt":
                model = gpt_config(self.cfg, self.task).build(self.cfg.seed, self.device)
            else:
                model = self.task.make_model(self.device)
            model.load_state_dict(params)
            model.eval()
            self._dense_model = model
        with wr.no_grad():
            xt = to_tensor(np.asarray(x), self.device)
            logits = self._dense_model(xt).numpy()
        if self.cfg.model == "gpt":
            return logits[..., :self.task.config["vocab_size"]]
        return logits

    def device_stats(self, seconds: float) -> list[dict]:
        return [{"device": s["device"], "role": "dp {} tp {} pp {}".format(*s["coords"]),
                 "dispatches": s["dispatches"],
                 "comm share": min(1.0, s["comm_seconds"] / seconds) if seconds else 0.0}
                for s in sorted(self._all("stats"), key=lambda s: s["device"])]

    def close(self) -> None:
        try:
            self.pool.run(lambda k: self.ranks[k].close(), 60.0)
        finally:
            self.pool.close()


__all__ = ["EngineTrainer", "make_trainer", "to_tensor", "gpt_config"]
