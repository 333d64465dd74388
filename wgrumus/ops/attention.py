"""Attention: softmax(scale q k^T, causal) v. flash_attention over [..., T, d], the packed
causal_self_attention of a qkv projection [B, T, 3E] (MultiheadAttention, GPT) and
head_attention over [B, H, T, d] views: their shape rules, forward calls and backward rules.
Each runs the fused kernel (FlashAttention: K/V tiles streamed with an online softmax, O(T)
memory; kernels/attention_gpu.py) where the scores would be large, else the unfused composition
of two matmuls around the fused softmax, or on CPU adapters one kernel on the packed projection
(kernels/attention_cpu.py).
"""
from __future__ import annotations

import math

from ..autograd.tape import needs_grad, no_grad, record
from ..kernels import attention_cpu
from ..kernels.attention_gpu import (
    CPU_MAX_HEAD_DIM,
    CPU_MAX_ROWS,
    MAX_HEAD_DIM,
    fused_fits,
    launch,
    tiles_for,
)
from ..kernels.map import run_map
from ..runtime.errors import AdapterLimitError, ShapeError
from ..tensor import Tensor, check_same_device, float16, float32
from .elementwise import _f32, cast, contiguous, copy_into, fill_
from .matmul import matmul_into
from .precision import autocast_dtype, in_forward_precision
from .shape import permute, reshape, transpose
from .softmax import softmax, softmax_backward

__all__ = ["CPU_MAX_ROWS", "attention_backward", "attention_forward", "causal_self_attention",
           "check_attention", "flash_attention", "fused_fits", "head_attention", "prefer_fused"]


def _pad(x: Tensor, dp: int) -> Tensor:
    """[BH, T, d] -> [BH, T, dp] with zero columns (the row kernel reads rows as vec4s)."""
    if x.shape[-1] == dp:
        return x
    out = fill_(Tensor.empty(x.shape[:-1] + (dp,), x.device, x.dtype), 0.0)
    copy_into(out[..., :x.shape[-1]], x)
    return out


def _unpad(x: Tensor, d: int) -> Tensor:
    return x if x.shape[-1] == d else contiguous(x[..., :d])


