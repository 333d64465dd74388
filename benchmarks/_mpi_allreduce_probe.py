"""The pieces of one MPI all-reduce of a device tensor, timed apart (ms, best and median of
--repeats): the download (Tensor.numpy), MPI's all-reduce of the host array, the upload
(wr.tensor), and the whole group.all_reduce(tensor) / all_reduce_async(tensor).wait().

    mpiexec -n 2 python benchmarks/_mpi_allreduce_probe.py --mb 1 4 13
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn, group, repeats):
    out = []
    for _ in range(repeats):
        group.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(1e3 * (time.perf_counter() - t0))
    return min(out), float(np.median(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[1, 4, 13])
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    import wgrumus as wr
    from wgrumus import distributed as dist
    group = dist.init_process_group("mpi", timeout=120)
    dev = wr.devices()[group.rank % len(wr.devices())]
    for mb in a.mb:
        n = int(mb * 2**20) // 4
        arr = np.random.default_rng(group.rank).standard_normal(n).astype(np.float32)
        x = wr.tensor(arr, device=dev)
        rows = {
            "download": lambda: x.numpy(),
            "mpi host": lambda: group.all_reduce(arr, "mean"),
            "upload": lambda: wr.tensor(arr, device=dev).numpy()[:1],
            "all_reduce(T)": lambda: group.all_reduce(x, "mean").numpy()[:1],
            "async(T)": lambda: group.all_reduce_async(x, "mean").wait(60).numpy()[:1],
        }
        res = {k: timed(f, group, a.repeats) for k, f in rows.items()}
        if group.rank == 0:
            print(f"{mb:6.1f} MB  " + "  ".join(f"{k} {b:6.2f}/{m:6.2f}"
                                              for k, (b, m) in res.items()), flush=True)
    group.close()


if __name__ == "__main__":
    main()
