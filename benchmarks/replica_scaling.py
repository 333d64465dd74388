"""Replicas with no communication: K jitted GPT-mini training loops at once, as threads of one
process and as one process per adapter, against one loop alone (the ceiling of data parallelism).

    python benchmarks/replica_scaling.py            # K = 1, 2, 4 (as many as there are adapters)
    python benchmarks/replica_scaling.py --steps 40

Columns: wall ms a step (the slowest replica), K x the single loop's speed, and the host CPU time
a replica spends per step (thread time for threads, process time for processes). Threads share
one interpreter: a replay encodes its dispatches from Python between short C calls, so K threads
need K times that host time inside one step; ``WGRUMUS_ENCODE_LOCK=0`` drops the process-wide
encode lock too (row "threads, encode lock off"). Processes need one physical adapter each
(WGRUMUS_ADAPTER=r in child r); with fewer adapters their rows are skipped.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def _loop_args(steps: int, quick: bool):
    import data_parallel as dpb
    a = dpb.parse_args(["--jit"] + (["--quick"] if quick else []))
    a.steps, a.warmup = steps, 3
    return dpb, a


def threads_run(k: int, steps: int, quick: bool, encode_off: bool = False):
    dpb, a = _loop_args(steps, quick)
    import wgrumus as wr
    from wgrumus.runtime import replay
    saved = replay._ENCODE
    if encode_off:
        replay._ENCODE = contextlib.nullcontext()
    try:
        task = dpb.Task(a)
        loops = [dpb.plain_step(task, d, a, True) for d in wr.devices()[:k]]
        for s in range(3):  # captures, one thread at a time
            for step in loops:
                step(s)
        cpu = [0.0] * k

        def loop(i, step):
            c0 = time.thread_time()
            for s in range(a.steps):
                step(3 + s)
            cpu[i] = time.thread_time() - c0
        ths = [threading.Thread(target=loop, args=(i, st), daemon=True)
               for i, st in enumerate(loops)]
        t0 = time.perf_counter()
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=600)
        if any(t.is_alive() for t in ths):
            raise RuntimeError("a replica loop did not finish within 600 s")
        return 1e3 * (time.perf_counter() - t0) / a.steps, 1e3 * sum(cpu) / k / a.steps
    finally:
        replay._ENCODE = saved


def _child(r: int, steps: int, quick: bool, q, start) -> None:
    os.environ["WGRUMUS_ADAPTER"] = str(r)
    dpb, a = _loop_args(steps, quick)
    import wgrumus as wr
    step = dpb.plain_step(dpb.Task(a), wr.devices()[0], a, True)
    for s in range(3):
        step(s)
    start.wait(timeout=600)
    c0, t0 = time.process_time(), time.perf_counter()
    for s in range(a.steps):
        step(3 + s)
    q.put((1e3 * (time.perf_counter() - t0) / a.steps, 1e3 * (time.process_time() - c0) / a.steps))


def processes_run(k: int, steps: int, quick: bool):
    ctx = mp.get_context("spawn")
    q, start = ctx.Queue(), ctx.Barrier(k + 1)
    ps = [ctx.Process(target=_child, args=(r, steps, quick, q, start), daemon=True)
          for r in range(k)]
    for p in ps:
        p.start()
    try:
        start.wait(timeout=600)
        res = [q.get(timeout=600) for _ in range(k)]
    finally:
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return max(r[0] for r in res), sum(r[1] for r in res) / k


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="small shapes, threads on 2 logical "
                    "devices (lavapipe)")
    a = ap.parse_args(argv)
    if a.quick:
        os.environ.setdefault("WGRUMUS_DEVICES", "2")
        a.steps = min(a.steps, 4)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    import wgrumus as wr
    from wgrumus.runtime.adapters import select_adapters
    devs = wr.devices()
    physical = len(select_adapters()) if not os.environ.get("WGRUMUS_DEVICES") else 1
    print("devices:", ", ".join(d.name for d in devs))
    print(f"{'layout':>24} {'K':>2} {'wall ms/step':>12} {'K x speed':>9} {'host cpu ms/step':>16}")
    ks = [k for k in (1, 2, 4) if k <= len(devs)]
    base = None
    for k in ks:
        for name, off in (("threads", False), ("threads, encode lock off", True)):
            if k == 1 and off:
                continue
            ms, cpu = threads_run(k, a.steps, a.quick, off)
            base = base or ms
            print(f"{name:>24} {k:>2} {ms:>12.2f} {k * base / ms:>8.2f}x {cpu:>16.2f}",
                  flush=True)
    for k in (k for k in ks if k <= physical):
        ms, cpu = processes_run(k, a.steps, a.quick)
        print(f"{'processes':>24} {k:>2} {ms:>12.2f} {k * base / ms:>8.2f}x {cpu:>16.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
