"""Soak: many training steps, watching for leaks.

``--model dp`` (default): a small MLP under DataParallel on ``--devices`` logical devices.
``--model linear``: Linear 32-64-10, AdamW, batch 128 on one device (grew 1.1 MB of native
memory per step on lavapipe before the parameters moved out of a uniform buffer there).
``--model mlp|cnn|gpt``: the CLI's models and data (``wgrumus train``), on one device; gpt at
``--gpt-size`` (n_layer, n_embd, n_head, block_size).

Every ``--every`` steps it samples the GPU buffer pools (``device.pool.stats()`` summed over the
devices: live bytes, cached bytes, buffers ever created), the host resident set
(/proc/self/statm, else resource.getrusage's peak) and the thread count. After ``--warmup``
steps all of them must stay flat: no new GPU buffers, live bytes and threads unchanged, RSS
growth under ``--rss-slack-mb``. The last line is the verdict with the RSS slope in KB/step.

    python benchmarks/soak.py --steps 10000 --devices 2 --json soak.json
    python benchmarks/soak.py --model linear --steps 2000 --every 100 --warmup 200
    for m in mlp cnn gpt; do python benchmarks/soak.py --model $m --steps 10000; done
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("WGRUMUS_DEVICES", "8")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is the best the stdlib offers
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def pool_totals(devs) -> dict:
    tot = {"live_bytes": 0, "cached_bytes": 0, "buffers_created": 0}
    for d in {id(d): d for d in devs}.values():
        for k, v in d.pool.stats().items():
            tot[k] = tot.get(k, 0) + int(v)
    return tot


def sample(step: int, devs, loss: float, t0: float) -> dict:
    return {"step": step, "seconds": round(time.monotonic() - t0, 2), "loss": loss,
            "rss_mb": round(rss_bytes() / 2**20, 2), "threads": threading.active_count(),
            **pool_totals(devs)}


def soak(steps: int, n_devices: int = 2, every: int = 50, warmup: int = 100, batch: int = 16,
         seed: int = 0, log=None) -> list:
    """Train a small MLP with DataParallel for ``steps`` steps; return the samples."""
    import wgrumus as wr
    from wgrumus import nn
    from wgrumus.parallel import DataParallel
    devs = wr.devices()[:n_devices]
    if len(devs) < n_devices:
        raise ValueError(f"soak needs {n_devices} devices, this process has {len(devs)}; set "
                         f"WGRUMUS_DEVICES={n_devices}")
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((8, 3)).astype(np.float32)
    data = [rng.standard_normal((batch, 8)).astype(np.float32) for _ in range(16)]
    targets = [x @ W for x in data]
    model = nn.Sequential(nn.Linear(8, 32, device=devs[0], seed=seed), nn.ReLU(),
                          nn.Linear(32, 3, device=devs[0], seed=seed + 1))
    out = []
    t0 = time.monotonic()
    with DataParallel(model, devs, timeout=60) as dp:
        for step in range(1, steps + 1):
            k = step % len(data)
            loss = dp.train_step(data[k], targets[k], nn.functional.mse_loss,
                                 lambda ps: wr.optim.SGD(ps, lr=0.01, momentum=0.9))
            if step % every == 0 or step == steps or step == warmup:
                gc.collect()
                s = sample(step, devs, float(loss), t0)
                out.append(s)
                if log:
                    log(s)
    return out


MODELS = ("dp", "linear", "mlp", "cnn", "gpt")


def _cli_task(model: str, seed: int, gpt_size):
    """The ``wgrumus train`` task (model builder, data, loss, optimizer) of ``model``."""
    from types import SimpleNamespace

    from wgrumus.cli.models import build
    n_layer, n_embd, n_head, block = gpt_size
    return build(SimpleNamespace(model=model, lr=None, optimizer="adamw", seed=seed,
                                 gpt={"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
                                      "block_size": block}, clip=None, lr_schedule="constant",
                                 warmup=0, activation_checkpointing=False))


def soak_model(model: str, steps: int, every: int = 50, warmup: int = 100, batch: int = 128,
               seed: int = 0, gpt_size=(2, 64, 4, 32), log=None) -> list:
    """Train ``model`` ("linear", "mlp", "cnn", "gpt") on one device for ``steps`` steps, a
    host read of the loss every step (as a training loop that logs it); return the samples."""
    import wgrumus as wr
    from wgrumus import nn
    dev = wr.devices()[0]
    if model == "linear":
        rng = np.random.default_rng(seed)
        xs = rng.standard_normal((batch, 32)).astype(np.float32)
        ys = rng.integers(0, 10, batch).astype(np.int32)
        wr.manual_seed(seed)
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
        opt = wr.optim.AdamW(net.parameters(), lr=1e-3)
        loss_fn = nn.functional.cross_entropy
        next_batch = lambda step: (xs, ys)  # noqa: E731
    else:
        task = _cli_task(model, seed, gpt_size)
        net = task.make_model(dev)
        opt = task.make_optimizer(net.parameters())
        loss_fn = task.loss
        next_batch = lambda step: task.batch(step, batch)  # noqa: E731
    out = []
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        x, y = next_batch(step)
        loss = loss_fn(net(wr.tensor(x, device=dev)), wr.tensor(y, device=dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        if step % every == 0 or step == steps or step == warmup:
            gc.collect()
            s = sample(step, [dev], value, t0)
            out.append(s)
            if log:
                log(s)
    return out


def flatness(samples: list, warmup: int, rss_slack_mb: float) -> dict:
    """Drift of every watched figure after warm-up, and the problems found."""
    after = [s for s in samples if s["step"] >= warmup]
    if len(after) < 2:
        raise ValueError(f"need samples after the warm-up of {warmup} steps; run more steps")
    first, last = after[0], after[-1]
    spread = {k: max(s[k] for s in after) - min(s[k] for s in after)
              for k in ("live_bytes", "cached_bytes", "buffers_created", "threads", "rss_mb")}
    drift = {k: last[k] - first[k] for k in spread}
    steps = max(last["step"] - first["step"], 1)
    slope_kb = round(drift["rss_mb"] * 1024 / steps, 2)
    problems = []
    if spread["buffers_created"]:
        problems.append(f"{spread['buffers_created']} GPU buffers created after warm-up")
    if spread["live_bytes"]:
        problems.append(f"live GPU bytes vary by {spread['live_bytes']} after warm-up")
    if spread["threads"]:
        problems.append(f"thread count varies by {spread['threads']} after warm-up")
    if drift["rss_mb"] > rss_slack_mb:
        problems.append(f"host RSS grew {drift['rss_mb']:.1f} MB after warm-up "
                        f"(allowed {rss_slack_mb} MB)")
    if not last["loss"] < samples[0]["loss"]:
        problems.append(f"loss did not fall: {samples[0]['loss']} -> {last['loss']}")
    return {"from_step": first["step"], "to_step": last["step"], "spread": spread,
            "drift": drift, "rss_kb_per_step": slope_kb, "rss_mb": [first["rss_mb"],
                                                                    last["rss_mb"]],
            "problems": problems, "ok": not problems}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--model", choices=MODELS, default="dp",
                    help="dp: DataParallel MLP; linear: the issue-15 Linear 32-64-10 case; "
                         "mlp/cnn/gpt: the CLI's models on one device")
    ap.add_argument("--devices", type=int, default=2, help="replicas of --model dp")
    ap.add_argument("--batch", type=int, default=None,
                    help="batch size (default: dp 16, linear 128, mlp/cnn 64, gpt 16)")
    ap.add_argument("--gpt-size", default="2,64,4,32",
                    help="gpt: n_layer,n_embd,n_head,block_size")
    ap.add_argument("--every", type=int, default=250, help="sample every N steps")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--rss-slack-mb", type=float, default=16.0)
    ap.add_argument("--json", help="write samples and the verdict here")
    a = ap.parse_args(argv)
    if a.warmup >= a.steps:
        ap.error(f"--warmup {a.warmup} must be below --steps {a.steps}")
    t0 = time.monotonic()
    log = lambda s: print(json.dumps(s), flush=True)  # noqa: E731
    if a.model == "dp":
        samples = soak(a.steps, a.devices, a.every, a.warmup, batch=a.batch or 16, log=log)
    else:
        batch = a.batch or {"linear": 128, "gpt": 16}.get(a.model, 64)
        samples = soak_model(a.model, a.steps, a.every, a.warmup, batch,
                             gpt_size=tuple(int(v) for v in a.gpt_size.split(",")), log=log)
    verdict = flatness(samples, a.warmup, a.rss_slack_mb)
    verdict["model"] = a.model
    verdict["seconds"] = round(time.monotonic() - t0, 1)
    verdict["steps_per_second"] = round(a.steps / verdict["seconds"], 1)
    print(json.dumps(verdict, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps({"samples": samples, "verdict": verdict,
                                            "args": vars(a)}, indent=1))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
