"""matmul: 2-D, batched, broadcast batch dims (numpy rules), any operand strides. The shape
rule, the forward call and the backward rule; the kernels are kernels/matmul*.py."""
from __future__ import annotations

import math

from ..autograd.tape import record
from ..kernels import matmul as matmul_kernels
from ..kernels.map import broadcast_shapes, run_map
from ..kernels.matmul_gpu import CAUSAL_PARTS
from ..runtime.errors import ShapeError
from ..tensor import Tensor, check_same_device, float16, float32
from .elementwise import cast, contiguous, fill_, unbroadcast
from .precision import autocast_dtype, in_forward_precision
from .shape import expand, reshape, transpose


def _batch_stride(t: Tensor, nb: int):
    """One stride that walks the first ``nb`` dims of ``t`` in order, or None."""
    dims = [(s, st) for s, st in zip(t.shape[:nb], t.strides[:nb]) if s != 1]
    if not dims:
        return 0
    for (_, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != st1 * s1:
            return None
    return dims[-1][1]


def _two_level(ae: Tensor, be: Tensor, nb: int):
    """(A outer stride, B outer stride, inner batches, A inner stride, B inner stride) where
    each operand's batch dims but the last collapse into one stride (the kernels' two-level
    batch: a [B, H, T, d] head view of a packed [B, T, 3, H, d] projection needs no copy), or
    None."""
    if nb < 2:
        return None
    inner = ae.shape[nb - 1]
    outer = [_batch_stride(t, nb - 1) for t in (ae, be)]
    if None in outer:
        return None
    ins = [t.strides[nb - 1] if inner != 1 else 0 for t in (ae, be)]
    return outer[0], outer[1], inner, ins[0], ins[1]


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b by numpy's rules: a 1-D operand is promoted to a matrix (its dim dropped from the
    result), batch dims broadcast; float16 @ float16 stays in f16 storage (f32 accumulation)
    where the adapter has shader-f16, every other mix computes in float32."""
    a, b = _operands(a, b)
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    M, K = a2.shape[-2:]
    K2, N = b2.shape[-2:]
    if K != K2:
        raise ShapeError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} ({K} != {K2})")
    if a2.ndim > 2 and b2.ndim == 2 and a2.is_contiguous():
        # A batched contiguous operand times a 2-D one is one 2-D product: one kernel over all
        # rows instead of a batch of (possibly tiny) products.
        rows = math.prod(a2.shape[:-1])
        out = reshape(matmul(reshape(a2, (rows, K)), b2), a2.shape[:-1] + (N,))
        return reshape(out, out.shape[:-1]) if b.ndim == 1 else out
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    out = _product(a2, b2, batch, M, N, K)

    def bw(g):
        g2 = reshape(g, batch + (M, N))
        ga = gb = None
        if a.requires_grad:
            ga = reshape(unbroadcast(matmul(g2, transpose(b2, -1, -2)), a2.shape), a.shape)
        if b.requires_grad:
            gb = reshape(unbroadcast(matmul(transpose(a2, -1, -2), g2), b2.shape), b.shape)
        return ga, gb
    record("matmul", out, [a, b], in_forward_precision(bw), saved=[a, b])
    if a.ndim == 1:
        return reshape(out, out.shape[:-2] + out.shape[-1:] if b.ndim != 1 else ())
    return reshape(out, out.shape[:-1]) if b.ndim == 1 else out


def _operands(a: Tensor, b: Tensor) -> tuple:
    """(a, b) checked and in the product's storage dtype."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("matmul needs two tensors")
    check_same_device(a, b, op="matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: 0-d operand (shapes {a.shape} and {b.shape}); use * instead")
    dt = float16 if (a.dtype == b.dtype == float16
                     and "shader-f16" in a.device.features) else float32
    return (a if a.dtype == dt else cast(a, dt)), (b if b.dtype == dt else cast(b, dt))


