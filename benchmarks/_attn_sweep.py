"""Fused attention tile sweep (issue 22, item 2): every variant of kernels/attention_gpu.py
VARIANTS, forward, each backward kernel (bwd_q, bwd_kv), backward and forward + backward
through autograd, causal (and with --both not) at B x H x T x d (default 8 x 8 x 1024 x 64,
f32), in GFLOP/s next to the unfused composition and torch's scaled_dot_product_attention
(CUDA, fp32, TF32 off) in the same run; each variant's output and gradients checked against
the reference first. The fastest tiles of each role (fwd, q, kv) make the suggested ATTN_TABLE
entry, timed once more as its own row. Then the peak live device bytes of one fused and one
unfused step at a long T (default 8192; torch's next to them).

    python3 benchmarks/_attn_sweep.py [--size 8x8x1024x64] [--long 8192] [--budget 100]
        [--variants a64,a32t2,...] [--both]

FLOPs are the FlashAttention count: forward 4 B H T^2 d (half of it causal), backward 2.5x the
forward. Times are GPU time from timestamp queries where the adapter has them (as torch's CUDA
events), else host time around queued calls; the f+b column is host time around the whole
autograd step (what benchmarks/ops.py's attention row measures).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
os.environ.setdefault("WGRUMUS_DEVICES", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernel_sweep import gpu_seconds, torch_seconds  # noqa: E402
from ops import _attention_step, _torch, peak_bytes, timeit, torch_attention_peak  # noqa: E402

T0 = time.perf_counter()


def flops(B, H, T, d, causal, part):
    f = 4 * B * H * T * T * d / (2 if causal else 1)
    return f * {"fwd": 1.0, "bwd": 2.5, "f+b": 3.5}[part]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/_attn_sweep.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--size", default=None, help="BxHxTxd (default 8x8x1024x64; 1x2x128x64 on "
                   "a CPU adapter)")
    p.add_argument("--long", type=int, default=None, help="T of the memory rows (default 8192; "
                   "512 on a CPU adapter)")
    p.add_argument("--budget", type=float, default=80.0,
                   help="seconds after which no new variant starts")
    p.add_argument("--variants", default=None, help="comma separated VARIANTS names (all)")
    p.add_argument("--both", action="store_true", help="time the variants without the causal "
                   "mask too (default: causal only, the target's case)")
    p.add_argument("--min-s", type=float, default=0.2, help="seconds per timing")
    p.add_argument("--warm", type=float, default=None, help="seconds of unfused steps first, "
                   "so that an idle GPU reaches its clocks (default 2; 0 on a CPU adapter)")
    a = p.parse_args(argv)
    import wgrumus as wr
    from wgrumus.kernels import attention_gpu as at
    from wgrumus.nn.attention import unfused_attention
    from wgrumus.ops.attention import (
        _launch,
        attention_backward,
        attention_forward,
        flash_attention,
    )
    from wgrumus.runtime.profile import profile
    from wgrumus.runtime.tuning import TUNING
    from wgrumus.tensor import Tensor
    dev = wr.devices()[0]
    cpu = profile(dev).cpu
    B, H, T, d = (int(x) for x in (a.size or ("1x2x128x64" if cpu else "8x8x1024x64"))
                  .split("x"))
    TL = a.long or (512 if cpu else 8192)
    th = _torch()
    print(f"fused attention sweep on {dev.name}; torch: {th.__version__ if th else 'absent'}; "
          f"{B}x{H}x{T}x{d} f32; workgroup memory "
          f"{dev.limits.get('max-compute-workgroup-storage-size')} B", flush=True)
    mk = lambda s, T=T: wr.randn((B, H, T, d), device=dev, seed=s)  # noqa: E731
    q, k, v, g = mk(1), mk(2), mk(3), mk(4)
    for t in (q, k, v):
        t.requires_grad_(True)
    flat = [wr.ops.reshape(x.detach(), (B * H, T, d)) for x in (q, k, v, g)]
    scale = 1.0 / np.sqrt(d)
    sync = dev.synchronize

    def wall(fn):
        return timeit(fn, sync, min_s=a.min_s)

    warm_until = time.perf_counter() + (a.warm if a.warm is not None else 0 if cpu else 2.0)
    while time.perf_counter() < warm_until:
        _attention_step(lambda x, y, z: unfused_attention(x, y, z, is_causal=True), q, k, v, g)
        sync()
    # references: torch where present, else the unfused composition (outputs and dq)
    refs, ref_rate = {}, {}
    for causal in (True, False):
        if th is not None:
            qt, kt, vt = (th.from_numpy(x.numpy()).cuda().requires_grad_(True) for x in (q, k, v))
            gt = th.from_numpy(g.numpy()).cuda()
            ot = th.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            ot.backward(gt)
            refs[causal] = (ot.detach().cpu().numpy(), qt.grad.cpu().numpy())

            def t_fwd():
                with th.no_grad():
                    th.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            def t_fb():
                th.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal) \
                    .backward(gt)
            ref_rate[causal] = {"fwd": torch_seconds(th, t_fwd, a.min_s),
                                "f+b": torch_seconds(th, t_fb, a.min_s)}
        else:
            o = unfused_attention(q, k, v, is_causal=causal)
            refs[causal] = (o.numpy(), wr.autograd.backward_with_grad(o, g).get(q).numpy())
    rows = []  # (name, causal, {part: seconds}, error)
    fn_of = {c: (lambda x, y, z, c=c: flash_attention(x, y, z, causal=c)) for c in (True, False)}
    for causal in (True, False):
        un = lambda x, y, z, c=causal: unfused_attention(x, y, z, is_causal=c)  # noqa: E731
        rows.append(("unfused", causal, {"f+b": wall(lambda: _attention_step(un, q, k, v, g))},
                     None))
        if causal in ref_rate:
            rows.append(("torch SDPA", causal, ref_rate[causal], None))
    # the one-row-per-invocation kernel (the fallback where no tile fits), causal f+b only
    mode, TUNING.row_mode = TUNING.row_mode, "thread"
    rows.append(("row kernel", True, {"f+b": wall(lambda: _attention_step(fn_of[True], q, k, v,
                                                                          g))}, None))
    TUNING.row_mode = mode
    names = a.variants.split(",") if a.variants else list(at.VARIANTS)
    cls = profile(dev).adapter_class
    table = at.ATTN_TABLE.get(cls)

    def time_variant(tag, causal, picked):
        """One row: outputs checked, then each kernel and the autograd step timed."""
        fn = fn_of[causal]
        o = fn(q, k, v)
        dq = wr.autograd.backward_with_grad(o, g).get(q)
        ro, rdq = refs[causal]
        err = max(float(np.abs(o.numpy() - ro).max()), float(np.abs(dq.numpy() - rdq).max()))
        with wr.no_grad():
            ol, lse = attention_forward(*flat[:3], scale, causal)
        # each backward kernel alone (attention_backward's two launches), into scratch
        dx = [Tensor.empty(x.shape, dev, wr.float32) for x in flat[:3]]
        dsum = Tensor.empty(lse.shape, dev, wr.float32)
        role = lambda r, w1, w2, ds=None: lambda: _launch(  # noqa: E731
            r, *flat[:3], w1, w2, scale, causal, T, ol, flat[3], lse, ds, tiles=picked)
        role("q", dx[0], dsum)()
        sec = {"fwd": gpu_seconds(dev, lambda: attention_forward(*flat[:3], scale, causal),
                                  a.min_s),
               "q": gpu_seconds(dev, role("q", dx[0], dsum), a.min_s),
               "kv": gpu_seconds(dev, role("kv", dx[1], dx[2], dsum), a.min_s),
               "bwd": gpu_seconds(dev, lambda: attention_backward(*flat[:3], ol, lse, flat[3],
                                                                    scale, causal), a.min_s),
               "f+b": wall(lambda: _attention_step(fn, q, k, v, g))}
        rows.append((tag, causal, sec, err))

    per_role = {}  # role -> [(seconds, variant)], causal
    for name in names:
        if time.perf_counter() - T0 > a.budget:
            print(f"budget spent: stopped before {name}", flush=True)
            break
        TUNING.attention_variant = name
        picked = {r: at.pick_tiles(dev, r, d) for r in ("fwd", "q", "kv")}
        if None in picked.values():
            print(f"{name}: no tiles fit ({picked}); skipped", flush=True)
            continue
        fallback = [r if picked[r][:4] != at.VARIANTS[name][r][:4] else r + " without sg"
                    for r in picked if picked[r] != at.VARIANTS[name][r]]
        tag = name + (" (fallback: " + ",".join(fallback) + ")" if fallback else "")
        try:
            for causal in (True, False) if a.both else (True,):
                time_variant(tag, causal, picked)
        except Exception as e:  # a variant that fails to build: report, go on
            print(f"{name}: failed: {str(e).splitlines()[0][:200]}", flush=True)
            continue
        sec, err = rows[-2 if a.both else -1][2:]
        if err < 1e-3:
            for r in ("fwd", "q", "kv"):  # (a fallback: the same tiles again on this device)
                per_role.setdefault(r, []).append((sec[r], name))
    TUNING.attention_variant = None
    suggested = {r: min(v)[1] for r, v in per_role.items()}
    if len(suggested) == 3:  # the per-role pick, timed as the table entry it would be
        at.ATTN_TABLE[cls] = suggested
        picked = {r: at.pick_tiles(dev, r, d) for r in ("fwd", "q", "kv")}
        for causal in (True, False) if a.both else (True,):
            time_variant("suggested", causal, picked)
        # the same kernels compiled with wgpu's runtime checks (bounds clamps, loop counters)
        from wgrumus.runtime import device as dmod
        keep = dmod.TRUSTED_FAMILIES
        dmod.TRUSTED_FAMILIES = keep - {"flash_attention2"}
        dev._pipelines.clear()
        time_variant("suggested, checked shaders", True, picked)
        dmod.TRUSTED_FAMILIES = keep
        dev._pipelines.clear()
        at.ATTN_TABLE[cls] = table
    print(f"{'kernel':34} {'causal':>6} {'fwd ms':>8} {'q ms':>8} {'kv ms':>8} {'bwd ms':>8} "
          f"{'f+b ms':>8} {'fwd GF/s':>8} {'bwd GF/s':>8} {'f+b GF/s':>8} {'vs torch':>8} "
          f"{'max err':>8}")
    for name, causal, sec, err in rows:
        cells = []
        for part in ("fwd", "q", "kv", "bwd", "f+b"):
            cells.append(f"{sec[part] * 1e3:8.3f}" if part in sec else " " * 8)
        for part in ("fwd", "bwd", "f+b"):
            cells.append(f"{flops(B, H, T, d, causal, part) / sec[part] / 1e9:8.1f}"
                         if part in sec else " " * 8)
        tr = ref_rate.get(causal, {}).get("f+b")
        cells.append(f"{tr / sec['f+b']:7.2f}x" if tr and "f+b" in sec else " " * 8)
        cells.append(f"{err:8.1e}" if err is not None else " " * 8)
        print(f"{name:34} {str(causal):>6} " + " ".join(cells), flush=True)
    tried = [(name.split()[0], sec) for name, causal, sec, err in rows
             if err is not None and causal and err < 1e-3 and not name.startswith("suggested")]
    if tried:
        fb = min(tried, key=lambda r: r[1]["f+b"])
        print(f"best causal f+b: {fb[0]} ({fb[1]['f+b'] * 1e3:.3f} ms; target: <= 1.5x torch's "
              f"time, vs torch >= 0.67x)")
    if len(suggested) == 3:
        tiles = {r: picked[r] for r in suggested}
        print(f"suggested ATTN_TABLE[{cls!r}] = {suggested}  (fastest causal tiles per role: "
              f"{tiles}; its row: 'suggested')")
    # memory: one (batch, head) at a long T, the default variant
    B, H = 1, 1
    ql, kl, vl, gl = (wr.randn((1, 1, TL, d), device=dev, seed=s) for s in (5, 6, 7, 8))
    for t in (ql, kl, vl):
        t.requires_grad_(True)
    fused = fn_of[True]
    un = lambda x, y, z: unfused_attention(x, y, z, is_causal=True)  # noqa: E731
    mb = {"fused": peak_bytes(dev, lambda: _attention_step(fused, ql, kl, vl, gl)) / 2 ** 20}
    try:
        mb["unfused"] = peak_bytes(dev, lambda: _attention_step(un, ql, kl, vl, gl)) / 2 ** 20
    except Exception as e:  # a [T, T] score matrix past the binding limit
        print(f"unfused at T={TL}: {str(e).splitlines()[0][:120]}")
    if th is not None:
        mb["torch SDPA"] = torch_attention_peak(th, ql, kl, vl, gl) / 2 ** 20
    print(f"peak live device MiB above the inputs, causal f+b at 1x1x{TL}x{d}: "
          + ", ".join(f"{k} {v:.2f}" for k, v in mb.items()))
    print(f"done in {time.perf_counter() - T0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