def attention_forward(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool):
    """(O [BH, Tq, d] f32, logsumexp [BH, Tq] f32) of contiguous q [BH, Tq, d], k, v
    [BH, Tk, d] (f32 or f16). No autograd."""
    BH, Tq, d = q.shape
    tiles = tiles_for(q.device, d, max(Tq, k.shape[1]))
    dp = d if tiles else -(-d // 4) * 4
    o = Tensor.empty((BH, Tq, dp), q.device, float32)
    lse = Tensor.empty((BH, Tq), q.device, float32)
    if o.numel():
        launch("fwd", _pad(q, dp), _pad(k, dp), _pad(v, dp), o, lse, scale, causal, Tq,
                tiles=tiles)
    return _unpad(o, d), lse


def attention_backward(q, k, v, o, lse, do, scale: float, causal: bool):
    """(dq, dk, dv) f32 given ``do``: dq per query block, then dk and dv per key block
    (FlashAttention-2's split: no atomics, deterministic)."""
    BH, Tq, d = q.shape
    Tk = k.shape[1]
    dev = q.device
    tiles = tiles_for(dev, d, max(Tq, Tk))
    dp = d if tiles else -(-d // 4) * 4
    dq = Tensor.empty((BH, Tq, dp), dev, float32)
    dsum = Tensor.empty((BH, Tq), dev, float32)
    dk = Tensor.empty((BH, Tk, dp), dev, float32)
    dv = Tensor.empty((BH, Tk, dp), dev, float32)
    if dq.numel():
        q, k, v, o, do = (_pad(t, dp) for t in (q, k, v, o, do))
        launch("q", q, k, v, dq, dsum, scale, causal, Tq, o, do, lse, tiles=tiles)
        launch("kv", q, k, v, dk, dv, scale, causal, Tk, o, do, lse, dsum, tiles=tiles)
    return _unpad(dq, d), _unpad(dk, d), _unpad(dv, d)


# Where the scores fit, the unfused composition is faster (8x8x1024x64 causal f+b on the H100:
# 18.2 TFLOP/s unfused vs 11.3 fused, torch SDPA 22.7; lavapipe 0.96 vs 0.36 GFLOP/s); the fused
# kernel takes over where the scores would be large (O(T) memory) or pass one binding.
FUSED_SCORE_BYTES = 512 << 20


def prefer_fused(dev, n: int, d: int, Tq: int, Tk: int) -> bool:
    """Whether attention over ``n`` (batch x heads) [T, d] slices runs the fused kernel: it
    takes the shape, and the f32 scores would pass FUSED_SCORE_BYTES or one binding."""
    scores = 4 * n * Tq * Tk
    return fused_fits(dev, d, Tq, Tk) and scores > min(FUSED_SCORE_BYTES, dev.max_binding)


def check_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, op: str = "attention"):
    """Shape, dtype and device rules of the fused kernel."""
    for t in (q, k, v):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op} needs tensors, got {type(t).__name__}")
    check_same_device(q, k, v, op=op)
    if q.ndim < 2 or k.ndim != q.ndim or v.shape != k.shape:
        raise ShapeError(f"{op}: q [..., Tq, d], k and v [..., Tk, d] expected, got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"{op}: q {q.shape} and k {k.shape} differ in their batch dims or "
                         f"head size (no broadcasting here)")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ShapeError(f"{op}: head size {q.shape[-1]} is outside 1..{MAX_HEAD_DIM}; split "
                         f"the heads further")
    if not fused_fits(q.device, q.shape[-1], q.shape[-2], k.shape[-2]):
        raise AdapterLimitError(
            f"{op}: on a CPU adapter ({q.device.name}) the fused kernel takes head sizes <= "
            f"{CPU_MAX_HEAD_DIM} and sequences <= {CPU_MAX_ROWS:,} (llvmpipe cuts shader loops "
            f"off after 65,535 iterations), got q {q.shape}, k {k.shape}; split the sequence "
            f"or the heads")
    if k.shape[-2] == 0:
        raise ShapeError(f"{op}: no keys (k has shape {k.shape})")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ShapeError(f"{op}: causal attention needs as many queries as keys, got "
                         f"{q.shape[-2]} and {k.shape[-2]}")
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in (float32, float16):
        raise ShapeError(f"{op}: q, k, v must share a float dtype, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if (float16 in (q.dtype, k.dtype, v.dtype) and "shader-f16" not in q.device.features):
        raise AdapterLimitError(f"{op}: float16 needs the adapter feature shader-f16, which "
                                f"{q.device.name} does not have; keep float32")


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    scale: float | None = None, compute_dtype=None) -> Tensor:
    """softmax(scale q k^T, causal) v over [..., T, d], f32 out (``scale``: 1/sqrt(d));
    ``compute_dtype`` f16 (autocast's default) casts the inputs for the kernel."""
    check_attention(q, k, v, causal, "flash_attention")
    lead, Tq, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    BH = math.prod(lead)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dt = compute_dtype or (autocast_dtype() if q.dtype == float32 else None) or q.dtype
    with no_grad():
        qc, kc, vc = (contiguous(reshape(cast(t, dt), (BH, t.shape[-2], d))) for t in (q, k, v))
        o, lse = attention_forward(qc, kc, vc, scale, causal)
    out = reshape(o, lead + (Tq, d))

    def bw(g):
        go = contiguous(reshape(g, (BH, Tq, d)))
        dq, dk, dv = attention_backward(qc, kc, vc, o, lse, go, scale, causal)
        return (reshape(dq, q.shape) if q.requires_grad else None,
                reshape(dk, k.shape) if k.requires_grad else None,
                reshape(dv, v.shape) if v.requires_grad else None)
    record("causal_flash_attention" if causal else "flash_attention", out, [q, k, v], bw,
           saved=[qc, kc, vc, o, lse])
    return out


