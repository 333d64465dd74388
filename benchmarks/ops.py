"""Op throughput: matmul, elementwise, softmax/layer_norm, attention (fused vs unfused, time and
peak memory), staging, small-op submission rate,
each next to numpy (CPU) and torch (CUDA, TF32 off) measured in the same run.

    python benchmarks/ops.py [--quick] [--json] [--sizes 256,512,...] [--mb 256]

--quick (the default on a CPU adapter such as lavapipe) keeps sizes small.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


def timeit(fn, sync=lambda: None, min_s=0.25, min_n=2, max_n=500) -> float:
    """Seconds per call: a warm-up, a timed probe, then n calls queued back to back."""
    fn(); sync()
    t0 = time.perf_counter(); fn(); sync()
    one = time.perf_counter() - t0
    n = int(min(max_n, max(min_n, min_s / max(one, 1e-7))))
    if one > 2 * min_s:
        return one
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n


def _torch():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


class Rows:
    def __init__(self):
        self.rows = []

    def add(self, bench, size, unit, ours, numpy=None, torch=None, note=""):
        r = {"bench": bench, "size": size, "unit": unit, "wgrumus": ours, "numpy": numpy,
             "torch": torch, "vs_numpy": ours / numpy if numpy else None,
             "vs_torch": ours / torch if torch else None}
        if note:
            r["note"] = note
        self.rows.append(r)
        return r


def bench_matmul(rows, dev, sizes, th):
    import wgrumus as wr
    for n in sizes:
        flop = 2.0 * n ** 3
        a, b = wr.randn((n, n), device=dev, seed=1), wr.randn((n, n), device=dev, seed=2)
        ours = flop / timeit(lambda: a @ b, dev.synchronize) / 1e9
        bt = b.T.contiguous()  # the Linear layout: x @ W^T with W stored (out, in)
        ours_t = flop / timeit(lambda: a @ bt.T, dev.synchronize) / 1e9
        an, bn = a.numpy(), b.numpy()
        ref_np = flop / timeit(lambda: an @ bn, min_s=0.1, min_n=1) / 1e9
        # OpenBLAS's worker threads spin ~0.1 s after a product before they park: on a CPU
        # adapter they took a core from the next size's wgrumus row (lavapipe 512: 41 -> 30
        # GFLOP/s right after numpy's 256 product; BENCHMARKS.md)
        time.sleep(0.2)
        ref_t = None
        if th is not None:
            x, y = th.from_numpy(an).cuda(), th.from_numpy(bn).cuda()
            ref_t = flop / timeit(lambda: x @ y, th.cuda.synchronize) / 1e9
        rows.add("matmul", f"{n}", "GFLOP/s", ours, ref_np, ref_t)
        rows.add("matmul A@B^T", f"{n}", "GFLOP/s", ours_t, None, ref_t)
        kernel = gpu_seconds(dev, lambda: a @ b)
        if kernel is not None:  # the kernels alone: no per-call host time in either figure
            rows.add("matmul (kernel)", f"{n}", "GFLOP/s", flop / kernel / 1e9, None,
                     torch_kernel(th, lambda: x @ y, flop), note="GPU time")
        if n == sizes[-1] and "shader-f16" in dev.features:
            # f16 storage, f32 accumulation; torch's f16 runs on tensor cores
            ah, bh = a.half(), b.half()
            ours_h = flop / timeit(lambda: ah @ bh, dev.synchronize) / 1e9
            ref_h = None
            if th is not None:
                xh, yh = x.half(), y.half()
                ref_h = flop / timeit(lambda: xh @ yh, th.cuda.synchronize) / 1e9
            rows.add("matmul f16", f"{n}", "GFLOP/s", ours_h, None, ref_h,
                     note="f16 storage, f32 accumulate; torch f16 uses tensor cores")


def bench_elementwise(rows, dev, n, th):
    import wgrumus as wr
    a, b = wr.randn((n,), device=dev, seed=1), wr.randn((n,), device=dev, seed=2)
    nbytes = 3 * 4 * n
    ours = nbytes / timeit(lambda: a + b, dev.synchronize) / 1e9
    an, bn = a.numpy(), b.numpy()
    ref_np = nbytes / timeit(lambda: an + bn) / 1e9
    ref_t = None
    if th is not None:
        x, y = th.from_numpy(an).cuda(), th.from_numpy(bn).cuda()
        ref_t = nbytes / timeit(lambda: x + y, th.cuda.synchronize) / 1e9
    rows.add("add", f"{n}", "GB/s", ours, ref_np, ref_t)


def gpu_seconds(dev, fn, n: int = 20):
    """Seconds per call inside compute passes (timestamp queries around 20 calls), or None
    without them."""
    from wgrumus.runtime.gpu_timer import GpuTimer
    if "timestamp-query" not in dev.features:
        return None
    fn()
    dev.synchronize()
    with GpuTimer(dev) as t:
        for _ in range(n):
            fn()
    return t.seconds / n


def torch_kernel(th, fn, work: float):
    """work per second of fn's CUDA kernels (CUDA events around 20 calls), or None."""
    if th is None or not th.cuda.is_available():
        return None
    fn()
    return work / cuda_event_seconds(th, fn, 20) / 1e9


