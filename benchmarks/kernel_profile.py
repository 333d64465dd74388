"""Where a training step's GPU time goes, per kernel: the step is captured with ``wr.jit``, then its
recording is replayed with one compute pass per dispatch, each pass timestamped at its start
and end. Prints, per kernel family and specialisation, the calls per step, GPU ms per step and
share of the step, largest first; and the whole step's GPU time in one pass per segment (as a
replay runs it), so the per-dispatch passes' own overhead is visible.

    python benchmarks/kernel_profile.py [--model gpt|gpt2s|mlp] [--quick] [--reps 5] [--top 25]
                                        [--shapes] [--eager] [--empty]

With --shapes, matmul rows are split by product (M x N x K, grid), the rest by grid.
With --eager, the eager step is profiled instead (what ``wgrumus train`` runs on CPU adapters,
where a capture's matmuls read storage operands, eager ones textures): each dispatch of
--reps steps is closed into its own timed pass. With --empty, also the fixed cost of one
dispatch: a one-element add (one workgroup), timed in its own pass, back to back in one pass,
and on the wall clock with its recording.

Needs the adapter's 'timestamp-query' feature (the H100 has it; lavapipe too).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("WGRUMUS_DEVICES", "1")

import train_step as ts  # noqa: E402

KEEP = ("TILEM", "TILEN", "BK", "SPLIT", "AM", "BM", "AK", "BR", "BC", "WG", "VEC")  # shown


def kernel_names(dev) -> dict:
    """id(pipeline) -> 'family:entry' plus the few defines that tell specialisations apart."""
    names = {}
    for (kernel, _nbuf), (pipe, _layout, _dyn) in dev._pipelines.items():
        extra = " ".join(f"{k}={v}" for k, v in kernel.defines if k in KEEP)
        names[id(pipe)] = f"{kernel.family}:{kernel.entry}" + (f" [{extra}]" if extra else "")
    return names


def per_dispatch_seconds(dev, rep) -> list[tuple[object, float]]:
    """((pipeline, grid), GPU seconds) for every dispatch of one replay, each in its own
    timed pass."""
    import wgpu

    from wgrumus.runtime.native import RawReplay, timestamp_period_ns
    items = [d for part in rep._parts[::2] for kind, body in part if kind == RawReplay.PASS
             for d in body]  # every captured part (host operations between them are skipped)
    chunk = 2048  # passes per query set (4096 queries)
    out = []
    for lo in range(0, len(items), chunk):
        part = items[lo:lo + chunk]
        qs = dev.wgpu.create_query_set(type=wgpu.QueryType.timestamp, count=2 * len(part))
        res = dev.wgpu.create_buffer(size=16 * len(part), usage=wgpu.BufferUsage.QUERY_RESOLVE
                                     | wgpu.BufferUsage.COPY_SRC)
        enc = dev.wgpu.create_command_encoder()
        for k, (pipe, bg, offs, gx, gy, gz) in enumerate(part):
            cp = enc.begin_compute_pass(timestamp_writes={
                "query_set": qs, "beginning_of_pass_write_index": 2 * k,
                "end_of_pass_write_index": 2 * k + 1})
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, bg, offs)
            cp.dispatch_workgroups(gx, gy, gz)
            cp.end()
        enc.resolve_query_set(qs, 0, 2 * len(part), res, 0)
        with dev.lock:
            dev.flush_locked()
            dev.submit(enc.finish())
        ticks = np.frombuffer(dev.read(res, 0, 16 * len(part)), np.uint64).reshape(-1, 2)
        ns = np.clip(ticks[:, 1].astype(np.int64) - ticks[:, 0].astype(np.int64), 0, None)
        out += [((p[0], p[3:]), float(t) * timestamp_period_ns(dev.queue) * 1e-9)
                for p, t in zip(part, ns)]
    return out


def eager_dispatch_seconds(dev, step, reps: int) -> list[tuple[str, float]]:
    """(kernel name + grid, GPU seconds) for every dispatch of ``reps`` eager steps, each
    dispatch in its own timed pass (in dispatch order: one pass per dispatch)."""
    from wgrumus.runtime.device import Device
    from wgrumus.runtime.gpu_timer import GpuTimer
    seen = []
    orig = Device.dispatch

    def dispatch(self, kernel, buffers, params=(), groups=(1, 1, 1), refresh=None):
        if self is dev and all(groups):
            d = dict(kernel.defines)
            extra = " ".join(f"{k}={d[k]}" for k in KEEP if k in d)
            shape = (" {}x{}x{}".format(*(int(w) for w in params[:3]))
                     if kernel.family.startswith("matmul") else "")
            seen.append(f"{kernel.family}:{kernel.entry}" + (f" [{extra}]" if extra else "")
                        + f"{shape} {tuple(groups)}")
        orig(self, kernel, buffers, params, groups, refresh)
        if self is dev:
            with dev.lock:
                dev._close_pass()

    Device.dispatch = dispatch
    try:
        with GpuTimer(dev) as t:
            for _ in range(reps):
                step()
    finally:
        Device.dispatch = orig
    dev.synchronize()
    if len(t.spans) != len(seen):
        raise RuntimeError(f"{len(seen)} dispatches but {len(t.spans)} timed passes")
    return list(zip(seen, t.spans))


def empty_dispatch_ms(dev, n: int = 200) -> tuple[str, float, float, float]:
    """The fixed cost of a dispatch: the dispatch of a one-element add (one workgroup), repeated
    n times. (kernel, GPU ms of one in its own pass, GPU ms per dispatch of n in one pass, wall
    ms per dispatch of n recorded with Device.dispatch and run)."""
    import time

    import wgrumus as wr
    from wgrumus.runtime.device import Device
    from wgrumus.runtime.gpu_timer import GpuTimer
    got = []
    orig = Device.dispatch
    Device.dispatch = lambda self, *a, **kw: (got.append((self, a, kw)), orig(self, *a, **kw))
    try:
        x = wr.ones((1,), device=dev)
        y = x + x  # noqa: F841  (kept alive: its buffer is bound by the repeated dispatch)
    finally:
        Device.dispatch = orig
    d, a, kw = got[-1]
    dev.synchronize()
    with GpuTimer(dev) as t:
        for _ in range(n):
            d.dispatch(*a, **kw)
            with dev.lock:
                dev._close_pass()
    own = statistics.median(t.spans)
    with GpuTimer(dev) as t:
        for _ in range(n):
            d.dispatch(*a, **kw)
    dev.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        d.dispatch(*a, **kw)
    dev.synchronize()
    wall = 1e3 * (time.perf_counter() - t0) / n
    return f"{a[0].family}:{a[0].entry}", 1e3 * own, 1e3 * t.seconds / n, wall


def eager_profile(args, dev, cfg) -> int:
    from wgrumus.runtime.gpu_timer import GpuTimer
    step, loss, _ = ts.wgrumus_step(args.model, cfg, dev)
    for _ in range(4):
        step()
    loss()
    with GpuTimer(dev) as t:  # the step as it runs, for comparison
        for _ in range(args.reps):
            step()
    loss()
    got = eager_dispatch_seconds(dev, step, args.reps)
    n = len(got) // args.reps
    per = [statistics.median(got[r * n + k][1] for r in range(args.reps)) for k in range(n)]
    rows = collections.defaultdict(lambda: [0, 0.0])
    for (name, _), s in zip(got[:n], per):
        if not args.shapes:
            name = name.split(" (")[0].rsplit(" ", 1)[0] if name.startswith("matmul") \
                else name.split(" (")[0]
        rows[name][0] += 1
        rows[name][1] += s
    report(args, dev, rows, per, f"the step {1e3 * t.seconds / args.reps:.2f} ms GPU")
    return 0


def report(args, dev, rows, per, whole: str) -> None:
    total = sum(per)
    print(f"kernel profile on {dev.name}: {args.model} ({'quick' if args.quick else 'full'}"
          f"{', eager' if args.eager else ''}), {len(per)} dispatches; sum of per-dispatch "
          f"passes {1e3 * total:.2f} ms, {whole}")
    w = 90 if args.shapes else 58
    print(f"{'kernel':{w}} {'calls':>5} {'ms':>8} {'share':>6}")
    for name, (calls, s) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{name[:w]:{w}} {calls:5d} {1e3 * s:8.3f} {100 * s / total:5.1f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt", choices=("gpt", "gpt2s", "mlp"))
    ap.add_argument("--quick", action="store_true", help="train_step --quick's small shapes")
    ap.add_argument("--reps", type=int, default=5, help="profiled replays (median per dispatch)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--shapes", action="store_true", help="a row per matmul shape / grid")
    ap.add_argument("--eager", action="store_true", help="profile the eager step, not a replay")
    ap.add_argument("--empty", action="store_true", help="also the fixed cost of a dispatch")
    args = ap.parse_args()
    import gc

    import wgrumus as wr
    from wgrumus.runtime.gpu_timer import GpuTimer
    from wgrumus.runtime.replay import Replay
    dev = wr.devices()[0]
    if "timestamp-query" not in dev.features:
        print(f"{dev.name} has no 'timestamp-query': no per-kernel GPU times here")
        return 1
    cfg = (ts.QUICK if args.quick else ts.FULL)[args.model]
    if args.empty:
        kname, own, packed, wall = empty_dispatch_ms(dev)
        print(f"one dispatch of {kname}: {own:.4f} ms GPU in its own pass, {packed:.4f} ms GPU "
              f"each of 200 in one pass, {wall:.4f} ms wall each (Device.dispatch + run)")
    if args.eager:
        return eager_profile(args, dev, cfg)
    step, loss, _ = ts.wgrumus_step(args.model, cfg, dev, jit=True)
    for _ in range(4):
        step()
    loss()
    rep = next(o for o in gc.get_objects() if isinstance(o, Replay) and o.device is dev)
    names = kernel_names(dev)
    runs = [per_dispatch_seconds(dev, rep) for _ in range(args.reps)]
    with GpuTimer(dev) as t:  # the step as replays run it, for comparison
        for _ in range(args.reps):
            step()
    loss()
    per = [statistics.median(r[k][1] for r in runs) for k in range(len(runs[0]))]
    rows = collections.defaultdict(lambda: [0, 0.0])
    for k, (((pipe, grid), _), s) in enumerate(zip(runs[0], per)):
        name = names.get(id(pipe), "?")
        if args.shapes:
            m, n, kk = (int(w) for w in rep._words[k][:3])
            name += f" {m}x{n}x{kk} {grid}" if name.startswith("matmul") else f" {grid}"
        row = rows[name]
        row[0] += 1
        row[1] += s
    report(args, dev, rows, per, f"the replayed step {1e3 * t.seconds / args.reps:.2f} ms GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
