"""matmul: 2-D, batched, broadcast batch dims (numpy rules), any operand strides."""
from __future__ import annotations

import math

from ..autograd.tape import record
from ..runtime.device import MAX_WG_PER_DIM
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..tensor import Tensor, check_same_device, float32
from .elementwise import cast, contiguous, unbroadcast
from .launch import broadcast_shapes
from .shape import expand, reshape, transpose

TILE = 64


def _batch_stride(t: Tensor, nb: int):
    """One stride that walks the first ``nb`` dims of ``t`` in order, or None."""
    dims = [(s, st) for s, st in zip(t.shape[:nb], t.strides[:nb]) if s != 1]
    if not dims:
        return 0
    for (s0, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != st1 * s1:
            return None
    return dims[-1][1]


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("matmul needs two tensors")
    check_same_device(a, b, op="matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: 0-d operand (shapes {a.shape} and {b.shape}); use * instead")
    a = a if a.dtype == float32 else cast(a, float32)
    b = b if b.dtype == float32 else cast(b, float32)
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    M, K = a2.shape[-2:]
    K2, N = b2.shape[-2:]
    if K != K2:
        raise ShapeError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} ({K} != {K2})")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    nb = len(batch)
    ae = expand(a2, batch + (M, K)) if a2.shape[:-2] != batch else a2
    be = expand(b2, batch + (K, N)) if b2.shape[:-2] != batch else b2
    sa, sb = _batch_stride(ae, nb), _batch_stride(be, nb)
    if sa is None:
        ae, sa = contiguous(ae), M * K
    if sb is None:
        be, sb = contiguous(be), K * N
    nbatch = math.prod(batch)
    out = Tensor.empty(batch + (M, N), a.device, float32)
    if out.numel:
        if K == 0:
            from .elementwise import fill_
            fill_(out, 0.0)
        else:
            _launch(ae, be, out, M, N, K, sa, sb, nbatch)
    def bw(g):
        g2 = reshape(g, batch + (M, N))
        ga = gb = None
        if a.requires_grad:
            ga = unbroadcast(matmul(g2, transpose(b2, -1, -2)), a2.shape)
            ga = reshape(ga, a.shape)
        if b.requires_grad:
            gb = unbroadcast(matmul(transpose(a2, -1, -2), g2), b2.shape)
            gb = reshape(gb, b.shape)
        return ga, gb
    record("matmul", out, [a, b], bw, saved=[a, b])
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return reshape(out, out.shape[:-2] + (N,))
    if b.ndim == 1:
        return reshape(out, out.shape[:-1])
    return out


def _launch(a, b, out, M, N, K, sa, sb, nbatch):
    ar, ac = a.strides[-2], a.strides[-1]
    br, bc = b.strides[-2], b.strides[-1]
    k = Kernel.of("matmul")
    bufs = [a._storage.buffer, b._storage.buffer, out._storage.buffer]
    gx, gy = -(-N // TILE), -(-M // TILE)
    if gx > MAX_WG_PER_DIM or gy > MAX_WG_PER_DIM:
        raise ShapeError(f"matmul output {M}x{N} is too large for one dispatch")
    for z0 in range(0, nbatch, MAX_WG_PER_DIM):
        gz = min(MAX_WG_PER_DIM, nbatch - z0)
        a.device.dispatch(k, bufs, [M, N, K, a.offset, sa, ar, ac, b.offset, sb, br, bc,
                                    out.offset, z0], (gx, gy, gz))
