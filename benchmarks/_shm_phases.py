"""Phases of the shared-memory all-reduce (ms per call, rank 0): copy in, first barrier, reduce,
second barrier, copy out.   mpiexec -n 2 python benchmarks/_shm_phases.py --mb 13 52"""
import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from wgrumus import distributed as dist  # noqa: E402
from wgrumus.distributed.transport import node_shm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--mb", type=float, nargs="+", default=[13, 52])
ap.add_argument("--piece", type=int, default=None, help="node_shm.PIECE (items per thread)")
ap.add_argument("--chunk-mb", type=int, default=None, help="node_shm.CHUNK in MiB")
a = ap.parse_args()
if a.chunk_mb:
    node_shm.CHUNK = a.chunk_mb << 20
if a.piece:
    node_shm.PIECE = a.piece
g = dist.init_process_group("mpi", timeout=60)
acc = defaultdict(float)
fence, par = node_shm.NodeAllReduce._fence, node_shm.par_ranges
seq = []


def timed(name, fn):
    def run(*args):
        t = time.perf_counter()
        fn(*args)
        acc[name + str(len(seq) % 3 if name == "par" else "")] += time.perf_counter() - t
        if name == "par":
            seq.append(1)
    return run


node_shm.NodeAllReduce._fence = timed("fence", fence)
node_shm.par_ranges = timed("par", par)
for mb in a.mb:
    x = np.random.default_rng(g.rank).standard_normal(int(mb * 2**18)).astype(np.float32)
    g.all_reduce(x, "mean")
    acc.clear()
    seq.clear()
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps):
        g.all_reduce(x, "mean")
    total = (time.perf_counter() - t0) / reps
    if g.rank == 0:
        parts = ", ".join(f"{k} {1e3 * v / reps:.2f}" for k, v in sorted(acc.items()))
        print(f"piece {node_shm.PIECE} chunk {node_shm.CHUNK >> 20}: {mb} MB: total "
              f"{1e3 * total:.2f} ms; {parts}", flush=True)
