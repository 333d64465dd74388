"""Reductions built on the reduce ops: amax / amin, logsumexp, vector and matrix norms (the
2-norm's zero-safe gradient is ops' two_norm), count_nonzero, nansum / nanmean."""
from __future__ import annotations

import math

from ..ops.creation import full
from ..ops.elementwise import _f32, abs_, add, cast, div, exp, log, map_op, pow_, sub
from ..ops.reduce import _axes
from ..ops.reduce import max as _max
from ..ops.reduce import min as _min
from ..ops.reduce import sum as _sum
from ..ops.reductions import two_norm
from ..ops.shape import reshape
from ..runtime.errors import ShapeError
from ..tensor import Tensor, float32, int32


def amax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """The largest value over ``dim`` (a tuple allowed); the gradient is split between ties."""
    return _max(x, axis=() if dim == () else dim, keepdims=keepdim) if dim is not None \
        else _max(x, axis=None, keepdims=keepdim)


def amin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _min(x, axis=() if dim == () else dim, keepdims=keepdim) if dim is not None \
        else _min(x, axis=None, keepdims=keepdim)


def logsumexp(x: Tensor, dim, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over ``dim``, shifted by the (detached) max; inf / -inf rows exact."""
    x = _f32(x)
    axes = _axes(x, dim)
    if not axes and x.ndim:
        return x
    m = map_op("select(a, 0.0, abs(a) == bitcast<f32>(0x7f800000u))",
               [_max(x.detach(), axis=axes, keepdims=True)]) if x.numel() else None
    if m is None:
        shape = tuple(1 if a in axes else s for a, s in enumerate(x.shape)) if keepdim else \
            tuple(s for a, s in enumerate(x.shape) if a not in axes)
        return full(shape, float("-inf"), x.device, float32)
    s = log(_sum(exp(sub(x, m)), axes, True))
    out = add(s, m)
    return out if keepdim else reshape(out, tuple(d for a, d in enumerate(x.shape)
                                                  if a not in axes))


def vector_norm(x: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The p-norm of the entries over ``dim`` (None: all): 2, 1, inf, -inf, 0 (non-zero
    count) or any other p."""
    if dtype is not None:
        x = cast(x, dtype)
    x = _f32(x)
    axes = _axes(x, dim)
    if ord in (2, 2.0, "fro"):
        return two_norm(x, axes, keepdim)
    if ord == 1:
        return _sum(abs_(x), axes, keepdim)
    if ord == math.inf:
        return _max(abs_(x), axis=axes, keepdims=keepdim)
    if ord == -math.inf:
        return _min(abs_(x), axis=axes, keepdims=keepdim)
    if ord == 0:
        return _sum(map_op("select(0.0, 1.0, a != 0.0)", [x]), axes, keepdim)
    p = float(ord)
    return pow_(_sum(pow_(abs_(x), p), axes, keepdim), 1.0 / p)


def norm(x: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """torch.norm / Tensor.norm: a vector p-norm over ``dim`` ('fro': 2). Matrix norms other
    than Frobenius ('nuc', spectral) need an SVD, which wgrumus does not have."""
    if p == "nuc" or (isinstance(dim, (tuple, list)) and len(dim) == 2 and p not in
                      ("fro", 2, 2.0, 1, math.inf, -math.inf) and not isinstance(p, str)):
        raise NotImplementedError(f"norm p={p!r} over a matrix needs an SVD, which wgrumus does "
                                  f"not have; use p='fro' or a vector norm")
    return vector_norm(x, 2 if p == "fro" else p, dim, keepdim, dtype=dtype)


def matrix_norm(x: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False) -> Tensor:
    """'fro', or 1 / inf (the largest column / row sum of |x|); 'nuc' and 2 need an SVD."""
    if len(dim) != 2:
        raise ShapeError(f"matrix_norm: dim must name two dims, got {dim}")
    if ord == "fro":
        return two_norm(_f32(x), _axes(x, dim), keepdim)
    if ord in (1, -1, math.inf, -math.inf):
        rows, cols = (dim[0], dim[1]) if ord in (1, -1) else (dim[1], dim[0])
        s = _sum(abs_(_f32(x)), rows, True)
        r = (_max if ord > 0 else _min)(s, axis=cols, keepdims=True)
        if keepdim:
            return r
        axes = _axes(x, dim)
        return reshape(r, tuple(d for a, d in enumerate(x.shape) if a not in axes))
    raise NotImplementedError(f"matrix_norm ord={ord!r} needs an SVD, which wgrumus does not "
                              f"have; use 'fro', 1 or inf")


def linalg_norm(x: Tensor, ord=None, dim=None, keepdim: bool = False) -> Tensor:
    """torch.linalg.norm: no ord -> the 2-norm of the flattened entries (Frobenius for a
    matrix); a vector ord over one dim, a matrix ord over two."""
    if ord is None:
        return vector_norm(x, 2, dim, keepdim)
    two = dim is not None and not isinstance(dim, int) and len(dim) == 2 or \
        dim is None and x.ndim == 2
    if two:
        return matrix_norm(x, ord, dim if dim is not None else (-2, -1), keepdim)
    return vector_norm(x, ord, dim, keepdim)


def count_nonzero(x: Tensor, dim=None) -> Tensor:
    """int32 counts of the non-zero entries over ``dim``."""
    return _sum(map_op("select(0, 1, a != 0)", [x], dtype=int32), dim)


def nansum(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _sum(map_op("select(a, 0.0, isnan_(a))", [_f32(x)]) if x.dtype != int32 else x,
                dim, keepdim)


def nanmean(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    x = _f32(x)
    n = _sum(map_op("select(1.0, 0.0, isnan_(a))", [x]), dim, keepdim)
    return div(nansum(x, dim, keepdim), n)


__all__ = ["amax", "amin", "count_nonzero", "linalg_norm", "logsumexp", "matrix_norm",
           "nanmean", "nansum", "norm", "vector_norm"]
