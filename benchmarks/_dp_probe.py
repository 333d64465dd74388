"""Where two jitted GPT-mini loops on two adapters lose time: one loop alone, two threads of one
process, two processes; per loop the wall ms per step and the host CPU ms its thread used, and a
profile of one loop's host time.

    python benchmarks/_dp_probe.py --steps 40 [--batch 16] [--profile]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def make(batch, dev_index, model="gpt"):
    import data_parallel as dpm

    import wgrumus as wr
    tiny = ["--n-layer", "2", "--n-embd", "64", "--vocab", "16"] if model == "mlp" else []
    a = dpm.parse_args(["--batch", str(batch), "--model", model, *tiny])
    return dpm.plain_step(dpm.Task(a), wr.devices()[dev_index], a, jit=True)


def loop(step, n, out, start=None):
    if start is not None:
        start.wait()
    t0, c0 = time.perf_counter(), time.thread_time()
    for s in range(n):
        step(10 + s)
    out.append((1e3 * (time.perf_counter() - t0) / n, 1e3 * (time.thread_time() - c0) / n))


def proc(i, batch, n, barrier, q, model):
    """Loop ``i`` in a process of its own: adapter i, or the one adapter (a device each)."""
    os.environ["WGRUMUS_DEVICES"] = "1"
    from wgrumus.runtime.adapters import select_adapters
    os.environ["WGRUMUS_ADAPTER"] = str(i if len(select_adapters("")) > 1 else 0)
    step = make(batch, 0, model)
    for s in range(5):
        step(s)
    out = []
    barrier.wait()
    loop(step, n, out)
    q.put((i, *out[0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--model", choices=["gpt", "mlp"], default="gpt",
                    help="mlp: a tiny 2-layer MLP, so the step is host time only")
    a = ap.parse_args()
    import wgrumus as wr
    devs = wr.devices()
    steps = [make(a.batch, i, a.model) for i in range(min(2, len(devs)))]
    for s in range(5):
        for st in steps:
            st(s)
    out = []
    loop(steps[0], a.steps, out)
    print(f"one loop:    wall {out[0][0]:6.2f} ms/step  thread cpu {out[0][1]:6.2f}", flush=True)
    if len(steps) > 1:
        out, start = [], threading.Barrier(2)
        th = [threading.Thread(target=loop, args=(st, a.steps, out, start)) for st in steps]
        for t in th:
            t.start()
        for t in th:
            t.join()
        for w, c in out:
            print(f"two threads: wall {w:6.2f} ms/step  thread cpu {c:6.2f}", flush=True)
    if a.profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        loop(steps[0], a.steps, [])
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    if len(devs) > 1:
        ctx = mp.get_context("spawn")
        barrier, q = ctx.Barrier(2), ctx.Queue()
        ps = [ctx.Process(target=proc, args=(i, a.batch, a.steps, barrier, q, a.model))
              for i in range(2)]
        for p in ps:
            p.start()
        for _ in ps:
            i, w, c = q.get(timeout=300)
            print(f"two procs:   wall {w:6.2f} ms/step  thread cpu {c:6.2f}  (adapter {i})",
                  flush=True)
        for p in ps:
            p.join(60)


if __name__ == "__main__":
    main()
