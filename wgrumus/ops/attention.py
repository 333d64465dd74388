"""Fused attention (FlashAttention): K/V tiles streamed with an online softmax, O(T) memory; the
backward recomputes the scores from the saved logsumexp. FlashAttention-2 tiles
(attention_tiles.py) or the row kernel (no workgroup memory), chosen by ``_tiles``.
"""
from __future__ import annotations

import math

from ..autograd.tape import no_grad, record
from ..runtime.adapters import is_cpu_adapter
from ..runtime.device import groups_1d
from ..runtime.errors import AdapterLimitError, ShapeError
from ..runtime.kernels import Kernel
from ..tensor import Tensor, check_same_device, float16, float32
from . import attention_tiles, nnops
from .elementwise import cast, contiguous, copy_into, fill_
from .precision import autocast_dtype
from .shape import reshape

WG = 64  # row kernel: rows (queries, or keys in bwd_kv) per workgroup, one per invocation
MAX_HEAD_DIM = 128
# llvmpipe's 65,535-iteration loop cap (the row kernel's block loops count about one per
# streamed row; its vec4 loops unroll up to d 64) bounds CPU adapters' shapes.
CPU_MAX_HEAD_DIM = 64
CPU_MAX_ROWS = 60_000


def _kernel(dev, entry: str, d: int, dtype) -> Kernel:
    """The one-row-per-invocation kernel (shaders/flash_attention.wgsl, no workgroup memory,
    no barriers): adapters whose workgroup memory holds no FlashAttention-2 tile."""
    t = "f16" if dtype == float16 else "f32"
    return Kernel.of("flash_attention", entry, T=t, F16=int(t == "f16"), WG=WG, D=d, BK=32)


def _launch(entry, q, k, v, w1, w2, scale, causal, rows, o=None, do=None, lse=None, dsum=None,
            tiles=None):
    """One dispatch: the FlashAttention-2 kernel of role ``entry`` ('fwd', 'q', 'kv') with
    ``tiles``, or the row kernel's entry (fwd, bwd_q, bwd_kv) without."""
    BH, Tq, d = q.shape
    Tk = k.shape[1]
    dev = q.device
    if tiles is None:
        block = WG
        kern = _kernel(dev, attention_tiles.ENTRIES[entry], d, q.dtype)
    else:
        block = tiles[entry][0]
        v4 = all(t.offset % 4 == 0 for t in (q, k, v, o, do) if t is not None) and d % 4 == 0
        kern = attention_tiles.kernel(entry, tiles[entry], d, q.dtype == float16, v4)
    blocks = -(-rows // block)
    off = lambda t: t.offset if t is not None else 0
    bufs = [q._storage.buffer, k._storage.buffer, v._storage.buffer, w1._storage.buffer,
            w2._storage.buffer]
    bufs += [t._storage.buffer for t in (o, do, lse, dsum) if t is not None]
    dev.dispatch(kern, bufs,
                 [BH, Tq, Tk, q.offset, k.offset, v.offset, w1.offset, w2.offset, float(scale),
                  int(causal), blocks, off(o), off(do), off(lse), off(dsum)],
                 groups_1d(BH * blocks, 1))


# CPU adapters take the tiles from this head size and one query block up, else the row kernel
# (lavapipe, causal f+b: tiles at d 64 1.7x, 32 1.5x, 16 1.0x, 4 0.5x the row kernel's rate).
CPU_TILES_MIN_D = 32


def _tiles(dev, d: int, T: int):
    """Tiles per role, or None for the row kernel (no tile fits; CPU adapters below
    CPU_TILES_MIN_D or one query block). nnops.ROW_MODE forces the choice."""
    forced = nnops.ROW_MODE
    if forced == "thread":
        return None
    tiles = {r: attention_tiles.pick_tiles(dev, r, d) for r in ("fwd", "q", "kv")}
    if None in tiles.values():
        return None
    if forced is None and is_cpu_adapter(dev) and (d < CPU_TILES_MIN_D
                                                   or T < tiles["fwd"][0]):
        return None
    return tiles


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
    tiles = _tiles(q.device, d, max(Tq, k.shape[1]))
    dp = d if tiles else -(-d // 4) * 4
    o = Tensor.empty((BH, Tq, dp), q.device, float32)
    lse = Tensor.empty((BH, Tq), q.device, float32)
    if o.numel():
        _launch("fwd", _pad(q, dp), _pad(k, dp), _pad(v, dp), o, lse, scale, causal, Tq,
                tiles=tiles)
    return _unpad(o, d), lse


def attention_backward(q, k, v, o, lse, do, scale: float, causal: bool):
    """(dq, dk, dv) f32 given ``do``: dq per query block, then dk and dv per key block
    (FlashAttention-2's split: no atomics, deterministic)."""
    BH, Tq, d = q.shape
    Tk = k.shape[1]
    dev = q.device
    tiles = _tiles(dev, d, max(Tq, Tk))
    dp = d if tiles else -(-d // 4) * 4
    dq = Tensor.empty((BH, Tq, dp), dev, float32)
    dsum = Tensor.empty((BH, Tq), dev, float32)
    dk = Tensor.empty((BH, Tk, dp), dev, float32)
    dv = Tensor.empty((BH, Tk, dp), dev, float32)
    if dq.numel():
        q, k, v, o, do = (_pad(t, dp) for t in (q, k, v, o, do))
        _launch("q", q, k, v, dq, dsum, scale, causal, Tq, o, do, lse, tiles=tiles)
        _launch("kv", q, k, v, dk, dv, scale, causal, Tk, o, do, lse, dsum, tiles=tiles)
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


def fused_fits(dev, d: int, Tq: int, Tk: int) -> bool:
    """Whether the fused kernel takes this head size and these lengths on ``dev`` (callers
    with another way, the unfused composition, pick it when not)."""
    if is_cpu_adapter(dev):
        return d <= CPU_MAX_HEAD_DIM and max(Tq, Tk) <= CPU_MAX_ROWS
    return d <= MAX_HEAD_DIM


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
