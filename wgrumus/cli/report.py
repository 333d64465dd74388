"""What a training run shows: the live progress bar (loss, throughput, ETA), the result record
(the `--json` document), the summary table and the loss curve."""
from __future__ import annotations

import os
import time

from .common import console
from .plot import save_png, terminal_plot


class Progress:
    """A rich progress bar on rank 0; does nothing when disabled (--json, other ranks)."""

    def __init__(self, cfg, task, steps: int, start: int, enabled: bool):
        self.enabled, self.steps, self.start = enabled, steps, start
        self.unit = task.unit
        self.per_step = cfg.batch_size * task.units_per_sample
        self._t0 = None
        self._bar = None

    def __enter__(self):
        if self.enabled:
            import rich.progress as rp  # loads only when a bar is shown (not for --json)
            self._bar = rp.Progress(
                rp.TextColumn("[bold]{task.description}"), rp.BarColumn(),
                rp.MofNCompleteColumn(), rp.TextColumn("loss [cyan]{task.fields[loss]}"),
                rp.TextColumn("{task.fields[speed]}"), rp.TimeElapsedColumn(),
                rp.TextColumn("ETA"), rp.TimeRemainingColumn(), console=console(stderr=True),
                transient=False, refresh_per_second=4)
            self._bar.__enter__()
            self._id = self._bar.add_task("train", total=self.steps, completed=self.start,
                                          loss="-", speed="")
        self._t0 = time.perf_counter()
        return self

    def update(self, step: int, loss: float) -> None:
        if not self.enabled:
            return
        dt = time.perf_counter() - self._t0
        rate = (step - self.start) * self.per_step / dt if dt > 0 else 0.0
        self._bar.update(self._id, completed=step, loss=f"{loss:.4f}",
                         speed=f"{rate:,.0f} {self.unit}/s")

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False


def result(cfg, task, trainer, losses, steps_run: int, seconds: float, interrupted: bool,
           diverged: bool = False) -> dict:
    """The machine-readable record of a run (what `--json` prints)."""
    lay = cfg.layout
    units = steps_run * cfg.batch_size * task.units_per_sample
    out = {
        "model": cfg.model, "steps": len(losses), "steps_this_run": steps_run,
        "losses": [float(v) for v in losses],
        "final_loss": float(losses[-1]) if losses else None,
        "seconds": seconds,
        "throughput": units / seconds if seconds > 0 else 0.0,
        "throughput_unit": f"{task.unit}/s",
        "batch_size": cfg.batch_size, "optimizer": cfg.optimizer, "lr": task.lr,
        "seed": cfg.seed, "jit": cfg.jit,
        "layout": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "schedule": lay.schedule,
                   "micro_batches": lay.micro_batches, "devices": lay.world,
                   "backend": lay.backend},
        "sync": {"grad_comm": cfg.grad_comm, "grad_accum": cfg.grad_accum,
                 "sync_every": cfg.sync_every, "local_sgd_warmup": cfg.local_sgd_warmup},
        "interrupted": interrupted,
        "diverged": diverged,  # the loss turned NaN/infinite (printed as null in --json)
    }
    if lay.tp > 1:  # how the tensor-parallel all-reduces ran (TUNING while it trained)
        from ..distributed.tensor_parallel.overlap import tp_chunks, tp_overlap  # tp runs only
        out["tp_comm"] = {"chunks": tp_chunks(), "overlap": tp_overlap()}
    if cfg.model == "gpt":
        out["config"] = dict(cfg.gpt)
    out.update(task.evaluate(trainer))  # accuracy / eval_loss / sample, as the task has them
    out["devices"] = trainer.device_stats(seconds)
    if cfg.checkpoint:
        out["checkpoint"] = os.path.abspath(cfg.checkpoint)
    return out