def _product(a2: Tensor, b2: Tensor, batch: tuple, M: int, N: int, K: int) -> Tensor:
    """a2 @ b2 over the broadcast ``batch`` (no autograd): operands whose batch dims walk one
    stride (or two levels of them) are read in place, others copied contiguous first."""
    nb = len(batch)
    ae = expand(a2, batch + (M, K)) if a2.shape[:-2] != batch else a2
    be = expand(b2, batch + (K, N)) if b2.shape[:-2] != batch else b2
    sa, sb = _batch_stride(ae, nb), _batch_stride(be, nb)
    two = _two_level(ae, be, nb) if sa is None or sb is None else None
    if two is not None:
        sa, sb = two[:2]
    if sa is None:
        ae, sa = contiguous(ae), M * K
    if sb is None:
        be, sb = contiguous(be), K * N
    out = Tensor.empty(batch + (M, N), ae.device, ae.dtype)
    if out.numel() and K == 0:
        fill_(out, 0.0)
    elif out.numel():
        # autocast: the kernel rounds the f32 operands to f16 as it reads them and stores its
        # f32 accumulators (ops/precision.py), no cast passes
        r16 = ae.dtype == float32 and autocast_dtype() == float16
        matmul_kernels.launch(ae, be, out, M, N, K, sa, sb, math.prod(batch), r16=r16,
                              inner=two[2:] if two else (1, 0, 0))
    return out


def matmul_into(a: Tensor, b: Tensor, out: Tensor, part: str | None = None) -> Tensor:
    """out = a @ b (no autograd) for float32 [B, H, M, K] @ [B, H, K, N] into a float32
    [B, H, M, N] view whose rows are contiguous, in one launch (two-level batches, strided C):
    attention reads its heads inside the packed [B, T, 3, H, d] projection and stores them
    merged into [B, T, H, d], with no copy. ``part``: only what a causal attention reads, which
    the GPU kernel then skips: "out" (T x T scores: outputs above the diagonal are left
    unwritten), "a_lower" / "a_upper" (a is T x T and zero above / below its diagonal: each row
    tile's K range stops / starts there); CPU kernels compute the whole product."""
    B, H, M, K = a.shape
    N = b.shape[-1]
    if (b.shape != (B, H, K, N) or out.shape != (B, H, M, N) or out.strides[-1] != 1
            or out.dtype != float32):
        raise ShapeError(f"matmul_into: [B, H, M, K] @ [B, H, K, N] into a row-contiguous "
                         f"[B, H, M, N] f32 view, got {a.shape} @ {b.shape} into {out.shape} "
                         f"with strides {out.strides}")
    if part is not None and (part not in CAUSAL_PARTS or M != (N if part == "out" else K)):
        raise ShapeError(f"matmul_into: part {part!r} needs T x T scores (out) or a T x T a, "
                         f"got {a.shape} @ {b.shape}")
    check_same_device(a, b, out, op="matmul_into")
    if not out.numel():
        return out
    if K == 0:  # an empty sum
        return fill_(out, 0.0)
    a, b = (t if t.dtype == float32 else cast(t, float32) for t in (a, b))
    two = _two_level(a, b, 2)  # (one outer dim always has a stride)
    cst = (out.strides[0] if B > 1 else 0, out.strides[1] if H > 1 else 0, out.strides[2])
    matmul_kernels.launch(a, b, out, M, N, K, two[0], two[1], B * H, inner=two[2:], cst=cst,
                          r16=autocast_dtype() == float16, causal=CAUSAL_PARTS.get(part, 0))
    return out



def linear_2d(x: Tensor, wt: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
              activation: str | None = None, r16: bool = False, pre: Tensor | None = None
              ) -> Tensor:
    """act(x @ wt + bias + residual) for float32 2-D x [M, K] and wt [K, N] (any strides), a
    contiguous bias [N] and residual [M, N], in one kernel. ``activation`` is a WGSL template
    of {z} (e.g. "max({z}, 0.0)"); ``r16``: the product of x and wt rounded to f16 (autocast).
    ``pre`` (an activation, no residual): a contiguous float32 [M, N] tensor that also
    receives the activation's argument x @ wt + bias, for its backward.
    No autograd: fused.linear records the node."""
    M, K = x.shape
    N = wt.shape[1]
    out = Tensor.empty((M, N), x.device, float32)
    if not out.numel():
        return out
    if K == 0:  # a zero product: only the epilogue is left, in a map kernel
        ins = [t for t in (bias, residual) if t is not None]
        z = " + ".join("ab"[:len(ins)]) or "0.0"
        if pre is not None:
            run_map(z, pre, ins)
        return run_map(activation.format(z=z) if activation else z, out, ins)
    matmul_kernels.launch(x, wt, out, M, N, K, 0, 0, 1, bias=bias, residual=residual,
                          activation=activation, r16=r16, pre=pre)
    return out

