"""Embedding backward against its forward: the sorted backward (shaders/index_sorted.wgsl) at
300k ids over 100k rows, with the row-scan backward it replaced where that one finishes, numpy's
np.add.at and torch (CUDA) measured in the same run. The budget: backward within 10x forward
(the row scan took 230 s against a 0.35 s forward on lavapipe at 300k ids / 100k rows).

    python benchmarks/embedding_backward.py [--ids 300000] [--rows 100000] [--dim 64] [--json]
        [--check]   (exit status 1 when a backward is over its budget)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

BUDGET = 10.0  # backward seconds per forward second
SCAN_MAX = 1 << 31  # (ids x rows) past which the row scan is not timed (minutes on a CPU)


def best(fn, sync, n: int = 3) -> float:
    """Fastest of ``n`` timed calls after a warm-up (kernels compiled, buffers pooled)."""
    fn()
    sync()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(dev, ids: int, rows: int, dim: int, scan: bool) -> dict:
    import wgrumus as wr
    from wgrumus.kernels import index as index_kernels
    from wgrumus.nn import functional as F
    rng = np.random.default_rng(0)
    w = wr.tensor(rng.standard_normal((rows, dim)).astype(np.float32), device=dev,
                  requires_grad=True)
    idx_np = rng.integers(0, rows, ids).astype(np.int32)
    idx = wr.tensor(idx_np, device=dev)
    g = wr.tensor(rng.standard_normal((ids, dim)).astype(np.float32), device=dev)

    def fwd():
        with wr.no_grad():
            F.embedding(idx, w)

    def bwd():
        out = F.embedding(idx, w)
        wr.autograd.backward_with_grad(out, g)

    r = {"ids": ids, "rows": rows, "dim": dim, "forward_s": best(fwd, dev.synchronize),
         "backward_s": best(bwd, dev.synchronize)}
    r["backward_s"] = max(0.0, r["backward_s"] - r["forward_s"])  # backward_with_grad reruns it
    r["ratio"] = r["backward_s"] / r["forward_s"]
    r["within_budget"] = r["ratio"] <= BUDGET
    if scan and ids * rows <= SCAN_MAX:
        old, index_kernels.SORTED_MIN = index_kernels.SORTED_MIN, float("inf")
        try:
            r["scan_backward_s"] = max(0.0, best(bwd, dev.synchronize, 1) - r["forward_s"])
        finally:
            index_kernels.SORTED_MIN = old
    gn = g.numpy()

    def np_bwd():
        acc = np.zeros((rows, dim), np.float32)
        np.add.at(acc, idx_np, gn)
    r["numpy_s"] = best(np_bwd, lambda: None, 1)
    r["torch_s"] = _torch_backward(idx_np, gn, rows)
    return r


def _torch_backward(idx_np, gn, rows):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    w = torch.zeros((rows, gn.shape[1]), device="cuda", requires_grad=True)
    idx = torch.from_numpy(idx_np.astype(np.int64)).cuda()
    g = torch.from_numpy(gn).cuda()

    def bwd():
        torch.nn.functional.embedding(idx, w).backward(g)
    return best(bwd, torch.cuda.synchronize)


def _fmt(v):
    return "-" if v is None else f"{v:.3f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/embedding_backward.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--ids", type=int, default=300_000)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--check", action="store_true", help="exit 1 when over the budget")
    a = p.parse_args(argv)
    import wgrumus as wr
    dev = wr.devices()[0]
    sizes = [(a.ids // 3, a.rows // 10), (a.ids, a.rows)]  # the scan is timed at the first
    res = [measure(dev, i, r, a.dim, scan=k == 0) for k, (i, r) in enumerate(sizes)]
    meta = {"adapter": dev.name, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(), "budget": BUDGET}
    if a.json:
        print(json.dumps({"meta": meta, "rows": res}, indent=1))
    else:
        print(f"embedding backward on {meta['adapter']} ({meta['date']}); budget: backward "
              f"<= {BUDGET:g}x forward")
        hdr = (f"{'ids':>9} {'rows':>9} {'dim':>4} {'forward s':>10} {'backward s':>11} "
               f"{'bwd/fwd':>8} {'budget':>7} {'row scan s':>11} {'numpy s':>8} {'torch s':>8}")
        print(hdr)
        print("-" * len(hdr))
        for r in res:
            print(f"{r['ids']:>9,} {r['rows']:>9,} {r['dim']:>4} {_fmt(r['forward_s']):>10} "
                  f"{_fmt(r['backward_s']):>11} {r['ratio']:>7.1f}x "
                  f"{'ok' if r['within_budget'] else 'OVER':>7} "
                  f"{_fmt(r.get('scan_backward_s')):>11} {_fmt(r['numpy_s']):>8} "
                  f"{_fmt(r['torch_s']):>8}")
    return 1 if a.check and not all(r["within_budget"] for r in res) else 0


if __name__ == "__main__":
    sys.exit(main())