def summary(cfg, task, res: dict) -> None:
    from rich.table import Table  # rich loads only when a table is shown (not for --json)
    con = console()
    t = Table(title=f"{cfg.title}: {cfg.model}" + (" (interrupted)" if res["interrupted"] else ""),
              title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("layout", cfg.layout.describe())
    if (sync := _sync_text(cfg)):
        t.add_row("gradients", sync)
    t.add_row("steps", f"{res['steps']} (batch {res['batch_size']}, {res['optimizer']} "
              f"lr {res['lr']:g})")
    if res["losses"]:
        t.add_row("loss", f"{res['losses'][0]:.4f} -> {res['final_loss']:.4f}")
    for key, label in (("eval_loss", "held-out loss"), ("accuracy", "held-out accuracy")):
        if res.get(key) is not None:
            t.add_row(label, f"{res[key]:.2%}" if key == "accuracy" else f"{res[key]:.4f}")
    t.add_row("time", f"{res['seconds']:.1f} s for {res['steps_this_run']} steps "
              f"({res['throughput']:,.0f} {res['throughput_unit']})")
    if res.get("sample"):
        t.add_row("sample", repr(res["sample"]))
    if res.get("checkpoint"):
        t.add_row("checkpoint", res["checkpoint"])
    con.print(t)
    if res.get("devices"):
        dt = Table(title="per device", title_justify="left")
        cols = list(res["devices"][0].keys())
        for c in cols:
            dt.add_column(c)
        for row in res["devices"]:
            dt.add_row(*(_fmt(row[c]) for c in cols))
        con.print(dt)
    _curve(cfg, res, con)


def _sync_text(cfg) -> str:
    """The non-default gradient synchronisation, in words ('' when exact every step)."""
    parts = []
    if cfg.grad_comm == "f16" and cfg.layout.dp > 1:
        parts.append("float16 on the wire")
    if cfg.grad_accum > 1:
        parts.append(f"{cfg.grad_accum} micro-steps per step")
    if cfg.sync_every is not None:
        parts.append(f"local SGD, parameters averaged every {cfg.sync_every} steps after "
                     f"{cfg.local_sgd_warmup} exact ones")
    return "; ".join(parts)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.1%}" if 0 <= v <= 1 else f"{v:.3g}"
    return str(v)


def _curve(cfg, res, con) -> None:
    losses = res["losses"]
    if len(losses) < 2:
        return
    path = cfg.plot or os.path.join(cfg.checkpoint or ".", f"wgrumus-{cfg.model}-loss.png")
    if not os.path.splitext(path)[1]:
        path += ".png"  # what matplotlib would write anyway: say the real name
    try:
        saved = save_png(losses, path, f"{cfg.model} ({cfg.layout.describe()})")
        missing = not saved
    except (OSError, ValueError) as e:  # unwritable path, or an extension it cannot write
        con.print(f"[yellow]could not write {path}: {e}")
        saved = missing = False
    if saved:
        con.print(f"loss curve: {os.path.abspath(path)}")
        return
    con.print("loss per step" + (" (pip install matplotlib for a PNG)" if missing else "")
              + ":", markup=False)
    con.print(terminal_plot(losses), markup=False, highlight=False)



def steady(cfg, task, t0: float, done_at: list) -> dict:
    """Steady-state speed: wall-clock per optimizer step after the first max(3, 10%) steps
    (captures, compiles and warm-up excluded), timed where each step's loss was read."""
    n = len(done_at)
    skip = max(3, -(-n // 10))
    if n > skip:
        steps, span = n - skip, done_at[-1] - done_at[skip - 1]
    else:  # too short a run to leave the warm-up out: every step counts
        steps, span = n, (done_at[-1] - t0 if n else 0.0)
    step_s = span / steps if steps else 0.0
    key = "tokens_per_s" if task.unit == "tokens" else "samples_per_s"
    rate = cfg.batch_size * task.units_per_sample / step_s if step_s > 0 else 0.0
    return {"step_ms": step_s * 1e3, key: rate, "steps": steps}
