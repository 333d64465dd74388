"""Where the host time of a replayed ``wr.jit`` step goes, per dispatch: our encode loop (three
wgpu-native C calls per dispatch, pass begin/end included), wgpu-native's ``finish()`` (its
validation and resource tracking of the recorded commands), the queue submit, and the whole
``step()`` call (input copies, parameter refresh, outputs). Also the cost of one bare C call,
the floor a Python loop over C calls cannot go below.

    python benchmarks/replay_cost.py [--model gpt|mlp] [--quick] [--reps 200] [--warmup 3]

On a CPU adapter (lavapipe) the GPU work runs on the same cores, so only the encode and finish
columns mean what they say there.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("WGRUMUS_DEVICES", "1")

import train_step as ts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt", choices=("gpt", "mlp"))
    ap.add_argument("--quick", action="store_true", help="the small shapes of train_step --quick")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of replays before timing")
    args = ap.parse_args()
    import wgrumus as wr
    from wgrumus.runtime.replay import Replay
    dev = wr.devices()[0]
    quick = args.quick or dev.adapter_info.get("adapter_type", "").lower() == "cpu"
    cfg = (ts.QUICK if quick else ts.FULL)[args.model]
    step, loss, _ = ts.wgrumus_step(args.model, cfg, dev, jit=True)
    t0, k = time.perf_counter(), 0  # seconds of replays first: the host's clocks ramp up too
    while k < 4 or time.perf_counter() - t0 < args.warmup:
        step()
        loss()
        k += 1
    import gc
    rep = next(o for o in gc.get_objects() if isinstance(o, Replay))
    n = rep.dispatches
    if rep._raw is None or len(rep._raw) != 1:
        print("wgpu-native C API unavailable (replays go through wgpu-py's API), or the step "
              "has communication between captured parts: nothing to split here")
        return 1

    def encode():
        enc = dev.wgpu.create_command_encoder()
        rep._raw[0].encode(enc, dev.begin_pass, (), ())
        return enc

    rows = {"encode (ours)": [], "finish (wgpu-native)": [], "submit": [], "whole step()": []}
    for _ in range(5):
        t0 = time.perf_counter()
        encs = [encode() for _ in range(args.reps)]
        t1 = time.perf_counter()
        bufs = [e.finish() for e in encs]
        t2 = time.perf_counter()
        for b in bufs:  # each runs the step's work once more (state advances; timing only)
            dev.queue.submit([b])
        t3 = time.perf_counter()
        dev.synchronize()
        t4 = time.perf_counter()
        for _ in range(args.reps):
            step()
        t5 = time.perf_counter()
        loss()
        for k, dt in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t5 - t4)):
            rows[k].append(1e6 * dt / args.reps / n)
    h = dev.wgpu.create_command_encoder().begin_compute_pass()._internal
    f = rep._raw[0].lib.wgpuComputePassEncoderDispatchWorkgroups
    call = min(timeit.repeat(lambda: f(h, 0, 1, 1), number=20000, repeat=5)) / 20000 * 1e6
    print(f"replay cost on {dev.name}: {args.model} ({'quick' if quick else 'full'}), "
          f"{n} dispatches per step, medians of 5 x {args.reps} replays")
    print(f"{'part':22} {'us/dispatch':>12}")
    for k, v in rows.items():
        print(f"{k:22} {statistics.median(v):12.2f}")
    print(f"{'one bare C call':22} {call:12.2f}   (through a lambda; x3 per dispatch: "
          "the loop's floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
