"""Variant sweep for one GPU session (issue 22, items 3 and 4): every matmul variant of
kernels/matmul_gpu.py VARIANTS and every row-op variant of kernels/rows_gpu.py
ROW_VARIANTS, timed next to torch (CUDA, TF32 off) in the same run, each checked against numpy
first. Prints compact tables,
the best variant per case and MATMUL_TABLE / ROW_TABLE rows to paste; stops starting new
measurements after --budget seconds.

    python3 benchmarks/_kernel_sweep.py [--sizes 512,1024,2048,4096] [--budget 380]
        [--rows 16384x1024,...] [--only matmul,rows] [--out FILE]

Times are GPU time from timestamp queries where the adapter has them (host dispatch cost left
out, as torch's CUDA-event times leave it out), else host time around queued calls.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
os.environ.setdefault("WGRUMUS_DEVICES", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops import _torch as get_torch  # noqa: E402  (benchmarks/ops.py: torch+CUDA, TF32 off)

T0 = time.perf_counter()
OUT = []  # the --out file, written line by line (a run killed at its limit keeps its lines)


def say(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    for f in OUT:
        f.write(line + "\n")
        f.flush()


def left(budget) -> bool:
    return time.perf_counter() - T0 < budget


def each_variant(names, bad, budget, case):
    """The variant names to measure in a case: those not failed yet, while budget is left."""
    for name in names:
        if not left(budget):
            say(f"budget spent: {case} stopped before {name}")
            return
        if name not in bad:
            yield name


def gpu_seconds(dev, fn, min_s):
    """Seconds per call of fn (wgrumus): warm-up, probe, then n calls inside a GpuTimer."""
    from wgrumus.runtime.gpu_timer import GpuTimer
    fn(); dev.synchronize()
    t0 = time.perf_counter(); fn(); dev.synchronize()
    n = int(min(200, max(3, min_s / max(time.perf_counter() - t0, 1e-6))))
    if "timestamp-query" in dev.features:
        with GpuTimer(dev) as t:
            for _ in range(n):
                fn()
        if t.seconds > 0 and not t.untimed:
            return t.seconds / n
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dev.synchronize()
    return (time.perf_counter() - t0) / n


def torch_seconds(torch, fn, min_s):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter(); fn(); torch.cuda.synchronize()
    n = int(min(200, max(3, min_s / max(time.perf_counter() - t0, 1e-6))))
    return cuda_event_seconds(torch, fn, n)


def cuda_event_seconds(torch, fn, n):
    """Seconds per call of n calls of fn (torch), between two CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e-3 / n


def print_table(res, names, label, width, digits):
    """Print res {case: {variant: rate}} as a table (a row per variant, a column per case);
    return (case, best variant, our rates, torch's rate or None) for every case."""
    cols = sorted(res)
    say("variant".ljust(11) + " ".join(label(c).rjust(width) for c in cols))
    for name in names + ["torch"]:
        vals = [res[c].get(name) for c in cols]
        if any(v is not None for v in vals):
            say(name.ljust(11) + " ".join((f"{v:{width}.{digits}f}" if v is not None
                                           else " " * width) for v in vals))
    best = []
    for c in cols:
        ours = {k: v for k, v in res[c].items() if k != "torch"}
        if ours:
            best.append((c, max(ours, key=ours.get), ours, res[c].get("torch")))
    return best


def suggest(table, key, rows):
    """A table entry of (bound, best variant) rows; the largest case measured stands for
    everything above it."""
    rows = sorted(rows)
    bounds = [str(b) for b, _ in rows[:-1]] + ["1 << 62"]
    say(f"suggested {table}[(class, {key!r})] = ("
        + " ".join(f"({m}, {name!r})," for m, (_, name) in zip(bounds, rows)) + ")")


# ------------------------------------------------------------------------------ matmul

def mm_cases(sizes):
    """(dtype, layout, n, A shape, B shape): FLOPs of every case are 2 n^3."""
    cases = []  # most wanted first, in case the budget runs out
    for dt, lay in (("f32", "nn"), ("f16", "nn"), ("f32", "nt"), ("f32", "batched"),
                    ("f16", "nt")):
        for n in sizes:
            if lay == "batched":  # 8 products of n/2: the FLOPs of one n^3 product
                if n < 1024:
                    continue
                h = n // 2
                cases.append((dt, lay, n, (8, h, h), (8, h, h)))
            else:
                cases.append((dt, lay, n, (n, n), (n, n)))
    return cases