def causal_self_attention(qkv: Tensor, n_head: int, causal: bool = True,
                          compute_dtype=None) -> Tensor:
    """softmax(q k^T / sqrt(d), causal) v from a packed qkv [B, T, 3E] (PyTorch's layout) to
    [B, T, E]: the fused kernel where the [T, T] scores are large (``prefer_fused``), else two
    matmuls around the fused softmax. ``compute_dtype`` f16 (autocast's default) casts q, k, v."""
    if qkv.ndim != 3 or qkv.shape[-1] % (3 * n_head):
        raise ShapeError(f"causal_self_attention: qkv must be [B, T, 3E] with E divisible by "
                         f"{n_head} heads, got {qkv.shape}")
    B, T, E3 = qkv.shape
    E = E3 // 3
    H, d = n_head, E // n_head
    scale = 1.0 / math.sqrt(d)
    dev = qkv.device
    fused = prefer_fused(dev, B * H, d, T, T)
    cpu = None
    with no_grad():
        src = contiguous(cast(qkv, compute_dtype or autocast_dtype() or float32)) if fused \
            else contiguous(_f32(qkv))  # (unfused: its matmuls cast under autocast)
        # [B, T, 3, H, d] -> [3, B, H, T, d]: q, k, v as head views (fused: one copy)
        heads = permute(reshape(src, (B, T, 3, H, d)), (2, 0, 3, 1, 4))
        if fused:
            heads = contiguous(heads)
            n = B * H * T * d
            q, k, v = (Tensor(heads.storage, (B * H, T, d), None, heads.offset + i * n,
                              heads.dtype) for i in range(3))
            o, lse = attention_forward(q, k, v, scale, causal)  # [B*H, T, d]
            y = contiguous(permute(reshape(o, (B, H, T, d)), (0, 2, 1, 3)))
            y = Tensor(y.storage, (B, T, E), None, y.offset)
        else:  # the output stored with its heads merged (CPU adapters: attention_cpu)
            y = Tensor.empty((B, T, E), dev, float32)
            cpu = compute_dtype is None and autocast_dtype() is None and \
                attention_cpu.fits(dev, T, d) and attention_cpu.forward(_aligned(src), H, scale,
                                                                         causal, y)
            if not cpu:
                q, k, v = (heads[i] for i in range(3))
                p = _attend(q, k, v, _merged(y, H), scale, causal)
    if not needs_grad(qkv):
        return y

    def bw(g):
        if not fused and cpu:
            return (attention_cpu.backward(_aligned(src), _aligned(_f32(g)), *cpu[1:], H, scale,
                                           causal, Tensor.empty((B, T, E3), dev, float32)),)
        go = permute(reshape(g, (B, T, H, d)), (0, 2, 1, 3))
        if not fused:  # each gradient stored into its part of d(qkv) [B, T, 3, H, d]
            dqkv = Tensor.empty((B, T, 3, H, d), dev, float32)
            _attend_backward(q, k, v, p, go, permute(dqkv, (2, 0, 3, 1, 4)), scale, causal)
            return (Tensor(dqkv.storage, (B, T, E3), None, 0),)
        go = contiguous(go)
        go = Tensor(go.storage, (B * H, T, d), None, go.offset)
        dq, dk, dv = attention_backward(q, k, v, o, lse, go, scale, causal)
        # d(qkv) [B, T, 3, H, d] in one kernel: part s of each element picks dq, dk or dv
        st = (H * T * d, d, 0, T * d, 1)
        views = [Tensor(t.storage, (B, T, 3, H, d), st, t.offset) for t in (dq, dk, dv)]
        dqkv = Tensor.empty((B, T, 3, H, d), dev, float32)
        run_map("select(select(c, b, (i / u32(E)) % 3u == 1u), a, (i / u32(E)) % 3u == 0u)",
                dqkv, views, {"E": E})
        return (Tensor(dqkv.storage, (B, T, E3), None, 0),)
    record("causal_self_attention" if causal else "self_attention", y, [qkv], bw,
           saved=[heads, o, lse] if fused else [src, *cpu[1:]] if cpu else [heads, p])
    return y


def _merged(y: Tensor, H: int) -> Tensor:
    """[B, H, T, d] view of a [B, T, H * d] tensor (its heads merged)."""
    B, T, E = y.shape
    return permute(reshape(y, (B, T, H, E // H)), (0, 2, 1, 3))


def _part(causal: bool, Tq: int, Tk: int):
    """matmul_into's causal parts where the mask is square (else the whole products)."""
    return (lambda name: name) if causal and Tq == Tk else (lambda name: None)


def _attend(q, k, v, y, scale: float, causal: bool) -> Tensor:
    """y (a view) = softmax(q k^T scale, causal) v on [B, H, T, d] f32 views, in place and
    skipping what the mask hides; returns the probabilities (the backward reads them)."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[-2]
    part = _part(causal, Tq, Tk)
    s = matmul_into(q, transpose(k, -1, -2), Tensor.empty((B, H, Tq, Tk), q.device, float32),
                    part("out"))
    p = softmax(s, -1, scale=scale, causal=causal)
    matmul_into(p, v, y, part("a_lower"))
    return p


def _attend_backward(q, k, v, p, go, out, scale: float, causal: bool) -> None:
    """_attend's gradients: d(q), d(k), d(v) stored into the [B, H, T, d] views out[0..2]."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[-2]
    part = _part(causal, Tq, Tk)
    dp = matmul_into(go, transpose(v, -1, -2), Tensor.empty((B, H, Tq, Tk), q.device, float32),
                     part("out"))
    ds = softmax_backward(p, dp, False, scale, Tq if causal else 0)
    for j, (x, w, tri) in enumerate(((ds, k, "a_lower"), (transpose(ds, -1, -2), q, "a_upper"),
                                     (transpose(p, -1, -2), go, "a_upper"))):
        matmul_into(x, w, out[j], part(tri))


def head_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Unfused attention of f32 [B, H, T, d] tensors (any strides) in one autograd node."""
    B, H, Tq, d = q.shape
    scale = 1.0 / math.sqrt(d)
    with no_grad():
        y = Tensor.empty((B, H, Tq, v.shape[-1]), q.device, float32)
        p = _attend(q, k, v, y, scale, causal)
    if not needs_grad(q, k, v):
        return y

    def bw(g):
        grads = [Tensor.empty(t.shape, t.device, float32) for t in (q, k, v)]
        _attend_backward(q, k, v, p, g, grads, scale, causal)
        return tuple(gr if t.requires_grad else None for gr, t in zip(grads, (q, k, v)))
    record("attention", y, [q, k, v], in_forward_precision(bw), saved=[q, k, v, p])
    return y


def _aligned(t: Tensor) -> Tensor:
    """``t`` contiguous and starting at a quad (texture rows and quad stores need it)."""
    t = contiguous(t)
    return t if t.offset % 4 == 0 else copy_into(Tensor.empty(t.shape, t.device, t.dtype), t)
