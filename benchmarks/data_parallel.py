"""Data-parallel training throughput: samples/s of a GPT-mini on 1, 2 and 4 devices, the scaling
ratio against plain single-device training, and the exposed (non-overlapped) communication time.

    python benchmarks/data_parallel.py                       # GPT-mini on 1, 2 and 4 devices
    python benchmarks/data_parallel.py --quick               # small shapes for lavapipe / CI
    python benchmarks/data_parallel.py --model mlp --devices 1 2 --steps 20 --json
    WGRUMUS_DEVICES=2 python benchmarks/data_parallel.py     # only 2 devices (4 is skipped)
    mpiexec -n 2 python benchmarks/data_parallel.py --backend mpi   # one process per adapter

The threads backend records every replica's ops from one Python process, so the replicas share
one interpreter lock: it scales when a step is GPU-bound (raise --batch / --block / --n-embd until
the plain loop's step time is dominated by GPU work), and the mpi backend (one process per
adapter, device = rank % devices) sidesteps the lock altogether.

Weak scaling, like DDP is used: every device gets ``--batch`` samples, so K devices train on a
global batch of K x batch. Each configuration runs ``--warmup`` steps (shader compilation, buffer
pools), then ``--steps`` timed steps of ``DataParallel.train_step`` (scatter, forward, loss,
backward with bucketed all-reduce overlapped, AdamW step on every replica, loss readback).

Columns:
  samples/s  global samples per second over the timed steps;
  scaling    samples/s divided by the plain single-device loop's (no DataParallel: forward,
             backward, step on device 0) -- the >= 1.85x target on two adapters is for K=2;
             '+jit' rows are divided by the captured plain loop's ('plain+jit');
  step ms    mean wall time per step;
  exposed    mean time per step a replica waited for gradient all-reduce after its backward
             finished recording (``backward_end`` -> ``sync_end`` events, averaged over replicas);
             it includes GPU work of the backward tail still in flight, so it is an upper bound
             of the communication that backward did not hide;
  vs plain   step ms minus the plain loop's step ms: what data parallelism adds per step
             (communication not hidden, packing, the replicas' threads competing for the CPU);
  buckets    number of all-reduce buckets (``--bucket-mb``/``--first-bucket-mb``);
  wire MB    payload each replica hands its all-reduces per optimizer step (gradients, or
             local SGD's parameter averages spread over their period): float16 halves it.
'engine' rows run the training engine of `wgrumus train` (distributed/engine.py: a persistent
worker per device, each replica's step captured with --jit, losses read a step late): exact f32
gradients; 'engine-f16' sends them as float16 (`--grad-comm f16`); 'engine-accumK' runs K
micro-steps of --batch per device and one all-reduce (`--grad-accum K`, so K x the samples per
step); 'engine-localH' is post-local SGD (`--sync-every H`): parameters averaged every H steps.
'no-comm' rows run K plain loops at once (a thread and a device each, no DataParallel, no
communication): the ceiling of data parallelism on these devices and this process (the loops
share one interpreter; logical devices also share their adapter's time).
With ``--one-bucket`` each K > 1 is also run with a single bucket launched after backward (no
overlap), to show what the overlap saves. With ``--jit`` every row is also run with captured
steps (``wr.jit`` for the plain loop, ``DataParallel(jit=True)``: each replica replays its whole
step; a replay launches each bucket's all-reduce once the backward work completing it is submitted
and waits for the buckets before the optimizer step, so they overlap the rest of the backward;
'exposed' is then the replay's first bucket wait to its last bucket in).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["gpt", "mlp"], default="gpt")
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4],
                    help="replica counts to run; WGRUMUS_DEVICES defaults to the largest, "
                    "logical devices sharing an adapter (counts above a WGRUMUS_DEVICES "
                    "that is set are skipped)")
    ap.add_argument("--batch", type=int, default=16, help="samples per device per step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--block", type=int, default=128, help="sequence length (gpt)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", type=float, default=1.0)
    ap.add_argument("--one-bucket", action="store_true",
                    help="also run K > 1 with one bucket after backward (no overlap)")
    ap.add_argument("--backend", choices=["threads", "mpi"], default="threads",
                    help="mpi: run under mpiexec -n K; measures K = the number of processes")
    ap.add_argument("--quick", action="store_true", help="small shapes (lavapipe, CI)")
    ap.add_argument("--jit", action="store_true",
                    help="also run every row with wr.jit captured steps (rows '<mode>+jit')")
    ap.add_argument("--blocking-waits", action="store_true",
                    help="map waits block in wgpuDevicePoll as on CPU adapters (default on a "
                         "GPU: they poll; runtime/tuning.py blocking_waits)")
    ap.add_argument("--accum", type=int, default=4,
                    help="micro-steps of the 'engine-accumK' rows (default 4)")
    ap.add_argument("--sync-every", type=int, default=8,
                    help="local SGD period of the 'engine-localH' rows (default 8)")
    ap.add_argument("--no-engine", action="store_true",
                    help="leave out the training engine's rows")
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    a = ap.parse_args(argv)
    if a.quick:
        a.n_layer, a.n_embd, a.n_head, a.block, a.vocab, a.batch = 2, 64, 2, 32, 128, 4
        a.steps, a.warmup = min(a.steps, 4), min(a.warmup, 2)
    return a


class Task:
    """Model, data and loss of one benchmark, rebuilt identically from the seed."""

    def __init__(self, a):
        self.a = a

    def model(self, device):
        import wgrumus as wr
        a = self.a
        if a.model == "gpt":
            return wr.nn.GPT(a.vocab, a.block, n_layer=a.n_layer, n_head=a.n_head,
                             n_embd=a.n_embd, device=device, seed=0)
        layers = []
        for _ in range(a.n_layer):
            layers += [wr.nn.Linear(a.n_embd, a.n_embd, device=device), wr.nn.GELU()]
        layers.append(wr.nn.Linear(a.n_embd, a.vocab, device=device))
        return wr.nn.Sequential(*layers)

    def batch(self, step, n):
        rng = np.random.default_rng(step)
        a = self.a
        if a.model == "gpt":
            toks = rng.integers(0, a.vocab, (n, a.block + 1)).astype(np.int32)
            return toks[:, :-1], toks[:, 1:]
        return (rng.standard_normal((n, a.n_embd)).astype(np.float32),
                rng.integers(0, a.vocab, n).astype(np.int32))

    def loss(self, out, y):
        import wgrumus as wr
        return wr.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def optimizer(self, params):
        import wgrumus as wr
        return wr.optim.AdamW(params, lr=1e-3)


def plain_step(task, dev, a, jit=False):
    """The ordinary one-device loop's step(s) -> loss (``jit``: captured with wr.jit)."""
    import wgrumus as wr
    model = task.model(dev)
    opt = task.optimizer(model.parameters())

    def body(x, y):
        loss = task.loss(model(x), y)
        opt.step(wr.autograd.backward(loss))
        return loss
    fn = wr.jit(body) if jit else body

    def step(s):
        x, y = task.batch(s, a.batch)
        return fn(wr.tensor(x, device=dev), wr.tensor(y, device=dev)).item()
    return step