def cuda_event_seconds(torch, fn, n):
    """Seconds per call of n calls of fn (torch), between two CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e-3 / n


def bench_rows(rows, dev, r, L, th):
    """softmax and layer_norm over rows of L: GB/s counting one read and one write."""
    try:
        from wgrumus.ops import layer_norm, log_softmax, softmax
    except ImportError:
        return
    import wgrumus as wr
    x = wr.randn((r, L), device=dev, seed=3)
    w, bias = wr.ones((L,), device=dev), wr.zeros((L,), device=dev)
    nbytes = 2 * 4 * r * L
    xn = x.numpy()

    def np_softmax():
        e = np.exp(xn - xn.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def np_ln():
        m = xn.mean(-1, keepdims=True)
        return (xn - m) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5)
    xt = th.from_numpy(xn).cuda() if th is not None else None
    for name, ours_fn, np_fn, t_fn in (
            ("softmax", lambda: softmax(x, -1), np_softmax,
             lambda: th.softmax(xt, -1)),
            ("log_softmax", lambda: log_softmax(x, -1), lambda: np.log(np_softmax()),
             lambda: th.log_softmax(xt, -1)),
            ("layer_norm", lambda: layer_norm(x, (L,), w, bias), np_ln,
             lambda: th.nn.functional.layer_norm(xt, (L,)))):
        ours = nbytes / timeit(ours_fn, dev.synchronize) / 1e9
        ref_np = nbytes / timeit(np_fn) / 1e9
        ref_t = nbytes / timeit(t_fn, th.cuda.synchronize) / 1e9 if th is not None else None
        rows.add(name, f"{r}x{L}", "GB/s", ours, ref_np, ref_t)
        kernel = gpu_seconds(dev, ours_fn)
        if kernel is not None:  # the kernels alone: no per-call host time in either figure
            rows.add(f"{name} (kernel)", f"{r}x{L}", "GB/s", nbytes / kernel / 1e9, None,
                     torch_kernel(th, t_fn, nbytes), note="GPU time")


def bench_adam(rows, dev, n, th):
    """One AdamW step over n parameters: GB/s counting its traffic (read parameter, gradient
    and both moments, write parameter and moments: 7 x 4 bytes per parameter); torch's fused
    AdamW on the same data. numpy: the same update in whole-array operations."""
    import wgrumus as wr
    p = wr.nn.Parameter(wr.randn((n,), device=dev, seed=4))
    p.grad = wr.randn((n,), device=dev, seed=5)
    opt = wr.optim.AdamW([p], lr=1e-3)
    nbytes = 7 * 4 * n
    ours = nbytes / timeit(opt.step, dev.synchronize) / 1e9
    pn, gn = p.numpy(), p.grad.numpy()
    m, v = np.zeros_like(pn), np.zeros_like(pn)

    def np_step():
        m[:] = 0.9 * m + 0.1 * gn
        v[:] = 0.999 * v + 0.001 * gn * gn
        pn[:] -= 1e-3 * (m / (np.sqrt(v) + 1e-8) + 0.01 * pn)
    ref_np = nbytes / timeit(np_step) / 1e9
    ref_t = None
    if th is not None:
        pt = th.nn.Parameter(th.from_numpy(pn.copy()).cuda())
        pt.grad = th.from_numpy(gn).cuda()
        topt = th.optim.AdamW([pt], lr=1e-3, fused=True)
        ref_t = nbytes / timeit(topt.step, th.cuda.synchronize) / 1e9
    rows.add("adamw", f"{n}", "GB/s", ours, ref_np, ref_t)


def bench_staging(rows, dev, mb, th):
    import wgrumus as wr
    n = (mb << 20) // 4
    host = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    t = wr.zeros((n,), device=dev)
    buf = t._storage.buffer
    nbytes = host.nbytes
    out = np.empty_like(host)
    h2d = nbytes / timeit(lambda: dev.write(buf, host), dev.synchronize) / 1e9
    d2h = nbytes / timeit(lambda: t.numpy()) / 1e9
    d2h_pre = nbytes / timeit(lambda: dev.read_array(buf, 0, n, np.float32, out=out)) / 1e9
    assert np.array_equal(out, host), "staging round trip changed the data"
    ref_np = nbytes / timeit(lambda: np.copyto(out, host)) / 1e9
    th_h2d = th_d2h = None
    if th is not None:
        g = th.empty(n, dtype=th.float32, device="cuda")
        p = th.from_numpy(host).pin_memory()
        th_h2d = nbytes / timeit(lambda: g.copy_(p, non_blocking=True), th.cuda.synchronize) / 1e9
        th_d2h = nbytes / timeit(lambda: p.copy_(g, non_blocking=True), th.cuda.synchronize) / 1e9
    rows.add("host->device", f"{mb} MB", "GB/s", h2d, ref_np, th_h2d,
             note="numpy: host memcpy; torch: pinned copy")
    rows.add("device->host", f"{mb} MB", "GB/s", d2h, ref_np, th_d2h,
             note="into a fresh array (Tensor.numpy)")
    rows.add("device->host prealloc", f"{mb} MB", "GB/s", d2h_pre, ref_np, th_d2h,
             note="read_array(out=...)")


def bench_submit(rows, dev, th):
    """Dispatch rate: a chain of 200 dependent small adds, one synchronize at the end."""
    import wgrumus as wr
    x = wr.ones((1024,), device=dev)

    def chain():
        y = x
        for _ in range(200):
            y = y + 1.0
        return y
    ours = 200 / timeit(chain, dev.synchronize, min_s=0.5)
    xn = np.ones(1024, np.float32)

    def np_chain():
        y = xn
        for _ in range(200):
            y = y + 1.0
    ref_np = 200 / timeit(np_chain)
    ref_t = None
    if th is not None:
        xt = th.ones(1024, device="cuda")

        def t_chain():
            y = xt
            for _ in range(200):
                y = y + 1.0
        ref_t = 200 / timeit(t_chain, th.cuda.synchronize, min_s=0.5)
    rows.add("small op chain", "200 x add(1024)", "ops/s", ours, ref_np, ref_t)


def _attention_step(fn, q, k, v, g):
    """forward + backward of ``fn(q, k, v)`` with output gradient g; returns dq."""
    import wgrumus as wr
    return wr.autograd.backward_with_grad(fn(q, k, v), g).get(q)


def peak_bytes(dev, fn) -> int:
    """Peak live device bytes above those live before, while fn() runs (the pool's count)."""
    pool = dev.pool
    dev.synchronize()
    base, peak = pool.live_bytes, [pool.live_bytes]
    acquire = pool.acquire

    def tracked(nbytes):
        buf = acquire(nbytes)
        peak[0] = max(peak[0], pool.live_bytes)
        return buf
    pool.acquire = tracked
    try:
        fn()
        dev.synchronize()
    finally:
        del pool.acquire  # back to the class's method
    return peak[0] - base


def torch_attention_peak(th, q, k, v, g) -> int:
    """Peak CUDA bytes above those allocated before, of one causal SDPA forward + backward on
    copies of the wgrumus tensors q, k, v with output gradient g."""
    qt, kt, vt = (th.from_numpy(t.numpy()).cuda().requires_grad_(True) for t in (q, k, v))
    gt = th.from_numpy(g.numpy()).cuda()
    th.cuda.synchronize()
    base = th.cuda.memory_allocated()
    th.cuda.reset_peak_memory_stats()
    th.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(gt)
    th.cuda.synchronize()
    return th.cuda.max_memory_allocated() - base


def bench_attention(rows, dev, quick, th):
    """Causal attention forward + backward: the fused kernel, the unfused composition
    (q k^T, softmax, @ v) and torch's scaled_dot_product_attention (fp32), in GFLOP/s of the
    FlashAttention count (fwd 4 B H T^2 d / 2 causal, bwd 2.5x fwd); then the peak live
    device bytes of one fused and one unfused step at a long T."""
    import wgrumus as wr
    from wgrumus.nn.attention import unfused_attention
    from wgrumus.ops.attention import flash_attention
    B, H, T, d = (1, 2, 256, 64) if quick else (8, 8, 1024, 64)
    flop = 3.5 * 4 * B * H * T * T * d / 2
    mk = lambda s, T=T: wr.randn((B, H, T, d), device=dev, seed=s)  # noqa: E731
    q, k, v, g = mk(1), mk(2), mk(3), mk(4)
    for t in (q, k, v):
        t.requires_grad_(True)
    fused = lambda a, b, c: flash_attention(a, b, c, causal=True)  # noqa: E731
    unfused = lambda a, b, c: unfused_attention(a, b, c, is_causal=True)  # noqa: E731
    ref_t = None
    if th is not None:
        qt, kt, vt = (th.from_numpy(t.numpy()).cuda().requires_grad_(True) for t in (q, k, v))
        gt = th.from_numpy(g.numpy()).cuda()

        def t_step():
            th.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True) \
                .backward(gt)
        ref_t = flop / timeit(t_step, th.cuda.synchronize) / 1e9
    size = f"{B}x{H}x{T}x{d}"
    for name, fn in (("attention fused f+b", fused), ("attention unfused f+b", unfused)):
        ours = flop / timeit(lambda: _attention_step(fn, q, k, v, g), dev.synchronize) / 1e9
        rows.add(name, size, "GFLOP/s", ours, None, ref_t, note="causal; torch: SDPA fp32")
    # memory: one (batch, head) at a long T; the unfused step holds [T, T] scores and probs
    TL = 1024 if quick else 8192
    B, H = 1, 1
    ql, kl, vl, gl = (mk(s, TL) for s in (5, 6, 7, 8))
    for t in (ql, kl, vl):
        t.requires_grad_(True)
    mb_f = peak_bytes(dev, lambda: _attention_step(fused, ql, kl, vl, gl)) / 2 ** 20
    mb_u = peak_bytes(dev, lambda: _attention_step(unfused, ql, kl, vl, gl)) / 2 ** 20
    ref_mb = torch_attention_peak(th, ql, kl, vl, gl) / 2 ** 20 if th is not None else None
    note = "live device bytes above the inputs, fwd + bwd (lower is better)"
    rows.add("attention fused peak", f"1x1x{TL}x{d}", "MiB", mb_f, None, ref_mb, note=note)
    rows.add("attention unfused peak", f"1x1x{TL}x{d}", "MiB", mb_u, None, ref_mb,
             note=f"{mb_u / max(mb_f, 1e-9):.1f}x the fused peak")


