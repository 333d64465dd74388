"""Reductions over any axes: reduced axes moved last (at most one copy), each row reduced by one
invocation when short, else in chunks and passes so no shader loop runs long. int32 reduces in
integers; NaN propagates through max / min / argmax as in PyTorch."""
from __future__ import annotations

import builtins
import math
from collections import namedtuple

import numpy as np

from ..autograd.tape import record
from ..kernels import reduce as reduce_kernels
from ..runtime.device import groups_1d
from ..runtime.errors import DimError, ShapeError
from ..tensor import Tensor, float16, float32, int32
from .dims import keep, pick
from .elementwise import (
    cast,
    contiguous,
    div,
    fill_,
    map_op,
    maximum,
    minimum,
    saved_output,
    sqrt,
    square,
    sub,
)
from .shape import permute, reshape

# A float sum over at most this many leading rows of a contiguous tensor (the gradient of a
# broadcast over the batch) is a column sum in place (at most 8 steps of 8 loads a column):
# one dispatch instead of a transposing copy and a row reduction (lavapipe, quick GPT's
# position embedding: 119 -> 57 us, one thread).
LEADING_ROWS_MAX = 64


def _axes(x: Tensor, axis) -> tuple:
    nd = x.ndim
    if axis is None:
        return tuple(range(nd))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not -builtins.max(nd, 1) <= a < builtins.max(nd, 1):
            raise DimError(f"axis {a} is out of range for a tensor with {nd} dimensions")
        out.append(int(a) % builtins.max(nd, 1))
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {axis}")
    return tuple(sorted(out)) if nd else ()


def _rows(x: Tensor, axes):
    """x with ``axes`` moved last, contiguous, as (tensor, R, L, kept shape, keepdims shape)."""
    keep = [a for a in range(x.ndim) if a not in axes]
    order = keep + list(axes)
    xt = contiguous(permute(x, order) if order != sorted(order) else x)
    kept = tuple(x.shape[a] for a in keep)
    L = math.prod(x.shape[a] for a in axes)
    kd = tuple(1 if a in axes else s for a, s in enumerate(x.shape))
    return xt, math.prod(kept), L, kept, kd


def _reduce(name: str, x: Tensor, axis, keepdims: bool, mean=False) -> Tensor:
    axes = _axes(x, axis)
    with_grad = x
    if x.dtype == float16 and name == "sum" or mean:
        x = cast(x, float32)
    L = math.prod(x.shape[a] for a in axes)
    scale = (1.0 / L if L else float("nan")) if mean else 1.0
    n = len(axes)
    kept = x.shape[n:]
    leading = (name == "sum" and scale == 1.0 and x.dtype == float32 and x.is_contiguous()
               and 0 < n < x.ndim and axes == tuple(range(n)) and 0 < L <= LEADING_ROWS_MAX
               and groups_1d(math.prod(kept), 64)[1] == 1)  # (colsum's grid y counts blocks)
    if leading:  # a column sum reads x as [L, R] where it is
        xt, R, kd = x, math.prod(kept), (1,) * n + kept
    else:
        xt, R, L, kept, kd = _rows(x, axes)
    if L == 0 and name in ("max", "min"):
        raise ShapeError(f"{name} of an empty axis (shape {x.shape}, axes {axes}) has no identity")
    # int32 stays int32 (exact, wrapping on overflow); float16 sums accumulate in float32
    out_dtype = float32 if x.dtype == float16 and name == "sum" else x.dtype
    out = Tensor.empty(kd if keepdims else kept, x.device, out_dtype)
    if R and L and leading:
        reduce_kernels.leading_sum(xt, R, L, out)
    elif R and L:
        reduce_kernels.rows(name, xt, R, L, out, scale)
    elif R:  # sum / mean of empty rows
        fill_(out, 0 if out_dtype == int32 else 0.0 * scale)
    in_shape = x.shape

    if name == "sum":
        def bw(g):
            gk = reshape(g, kd)
            return (map_op("a * scale", [gk], shape=in_shape, scalars={"scale": scale}),)
        record("mean" if mean else "sum", out, [with_grad], bw)
    else:
        o = saved_output(out)

        def bw(g):
            # gradient to every position equal to the extreme (NaN counts as equal to NaN),
            # split evenly between ties
            ok = reshape(o, kd)
            mask = map_op("select(0.0, 1.0, a == b || (isnan_(a) && isnan_(b)))", [x, ok])
            cnt = _reduce("sum", mask, axes, True)
            return (map_op("a * b / c", [mask, reshape(g, kd), cnt]),)
        record(name, out, [x], bw, saved=[x])
    return out