def run_plain(task, dev, a, jit=False) -> dict:
    """The baseline: the ordinary one-device loop, no DataParallel."""
    step = plain_step(task, dev, a, jit)
    for s in range(a.warmup):
        step(s)
    t0 = time.perf_counter()
    for s in range(a.steps):
        step(a.warmup + s)
    dt = time.perf_counter() - t0
    return {"devices": 1, "mode": "plain+jit" if jit else "plain",
            "samples_per_s": a.batch * a.steps / dt,
            "step_ms": 1e3 * dt / a.steps, "exposed_ms": 0.0, "buckets": 0}


def run_independent(task, devs, a, jit=False) -> dict:
    """K plain loops at once, one thread and one device each, with no communication: the most
    data parallelism can reach on these devices. Logical devices sharing an adapter share its
    time (the driver switches between their contexts), so this is below K x one device."""
    import threading
    steps = [plain_step(task, d, a, jit) for d in devs]
    for s in range(max(a.warmup, 3)):  # captures are made here, one thread at a time
        for step in steps:
            step(s)
    errors = []

    def loop(step):
        try:
            for s in range(a.steps):
                step(a.warmup + s)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=loop, args=(st,), daemon=True) for st in steps]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    dt = time.perf_counter() - t0
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"independent loops failed or hung: {errors}")
    return {"devices": len(devs), "mode": "no-comm+jit" if jit else "no-comm",
            "samples_per_s": a.batch * len(devs) * a.steps / dt,
            "step_ms": 1e3 * dt / a.steps, "exposed_ms": 0.0, "buckets": 0}