def _fmt(v):
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def print_table(meta, rows):
    print(f"wgrumus ops benchmark on {meta['adapter']} ({meta['date']})")
    print(f"torch: {meta['torch'] or 'not available'}; numpy {meta['numpy']} on "
          f"{meta['cpus']} CPUs; wgrumus from {meta['wgrumus']}")
    hdr = f"{'bench':22} {'size':>16} {'unit':>8} {'wgrumus':>10} {'numpy':>10} {'torch':>10}" \
          f" {'vs numpy':>9} {'vs torch':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        ratio = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
        print(f"{r['bench']:22} {r['size']:>16} {r['unit']:>8} {_fmt(r['wgrumus']):>10} "
              f"{_fmt(r['numpy']):>10} {_fmt(r['torch']):>10} {ratio(r['vs_numpy']):>9} "
              f"{ratio(r['vs_torch']):>9}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/ops.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (default on CPU adapters)")
    p.add_argument("--full", action="store_true", help="full sizes even on a CPU adapter")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--sizes", help="matmul sizes, comma separated (default 256..4096)")
    p.add_argument("--mb", type=int, help="staging transfer size in MiB (default 256)")
    p.add_argument("--only", default="matmul,add,rows,adam,attention,staging,submit",
                   help="comma separated subset of: matmul,add,rows,adam,attention,staging,"
                        "submit")
    a = p.parse_args(argv)
    import wgrumus as wr
    dev = wr.devices()[0]
    cpu = str(dev.adapter_info.get("adapter_type", "")).lower() == "cpu"
    quick = a.quick or (cpu and not a.full)
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else (
        [256, 512] if quick else [256, 512, 1024, 2048, 4096])
    mb = a.mb or (16 if quick else 256)
    th = _torch()
    meta = {"adapter": dev.name, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC"), "host": platform.node(), "cpus": os.cpu_count(),
            "numpy": np.__version__, "torch": th.__version__ if th else None,
            "torch_device": th.cuda.get_device_name() if th else None,
            "command": "python " + " ".join([sys.argv[0]] + list(argv if argv is not None
                                                                   else sys.argv[1:])),
            "quick": quick, "wgrumus": os.path.dirname(wr.__file__)}
    rows = Rows()
    only = set(a.only.split(","))
    if "matmul" in only:
        bench_matmul(rows, dev, sizes, th)
    if "add" in only:
        bench_elementwise(rows, dev, (1 << 20) if quick else (1 << 26), th)
    if "rows" in only:
        bench_rows(rows, dev, 1024 if quick else 16384, 1024, th)
    if "adam" in only:
        bench_adam(rows, dev, (1 << 20) if quick else (1 << 26), th)
    if "attention" in only:
        bench_attention(rows, dev, quick, th)
    if "staging" in only:
        bench_staging(rows, dev, mb, th)
    if "submit" in only:
        bench_submit(rows, dev, th)
    if a.json:
        print(json.dumps({"meta": meta, "rows": rows.rows}, indent=1))
    else:
        print_table(meta, rows.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
