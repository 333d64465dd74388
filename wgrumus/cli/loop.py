"""The training loop behind `wgrumus train` and `wgrumus demo`: build task and trainer for a
checked TrainConfig (config.py), run the steps with a progress bar, checkpoint and report."""
from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time

from ..runtime.tuning import TUNING
from . import checkpoint, models, report
from .common import UsageError, print_json, say_error
from .config import TrainConfig


def train(cfg: TrainConfig) -> int:
    was = TUNING.tp_chunks, TUNING.tp_overlap
    if cfg.tp_chunks is not None:
        TUNING.tp_chunks = cfg.tp_chunks
    if cfg.tp_overlap is not None:
        TUNING.tp_overlap = cfg.tp_overlap
    try:
        return _train(cfg)
    finally:
        TUNING.tp_chunks, TUNING.tp_overlap = was


def _train(cfg: TrainConfig) -> int:
    from . import trainers  # the parallel layers (engine, 3D ranks, TP/PP parts): not for --help
    task = models.build(cfg)
    steps = cfg.steps or (max(1, math.ceil(cfg.epochs * task.steps_per_epoch(cfg.batch_size)))
                          if cfg.epochs else task.default_steps)
    saved = checkpoint.check(cfg, task) if cfg.resume else None
    if saved and int(saved[0]["step"]) >= steps:
        raise UsageError(f"the checkpoint in {cfg.checkpoint!r} is already at step "
                         f"{saved[0]['step']} >= --steps {steps}; ask for more steps")
    task.total_steps = steps  # the cosine schedule decays over the whole run
    trainer = trainers.make_trainer(cfg, task)
    hard_stop = False
    try:
        start, losses = checkpoint.load(trainer, *saved) if saved else (0, [])
        ui = report.Progress(cfg, task, steps, start, enabled=trainer.is_main and not cfg.json)
        t0 = time.perf_counter()
        done_at: list = []  # when each step's loss was read (steady-state timing)
        with StopOnInterrupt() as stop, ui:
            run_steps(cfg, task, trainer, start, steps, losses, ui, stop, done_at)
        interrupted = stop.requested
        diverged = not all(math.isfinite(v) for v in losses[start:])
        seconds = time.perf_counter() - t0
        # also after Ctrl-C: the steps done so far are kept; never diverged weights
        if cfg.checkpoint and not diverged:
            checkpoint.save(cfg, task, trainer, len(losses), losses)
        result = report.result(cfg, task, trainer, losses, len(losses) - start, seconds,
                               interrupted, diverged)
        result["steady"] = report.steady(cfg, task, t0, done_at)
    except KeyboardInterrupt:
        # A second Ctrl-C leaves at once: closing would wait for the ranks to finish the step
        # they are in (seconds to minutes); they are daemon threads and the process is exiting.
        hard_stop = True
        raise
    finally:
        if not hard_stop:
            trainer.close()
    if cfg.json:
        print_json(result)
    elif trainer.is_main:
        report.summary(cfg, task, result)
    if diverged:
        if trainer.is_main:
            print(f"{cfg.title}: error: {_divergence(cfg, task, losses, start)}",
                  file=sys.stderr, flush=True)
        return 1
    return 130 if interrupted else 0


def run_steps(cfg, task, trainer, start, steps, losses, ui, stop, done_at) -> None:
    """The steps, each launched before the previous one's loss is read (no device wait between
    steps); the next batch goes to the devices while the current step runs. A checkpoint is
    written between steps, so its step's loss is read before the next step starts."""
    pending, nxt = None, task.batch(start, cfg.batch_size) if start < steps else None

    def read(step: int, p) -> None:
        losses.append(p())
        done_at.append(time.perf_counter())
        ui.update(step + 1, losses[-1])

    def settle(step: int, p) -> bool:
        """Step ``step``'s loss recorded; True when training must stop there."""
        read(step, p)
        if trainer.agree_stop(stop.requested or not math.isfinite(losses[-1])):
            return True
        if cfg.checkpoint and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < steps:
            checkpoint.save(cfg, task, trainer, step + 1, losses)
        return False

    for step in range(start, steps):
        x, y = nxt
        nxt = task.batch(step + 1, cfg.batch_size) if step + 1 < steps else None
        if pending is not None and cfg.checkpoint and step % cfg.checkpoint_every == 0:
            if settle(step - 1, pending):  # the checkpoint holds step - 1's weights
                return
            pending = None
        p = trainer.step(step, x, y, nxt)
        if pending is not None and settle(step - 1, pending):
            read(step, p)  # the step already launched counts too
            return
        pending = p
    if pending is not None:
        settle(steps - 1, pending)


def _divergence(cfg, task, losses, start) -> str:
    bad = next(i for i in range(start, len(losses)) if not math.isfinite(losses[i]))
    kept = (f"; no checkpoint of the diverged weights was written to {cfg.checkpoint!r}"
            if cfg.checkpoint else "")
    return (f"the loss became {losses[bad]} at step {bad + 1}, so training stopped (it "
            f"diverged); lower --lr (it was {task.lr:g}){kept}")


class StopOnInterrupt:
    """Ctrl-C stops after the current step (no half-updated checkpoint); a second one at once."""

    def __init__(self):
        self.requested = False
        self._old = None

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        # said at once (a step may take a while to finish), and never raised into the step: a
        # stderr pipe closed by the same Ctrl-C (`| tee`), or met mid-write, lost the checkpoint
        with contextlib.suppress(OSError, RuntimeError):
            say_error("interrupted: stopping after this step (Ctrl-C again stops at once)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False