def run_dp(task, devs, a, one_bucket=False, group=None, jit=False) -> dict:
    import wgrumus as wr
    k = len(devs) if group is None else group.world_size
    big = 1e6  # MB: everything in one bucket, launched when the last gradient is ready
    dp = wr.parallel.DataParallel(task.model(devs[0]), devs,
                                  bucket_cap_mb=big if one_bucket else a.bucket_mb,
                                  first_bucket_mb=big if one_bucket else a.first_bucket_mb,
                                  backend="threads" if group is None else "mpi", group=group,
                                  jit=jit)
    local = len(dp.replicas)
    b0 = _wire_bytes(dp.groups[:local])
    try:
        for s in range(a.warmup):
            dp.train_step(*task.batch(s, a.batch * k), task.loss, task.optimizer)
        exposed, t0 = [], time.perf_counter()
        for s in range(a.steps):
            dp.train_step(*task.batch(a.warmup + s, a.batch * k), task.loss, task.optimizer)
            exposed.append(np.mean([dp.events.exposed_comm_seconds(r) for r in range(local)]))
        dt = time.perf_counter() - t0
        wire = (_wire_bytes(dp.groups[:local]) - b0) / (a.steps + a.warmup)
        assert dp.replicas_identical(), "replicas diverged"
        return {"devices": k, "mode": ("one-bucket" if one_bucket else "bucketed")
                + ("+jit" if jit else ""),
                "samples_per_s": a.batch * k * a.steps / dt, "step_ms": 1e3 * dt / a.steps,
                "exposed_ms": 1e3 * float(np.mean(exposed)), "buckets": len(dp.plan),
                "wire_mb": wire / 2 ** 20}
    finally:
        dp.close()


def _wire_bytes(groups) -> float:
    return float(np.mean([g.stats()["bytes"] for g in groups]))


def run_engine(task, devs, a, mode: str, jit=False, group=None) -> dict:
    """The training engine's step (what `wgrumus train` runs) on K replicas, one worker thread
    each (or this process's rank of ``group``); ``mode``: exact, f16, accum or local (see the
    module docstring)."""
    import wgrumus as wr
    from wgrumus.cli.trainer_parts import ReplicaPart
    from wgrumus.distributed.engine import RankEngine, RankPool, SyncOptions
    k = len(devs) if group is None else group.world_size
    sync = SyncOptions(comm_dtype=wr.float16 if mode == "f16" else None,
                       grad_accum=a.accum if mode == "accum" else 1,
                       sync_every=a.sync_every if mode == "local" else None)
    micro = sync.grad_accum
    pool = RankPool(k, devs, timeout=300.0, name="bench-rank") if group is None else \
        RankPool(k, group=group, timeout=300.0)

    def build(r):
        part = ReplicaPart(task.model(devs[r]), task.loss)
        return RankEngine(part, task.optimizer(part.params), devs[r], dp_group=pool.groups[r],
                          sync=sync, jit=jit, timeout=300.0)

    def global_rank(r):
        return r if group is None else group.rank

    try:
        engines = pool.run(build)

        def step(s):
            x, y = task.batch(s, a.batch * k * micro)

            def rank(r):
                mbs = []
                for i in range(micro):
                    lo = (global_rank(r) * micro + i) * a.batch
                    mbs.append([wr.tensor(x[lo:lo + a.batch], device=devs[r]),
                                wr.tensor(y[lo:lo + a.batch], device=devs[r])])
                return engines[r].step(mbs)
            return pool.run(rank)[0]

        last = None
        for s in range(a.warmup):
            last = step(s)
        float(last.item())
        b0, t0 = _wire_bytes(pool.groups), time.perf_counter()
        pending = None
        for s in range(a.steps):
            loss = step(a.warmup + s)
            if pending is not None:
                float(pending.item())  # read a step late, as the CLI does
            pending = loss
        float(pending.item())
        dt = time.perf_counter() - t0
        wire = (_wire_bytes(pool.groups) - b0) / a.steps
        name = {"exact": "engine", "f16": "engine-f16", "accum": f"engine-accum{micro}",
                "local": f"engine-local{a.sync_every}"}[mode]
        return {"devices": k, "mode": name + ("+jit" if jit else ""),
                "samples_per_s": a.batch * k * micro * a.steps / dt,
                "step_ms": 1e3 * dt / a.steps, "exposed_ms": 0.0, "buckets": 0,
                "wire_mb": wire / 2 ** 20}
    finally:
        for e in locals().get("engines") or ():
            e.close()
        pool.close()


