"""Randomized numerics campaign: sizes past llvmpipe's 65,535-iteration loop limit, NaN, int32
past 2^24, device-side index asserts, each case checked against numpy.

    python benchmarks/reliability_numerics.py [--runs 40] [--seed 0] [--json out.json]
    python benchmarks/reliability.py --campaign numerics --runs 40 --seed 0 --json out.json

Every run draws a case and its sizes / values from a seeded RNG; it passes when the result
matches numpy (or, for a bad device index, when the next read raises an IndexError naming the
bad value and a later good read works). `--quick` runs each case once.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import numpy as np


def _close(got, want, rtol=1e-4, atol=1e-5) -> str | None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return "NaN positions differ"
    ok = np.isclose(got, want, rtol=rtol, atol=atol) | np.isnan(want)
    return None if ok.all() else f"max error {np.nanmax(np.abs(got - want)):.3g}"


def _lsm(a):
    z = a - a.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def case_reduce_long(wr, rng):
    n = int(rng.integers(17_000_000, 20_000_000))  # > 65,535 x 256 per row
    a = np.zeros(n, np.float32)
    pos = rng.integers(0, n, 4)
    pos[0] = n - 1 - int(rng.integers(0, 1000))  # one spike near the end
    a[pos] = rng.normal(size=4).astype(np.float32) * 100
    if rng.random() < 0.3:
        a[int(rng.integers(0, n))] = np.nan
    x = wr.tensor(a)
    for name, got, want in (("sum", x.sum().item(), a.astype(np.float64).sum()),
                            ("max", x.max().item(), a.max()),
                            ("argmin", x.argmin().item(), a.argmin())):
        err = _close(got, want, 1e-5, 1e-3)
        if err:
            return f"n={n} {name}: {err}"


def case_reduce_int(wr, rng):
    n = int(rng.integers(1, 300_000))
    a = rng.integers(-2 ** 31, 2 ** 31 - 1, n).astype(np.int32)
    x = wr.tensor(a)
    for name, got, want in (("max", x.max().item(), a.max()), ("min", x.min().item(), a.min()),
                            ("argmax", x.argmax().item(), a.argmax()),
                            ("argmin", x.argmin().item(), a.argmin()),
                            ("sum", x.sum().item(), a.sum(dtype=np.int32))):
        if got != want:
            return f"n={n} {name}: {got} != {want}"


def case_short_rows(wr, rng):
    R, L = int(rng.integers(1, 2_000_000)), int(rng.integers(1, 9))
    a = rng.normal(size=(R, L)).astype(np.float32)
    x = wr.tensor(a)
    return (_close(x.sum(axis=1).numpy(), a.sum(1)) or _close(x.max(axis=1).numpy(), a.max(1))
            or _close(x.argmax(axis=1).numpy(), a.argmax(1)))


def case_row_ops(wr, rng):
    from wgrumus.nn import functional as F
    R, L = int(rng.integers(1, 4)), int(rng.integers(33_000, 200_000))
    a = (rng.normal(size=(R, L)) * 3).astype(np.float32)
    x = wr.tensor(a)
    t = rng.integers(0, L, R)
    xh = (a - a.mean(1, keepdims=True)) / np.sqrt(a.var(1, keepdims=True) + 1e-5)
    err = (_close(F.softmax(x).numpy(), np.exp(_lsm(a)), 1e-3, 1e-9)
           or _close(F.log_softmax(x).numpy(), _lsm(a), 1e-5, 1e-4)
           or _close(F.layer_norm(x, L).numpy(), xh, 1e-4, 1e-4)
           or _close(F.cross_entropy(x, t).item(), -_lsm(a)[np.arange(R), t].mean(), 1e-5))
    return f"R={R} L={L}: {err}" if err else None


def case_index_backward(wr, rng):
    from wgrumus.ops.indexing import embedding
    K, V, D = int(rng.integers(8192, 60_000)), int(rng.integers(2, 64)), int(rng.integers(1, 48))
    ids = np.full(K, int(rng.integers(0, V))) if rng.random() < 0.5 else rng.integers(0, V, K)
    w = wr.tensor(np.zeros((V, D), np.float32), requires_grad=True)
    g = rng.normal(size=(K, D)).astype(np.float32)
    got = wr.autograd.backward((embedding(ids, w) * wr.tensor(g)).sum()).get(w).numpy()
    ref = np.zeros((V, D))
    np.add.at(ref, ids, g)
    err = _close(got, ref, 1e-4, 5e-3)
    return f"K={K} V={V} D={D}: {err}" if err else None


def case_nan_elementwise(wr, rng):
    a = rng.normal(size=64).astype(np.float32)
    b = rng.normal(size=64).astype(np.float32)
    a[rng.random(64) < 0.3] = np.nan
    b[rng.random(64) < 0.3] = np.nan
    x, y = wr.tensor(a), wr.tensor(b)
    return (_close(x.relu().numpy(), np.maximum(a, 0)) or _close(x.clamp(-0.5, 0.5).numpy(),
                                                                  np.clip(a, -0.5, 0.5))
            or _close(wr.maximum(x, y).numpy(), np.maximum(a, b))
            or _close(wr.minimum(x, y).numpy(), np.minimum(a, b))
            or _close(x.max().item(), a.max()) or _close(x.argmax().item(), a.argmax()))


def case_device_assert(wr, rng):
    from wgrumus.nn import functional as F
    from wgrumus.ops.indexing import embedding, gather, index_select
    A = int(rng.integers(2, 100))
    bad = int(rng.choice([A + int(rng.integers(0, 1000)), -A - 1 - int(rng.integers(0, 1000))]))
    w = wr.tensor(np.ones((A, 3), np.float32))
    op = str(rng.choice(["embedding", "index_select", "gather", "cross_entropy"]))
    idx = wr.tensor(np.array([0, bad], np.int32))
    out = {"embedding": lambda: embedding(idx, w),
           "index_select": lambda: index_select(w, 0, idx),
           "gather": lambda: gather(w, 0, wr.tensor(np.array([[0, 0, 0], [bad] * 3], np.int32))),
           "cross_entropy": lambda: F.cross_entropy(wr.tensor(np.ones((2, A), np.float32)),
                                                    idx)}[op]()
    try:
        out.numpy()
        return f"{op} with index {bad} of {A}: no error"
    except IndexError as e:
        if f"index {bad} " not in str(e):
            return f"{op}: message does not name {bad}: {e}"
    if embedding(wr.tensor(np.array([A - 1], np.int32)), w).numpy().shape != (1, 3):
        return "a good read after the error failed"


CASES = {"reduce_long": case_reduce_long, "reduce_int": case_reduce_int,
         "short_rows": case_short_rows, "row_ops": case_row_ops,
         "index_backward": case_index_backward, "nan_elementwise": case_nan_elementwise,
         "device_assert": case_device_assert}


def numerics_campaign(n: int, seed: int, log=print) -> list:
    """n runs; run i takes case i mod len(CASES) (each case equally often) with seeded values."""
    import wgrumus as wr
    rng = np.random.default_rng(seed)
    names = list(CASES)
    recs = []
    for i in range(n):
        name, s = names[i % len(names)], int(rng.integers(1 << 30))
        t0 = time.monotonic()
        try:
            err = CASES[name](wr, np.random.default_rng(s))
        except Exception:  # an unexpected exception fails the run, with its traceback
            err = traceback.format_exc(limit=3)
        rec = {"case": name, "seed": s, "ok": err is None, "seconds": round(
            time.monotonic() - t0, 2), "detail": err or ""}
        recs.append(rec)
        log(f"[numerics {i + 1}/{n}] {name} seed={s} {rec['seconds']}s "
            f"{'ok' if rec['ok'] else 'FAIL ' + rec['detail']}")
    return recs


def summarize_numerics(recs: list) -> dict:
    """case -> [runs, passed, max seconds]."""
    table: dict = {}
    for r in recs:
        row = table.setdefault(r["case"], [0, 0, 0.0])
        row[0] += 1
        row[1] += r["ok"]
        row[2] = max(row[2], r["seconds"])
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40, help="runs, cycling over the cases "
                    "(default 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="one run of each case")
    ap.add_argument("--json", metavar="FILE", help="also write every run's record there")
    a = ap.parse_args()
    t0 = time.monotonic()
    recs = numerics_campaign(len(CASES) if a.quick else a.runs, a.seed,
                             log=lambda line: print(line, file=sys.stderr))
    print(f"{'case':16s} {'passed':>8s} {'slowest':>8s}")
    for case, (runs, ok, worst) in summarize_numerics(recs).items():
        print(f"{case:16s} {ok:>4d}/{runs:<3d} {worst:7.2f}s")
    passed = sum(r["ok"] for r in recs)
    print(f"{passed}/{len(recs)} runs matched numpy; {time.monotonic() - t0:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"campaign": "numerics", "seed": a.seed, "runs": recs}, f, indent=1)
    return 0 if passed == len(recs) else 1


if __name__ == "__main__":
    sys.exit(main())
