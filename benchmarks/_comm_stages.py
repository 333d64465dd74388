"""Where a chunk's time goes in the comm engine (pipelined.py): per chunk size, the milliseconds per
chunk each rank spends waiting for its download's map, waiting for an upload buffer, in the
barrier round (its share of the reduction plus waiting for the other ranks), in the submit, and
in the rest of the engine's Python, next to the wall time per chunk.

    WGRUMUS_DEVICES=2 python benchmarks/_comm_stages.py --mb 64 --chunks 2,4,8,16

If stages overlapped, the wall time per chunk would be near the largest stage; if it is near
their sum, something serialises them. The stages are timed by wrapping the engine's calls
(a few microseconds each).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WGRUMUS_DEVICES", "2")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

STAGES = {("StagingBuffer", "wait"): "map wait", ("Staging", "writer"): "upload buffer",
          ("CollectiveBarrier", "exchange"): "barrier round", ("Staging", "submit"): "submit"}


def instrument(acc):
    """Wrap the engine's calls so each thread adds its time per stage into acc[thread name]."""
    from wgrumus.distributed import barrier
    from wgrumus.runtime import staging
    owners = {"StagingBuffer": staging.StagingBuffer, "Staging": staging.Staging,
              "CollectiveBarrier": barrier.CollectiveBarrier}
    for (cls, name), label in STAGES.items():
        real = getattr(owners[cls], name)

        def timed(*a, _real=real, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                acc[threading.current_thread().name][_label] += time.perf_counter() - t0
        setattr(owners[cls], name, timed)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=64, help="all-reduce size per rank, MiB")
    p.add_argument("--chunks", default="2,4,8,16", help="chunk sizes in MiB")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from collectives import comm_devices

    from wgrumus.distributed import CollectiveBarrier, pipelined
    from wgrumus.runtime.buffer_slice import BufferSlice
    devs, _ = comm_devices(args.ranks)
    nbytes = int(args.mb * (1 << 20)) // 4 * 4
    bufs = [d.alloc(nbytes) for d in devs]
    for i, (d, b) in enumerate(zip(devs, bufs)):
        d.write(b, np.full(nbytes // 4, i + 1, np.float32))
        d.synchronize()
    slices = [BufferSlice(d, b, 0, nbytes, np.float32) for d, b in zip(devs, bufs)]
    acc = collections.defaultdict(lambda: collections.defaultdict(float))
    instrument(acc)
    print(f"{args.ranks} ranks, {args.mb:g} MiB all-reduce, {devs[0].name}; ms per chunk: the "
          f"wall time of the call (all ranks), and rank 0's stages")
    head = (f"{'chunk':>8} {'chunks':>6} {'inflight':>8} | {'wall':>7} {'GB/s':>6} | "
            + " ".join(f"{s:>13}" for s in STAGES.values()) + f" {'other':>7}")
    print(head)
    print("-" * len(head))
    for mb in [float(c) for c in args.chunks.split(",")]:
        chunk = int(mb * (1 << 20))
        barrier = CollectiveBarrier(args.ranks, timeout=120)
        busy = [0.0] * args.ranks

        def rank(r, busy=busy, barrier=barrier, chunk=chunk):
            t0 = time.perf_counter()
            pipelined.all_reduce(slices[r], barrier, r, "sum", chunk_bytes=chunk)
            busy[r] += time.perf_counter() - t0

        def once(rank=rank):
            ts = [threading.Thread(target=rank, args=(r,), name=f"rank{r}")
                  for r in range(args.ranks)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            for d in devs:
                d.synchronize()

        once()  # warm-up: staging buffers made
        acc.clear()
        busy[:] = [0.0] * args.ranks
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            once()
        wall = (time.perf_counter() - t0) / args.repeats
        barrier.close()
        n = -(-nbytes // chunk) * args.repeats
        st = acc["rank0"]
        other = busy[0] - sum(st.values())
        print(f"{mb:>6g}MB {n // args.repeats:>6} {pipelined.inflight_of(min(chunk, nbytes)):>8} | "
              f"{wall / (n / args.repeats) * 1e3:7.3f} {nbytes / wall / 1e9:6.2f} | "
              + " ".join(f"{st[s] / n * 1e3:13.3f}" for s in STAGES.values())
              + f" {other / n * 1e3:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