def warm_up(dev, torch, seconds: float = 2.0) -> None:
    """Large products for a few seconds first: a GPU that idled starts at low clocks, and the
    first case timed cold ran 5-7x slow on the H100 (f32 512 A@B: 1.9 vs 13.9 TFLOP/s warm)."""
    import wgrumus as wr
    a = wr.tensor(np.ones((2048, 2048), np.float32), device=dev)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a
        dev.synchronize()
    if torch is not None:
        x = torch.ones(2048, 2048, device="cuda")
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            x @ x
            torch.cuda.synchronize()


def sweep_matmul(dev, torch, sizes, budget, min_s):
    import wgrumus as wr
    mm = importlib.import_module("wgrumus.kernels.matmul_gpu")
    from wgrumus.kernels.matmul_cpu import use_cpu_kernel
    from wgrumus.runtime.profile import profile
    from wgrumus.runtime.tuning import TUNING
    say(f"# matmul: TFLOP/s (2 n^3 / time); torch fp32 TF32 off, fp16 tensor cores; "
        f"adapter class {profile(dev).adapter_class}")
    names = ["default"] + list(mm.VARIANTS)
    keep = mm._pick_variant
    if use_cpu_kernel(dev):  # the variants are of the GPU kernel: run it here too
        say("# CPU adapter: 'default' is the CPU kernel, the variants run the GPU kernel")
    res: dict = {}  # (dt, lay, n) -> {name: tflops}
    bad: dict = {}  # name -> error text
    rng = np.random.default_rng(0)
    for dt, lay, n, sa, sb in mm_cases(sizes):
        if not left(budget):
            say(f"budget spent: skipped matmul {dt} {lay} {n} and later cases")
            break
        npdt = np.float16 if dt == "f16" else np.float32
        an = rng.standard_normal(sa).astype(npdt)
        bn = rng.standard_normal(sb[:-2] + sb[-2:][::-1] if lay == "nt" else sb).astype(npdt)
        a, b = wr.tensor(an, device=dev), wr.tensor(bn, device=dev)
        if lay == "nt":
            b = b.transpose(-1, -2)
        # checked against numpy at the smallest size, against the default kernel above it
        ref = None
        if n == min(sizes) or (lay == "batched" and n == min(s for s in sizes if s >= 1024)):
            ref = an.astype(np.float32) @ np.swapaxes(bn, -1, -2).astype(np.float32) \
                if lay == "nt" else an.astype(np.float32) @ bn.astype(np.float32)
        row = res.setdefault((dt, lay, n), {})
        for name in each_variant(names, bad, budget, f"matmul {dt} {lay} {n}"):
            v = None if name == "default" else mm.VARIANTS[name]
            if dt == "f32" and v and v.get("half"):
                continue
            mm._pick_variant = lambda *x, v=v: v
            TUNING.cpu_matmul = None if v is None else False
            try:
                got = (a @ b).numpy().astype(np.float32)
                if ref is None:
                    ref = got  # the default kernel's product
                else:
                    err = float(np.abs(got - ref).max() / np.abs(ref).max())
                    if not err < (3e-2 if dt == "f16" else 1e-4):
                        bad[name] = f"max relative error {err:.2e} at {dt} {lay} {n}"
                        continue
                s = gpu_seconds(dev, lambda: a @ b, min_s)
                row[name] = 2 * n ** 3 / s / 1e12
            except Exception as e:  # a variant that does not build here: say so, go on
                bad[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            finally:
                mm._pick_variant, TUNING.cpu_matmul = keep, None
        if torch is not None:
            tdt = torch.float16 if dt == "f16" else torch.float32
            x = torch.randn(*sa, device="cuda", dtype=tdt)
            y = torch.randn(*sb, device="cuda", dtype=tdt)
            if lay == "nt":
                y = y.transpose(-1, -2)
            row["torch"] = 2 * n ** 3 / torch_seconds(torch, lambda: x @ y, min_s) / 1e12
            del x, y
    for name, why in bad.items():
        say(f"matmul variant {name} left out: {why}")
    _mm_table(res, names)


def _mm_table(res, names):
    cases = print_table(res, names, lambda c: f"{c[0]}{c[1][:2]}{c[2]}", 10, 2)
    say("# best per case (x torch same dtype; f16 also x our best f32 nn rate at that n)")
    table: dict = {}
    for c, best, ours, t in cases:
        f32 = {k: v for k, v in res.get(("f32", "nn", c[2]), {}).items() if k != "torch"}
        extra = f" {ours[best] / max(f32.values()):.2f}x f32" if c[0] == "f16" and f32 else ""
        say(f"best {c[0]} {c[1]} {c[2]}: {best} {ours[best]:.2f} TFLOP/s "
            f"(default {ours.get('default', float('nan')):.2f})"
            + (f" {ours[best] / t:.2f}x torch" if t else "") + extra)
        if c[1] == "nn":
            table.setdefault(c[0], []).append((c[2], best))
    for dt, rows in table.items():
        suggest("MATMUL_TABLE", dt, [(n * n, b) for n, b in rows])


# ------------------------------------------------------------------------------ row ops

ROW_SHAPES = "16384x1024,65536x256,8192x768,4096x4096"
ROW_BYTES = {"sm_fwd": 2, "sm_bwd": 3, "ln_fwd": 2, "ln_bwd": 3, "xe_stats": 1}  # passes over R x L


def sweep_rows(dev, torch, shapes, budget, min_s):
    import wgrumus as wr
    from wgrumus.kernels import rows as row_kernels
    from wgrumus.kernels import rows_gpu as rowops
    from wgrumus.ops import cross_entropy, layer_norm, softmax
    from wgrumus.ops.softmax import softmax_backward
    from wgrumus.runtime.tuning import TUNING
    say("# row ops: GB/s (bytes of f32 reads + writes of R x L / time; cross-entropy: the read); "
        "the default is softmax.wgsl / layernorm.wgsl / xent.wgsl")
    names = ["default"] + list(rowops.ROW_VARIANTS)
    res: dict = {}
    bad: dict = {}
    rng = np.random.default_rng(1)
    for R, L in shapes:
        if not left(budget):
            say(f"budget spent: skipped rows {R}x{L} and later shapes")
            break
        xn = rng.standard_normal((R, L)).astype(np.float32)
        gn = rng.standard_normal((R, L)).astype(np.float32)
        x, g = wr.tensor(xn, device=dev), wr.tensor(gn, device=dev)
        e = np.exp(xn - xn.max(1, keepdims=True))
        y_ref = e / e.sum(1, keepdims=True)
        y = wr.tensor(y_ref, device=dev)
        mu, var = xn.mean(1, keepdims=True), xn.var(1, keepdims=True)
        rs = 1 / np.sqrt(var + 1e-5)
        xh = (xn - mu) * rs
        mean, rstd = wr.tensor(mu.ravel(), device=dev), wr.tensor(rs.ravel(), device=dev)
        tn = rng.integers(0, L, R)
        td = wr.tensor(tn.astype(np.int32), device=dev)  # device targets: no upload per call
        lse = xn.max(1) + np.log(e.sum(1))
        cases = {
            "sm_fwd": (lambda: softmax(x, -1), y_ref),
            "sm_bwd": (lambda: softmax_backward(y, g),
                       y_ref * (gn - (gn * y_ref).sum(1, keepdims=True))),
            "ln_fwd": (lambda: layer_norm(x, (L,)), xh),
            "ln_bwd": (lambda: row_kernels.layer_norm_backward(x, g, None, mean, rstd),
                       rs * (gn - gn.mean(1, keepdims=True)
                             - xh * (gn * xh).mean(1, keepdims=True))),
            "xe_stats": (lambda: cross_entropy(x, td, reduction="none"),
                       lse - xn[np.arange(R), tn]),
        }
        for op, (fn, want) in cases.items():
            row = res.setdefault((op, R, L), {})
            for name in each_variant(names, bad, budget, f"{op} {R}x{L}"):
                TUNING.row_variant = None if name == "default" else name
                try:
                    err = float(np.abs(fn().numpy() - want).max() / np.abs(want).max())
                    if not err < 1e-4:
                        bad[name] = f"max relative error {err:.2e} at {op} {R}x{L}"
                        continue
                    row[name] = ROW_BYTES[op] * 4 * R * L / gpu_seconds(dev, fn, min_s) / 1e9
                except Exception as ex:
                    bad[name] = f"{type(ex).__name__}: {str(ex).splitlines()[0][:200]}"
                finally:
                    TUNING.row_variant = None
        if torch is not None:
            tx = torch.randn(R, L, device="cuda")
            tg = torch.randn(R, L, device="cuda")
            ty = torch.softmax(tx, -1)
            tm, tr = torch.ops.aten.native_layer_norm(tx, [L], None, None, 1e-5)[1:]
            tt = torch.randint(0, L, (R,), device="cuda")
            tfn = {
                "sm_fwd": lambda: torch.softmax(tx, -1),
                "sm_bwd": lambda: torch._softmax_backward_data(tg, ty, -1, torch.float32),
                "ln_fwd": lambda: torch.nn.functional.layer_norm(tx, (L,)),
                "ln_bwd": lambda: torch.ops.aten.native_layer_norm_backward(
                    tg, tx, [L], tm, tr, None, None, [True, False, False]),
                "xe_stats": lambda: torch.nn.functional.cross_entropy(tx, tt, reduction="none"),
            }
            for op, fn in tfn.items():
                try:
                    res[(op, R, L)]["torch"] = (ROW_BYTES[op] * 4 * R * L
                                                / torch_seconds(torch, fn, min_s) / 1e9)
                except Exception as ex:
                    say(f"torch {op} failed: {str(ex)[:200]}")
    for name, why in bad.items():
        say(f"row variant {name} left out: {why}")
    best_by_op: dict = {}
    for c, best, ours, t in print_table(res, names, lambda c: f"{c[0]}:{c[1]}x{c[2]}", 18, 0):
        say(f"best {c[0]} {c[1]}x{c[2]}: {best} {ours[best]:.0f} GB/s "
            f"(default {ours.get('default', float('nan')):.0f})"
            + (f" {ours[best] / t:.2f}x torch" if t else ""))
        best_by_op.setdefault(c[0], []).append((c[2], best))
    for op, rows in best_by_op.items():
        suggest("ROW_TABLE", op, rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="512,1024,2048,4096")
    p.add_argument("--budget", type=float, default=380.0, help="seconds; no new case after")
    p.add_argument("--min-s", type=float, default=0.08, help="timed seconds per measurement")
    p.add_argument("--rows", default=ROW_SHAPES, help="row-op shapes RxL,...")
    p.add_argument("--only", default="matmul,rows")
    p.add_argument("--out", default=None, help="also write the output to this file")
    a = p.parse_args()
    import wgrumus as wr
    from wgrumus.kernels import rows_gpu as rowops
    dev = wr.devices()[0]
    torch = get_torch()
    say(f"# {dev.name}; features {sorted(dev.features)}; torch "
        f"{'CUDA ' + torch.__version__ if torch else 'absent (no ratios)'}")
    if a.out:
        OUT.append(open(a.out, "w"))
    say(f"# subgroup size bound for row ops: {rowops._subgroup_max(dev)}; adapter info "
        f"{ {k: v for k, v in dev.adapter_info.items() if k != 'description'} }")
    try:
        only = a.only.split(",")
        if "matmul" in only:
            warm_up(dev, torch)
            sweep_matmul(dev, torch, [int(s) for s in a.sizes.split(",")],
                         a.budget * (0.75 if "rows" in only else 1.0), a.min_s)
        if "rows" in only:
            shapes = [tuple(int(v) for v in s.split("x")) for s in a.rows.split(",")]
            sweep_rows(dev, torch, shapes, a.budget, a.min_s)
        say(f"# done in {time.perf_counter() - T0:.0f} s")
    finally:
        for f in OUT:
            f.close()


if __name__ == "__main__":
    main()