def main(argv=None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    if a.backend == "threads":  # logical devices share an adapter when there are fewer
        os.environ.setdefault("WGRUMUS_DEVICES", str(max(a.devices)))
    import wgrumus as wr
    if a.blocking_waits:  # (the environment reaches ranks in other processes)
        os.environ["WGRUMUS_BLOCKING_WAITS"] = "1"
        from wgrumus.runtime.tuning import TUNING
        TUNING.blocking_waits = True
    group = None
    devs = wr.devices()
    if a.backend == "mpi":
        from wgrumus import distributed as dist
        group = dist.init_process_group("mpi", timeout=300)
        devs = [devs[group.rank % len(devs)]]
    task = Task(a)
    nparams = sum(p.numel() for p in task.model(devs[0]).parameters())
    head = (f"{a.model}: {nparams / 1e6:.2f} M parameters, batch {a.batch}/device"
            + (f", seq {a.block}" if a.model == "gpt" else "") + f"; {len(devs)} device(s): "
            + ", ".join(sorted({str(d.adapter_info.get("device") or d.name) for d in devs})))
    jits = (False, True) if a.jit else (False,)
    rows = [run_plain(task, devs[0], a, jit) for jit in jits]
    base = {jit: rows[i] for i, jit in enumerate(jits)}  # plain row of the same mode
    if group is not None:
        head += f"; mpi backend, {group.world_size} processes"
        for jit in jits:
            rows.append(run_dp(task, devs, a, group=group, jit=jit))
            if a.one_bucket:
                rows.append(run_dp(task, devs, a, one_bucket=True, group=group, jit=jit))
            for mode in () if a.no_engine else ("exact", "f16", "accum", "local"):
                rows.append(run_engine(task, devs, a, mode, jit=jit, group=group))
        if group.rank != 0:
            return 0
    for k in (a.devices if group is None else []):
        if k > len(devs):
            print(f"skipping {k} devices: only {len(devs)} present (set WGRUMUS_DEVICES)",
                  file=sys.stderr)
            continue
        for jit in jits:
            if k > 1:
                rows.append(run_independent(task, devs[:k], a, jit=jit))
            rows.append(run_dp(task, devs[:k], a, jit=jit))
            if a.one_bucket and k > 1:
                rows.append(run_dp(task, devs[:k], a, one_bucket=True, jit=jit))
            if not a.no_engine:
                for mode in ("exact", "f16", "accum", "local"):
                    if k > 1 or mode == "exact":
                        rows.append(run_engine(task, devs[:k], a, mode, jit=jit))
    for r in rows:
        ref = base[r["mode"].endswith("+jit")]
        r["scaling"] = r["samples_per_s"] / ref["samples_per_s"]
        r["overhead_ms"] = r["step_ms"] - ref["step_ms"]
        r["model"], r["params"] = a.model, nparams
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(head)
    print(f"{'devices':>7} {'mode':>18} {'samples/s':>10} {'scaling':>8} {'step ms':>8} "
          f"{'exposed ms':>10} {'vs plain':>9} {'buckets':>7} {'wire MB':>8}")
    for r in rows:
        print(f"{r['devices']:>7} {r['mode']:>18} {r['samples_per_s']:>10.1f} "
              f"{r['scaling']:>7.2f}x {r['step_ms']:>8.1f} {r['exposed_ms']:>10.1f} "
              f"{r['overhead_ms']:>+9.1f} {r['buckets']:>7} {r.get('wire_mb', 0.0):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