def sum(x: Tensor, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A001
        keepdims=None) -> Tensor:
    """Sum over ``dim``; int32 tensors sum exactly in int32 (wrapping past 2^31, where
    PyTorch would widen to int64)."""
    return _reduce("sum", x, pick(dim, axis), keep(keepdim, keepdims))


def mean(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _reduce("sum", x, pick(dim, axis), keep(keepdim, keepdims), mean=True)


MaxMin = namedtuple("MaxMin", ["values", "indices"])  # torch.return_types.max / min


def _extreme(name, x: Tensor, dim, keepdim, axis, keepdims):
    """PyTorch's max/min: an int ``dim`` gives (values, indices), ``axis=`` or a tuple the
    values, a tensor the elementwise maximum/minimum."""
    if isinstance(dim, Tensor):
        return (maximum if name == "max" else minimum)(x, dim)
    kd = keep(keepdim, keepdims)
    values = _reduce(name, x, pick(dim, axis), kd)
    if isinstance(dim, (int, np.integer)):
        return MaxMin(values, _arg(x, dim, kd, ">" if name == "max" else "<"))
    return values


def max(x: Tensor, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A001
        keepdims=None):
    return _extreme("max", x, dim, keepdim, axis, keepdims)


def min(x: Tensor, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A001
        keepdims=None):
    return _extreme("min", x, dim, keepdim, axis, keepdims)


def _arg(x: Tensor, axis, keepdims, gt) -> Tensor:
    if axis is not None and not isinstance(axis, (int, np.integer)):
        raise ShapeError(f"argmax/argmin take one axis or None (flattened), got {axis!r}")
    flat_kd = None
    if axis is None:  # flattened: keepdims keeps every axis, as 1
        flat_kd = (1,) * x.ndim
        x = reshape(x, (-1,))
        axis = 0
    axes = _axes(x, axis)
    xt, R, L, kept, kd = _rows(x, axes)
    if L == 0:
        raise ShapeError(f"argmax/argmin of an empty axis (shape {x.shape})")
    if flat_kd is not None:
        kd = flat_kd
    out = Tensor.empty(kd if keepdims else kept, x.device, int32)
    if R:
        reduce_kernels.arg_rows(xt, R, L, out, gt)
    return out


def argmax(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _arg(x, pick(dim, axis), keep(keepdim, keepdims), ">")


def argmin(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _arg(x, pick(dim, axis), keep(keepdim, keepdims), "<")


def var(x: Tensor, dim=None, keepdim: bool = False, ddof: int = 0, *, correction=None,
        unbiased=None, axis=None, keepdims=None) -> Tensor:
    """numpy's var: ddof=0 by default (PyTorch's default is correction=1, the unbiased
    estimate; pass it as ``correction=1``, ``unbiased=True`` or ``ddof=1``). A correction of
    at least the count divides by zero (inf, or nan for a constant row), as in PyTorch."""
    axes, keepdims = _axes(x, pick(dim, axis)), keep(keepdim, keepdims)
    if unbiased is not None:
        if correction is not None:
            raise TypeError("var/std: give correction= or unbiased=, not both")
        correction = int(bool(unbiased))
    ddof = ddof if correction is None else correction
    denom = builtins.max(math.prod(x.shape[a] for a in axes) - ddof, 0)
    s = sum(square(sub(x, mean(x, axes, keepdim=True))), axes, keepdims)
    return div(s, float(denom))


def std(x: Tensor, dim=None, keepdim: bool = False, ddof: int = 0, *, correction=None,
        unbiased=None, axis=None, keepdims=None) -> Tensor:
    return sqrt(var(x, dim, keepdim, ddof, correction=correction, unbiased=unbiased, axis=axis,
                    keepdims=keepdims))
