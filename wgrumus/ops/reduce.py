"""Reductions over any axes: the reduced axes are moved last and made contiguous (a view plus
at most one copy), then one workgroup reduces each row. Backward rules broadcast back."""
from __future__ import annotations

import builtins
import math
from collections import namedtuple

import numpy as np

from ..autograd.tape import record
from ..runtime.device import groups_1d
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..tensor import DTYPES, Tensor, float16, float32, int32
from .dims import keep, pick
from .elementwise import contiguous, map_op, saved_output
from .shape import permute, reshape

_OPS = {  # name: (init, combine)
    "sum": (0.0, "x + y"),
    "max": (float("-inf"), "max(x, y)"),
    "min": (float("inf"), "min(x, y)"),
}


def _axes(x: Tensor, axis) -> tuple:
    nd = x.ndim
    if axis is None:
        return tuple(range(nd))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not -nd <= a < builtins.max(nd, 1):
            raise ShapeError(f"axis {a} is out of range for a tensor with {nd} dimensions")
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


def _f16(dtype) -> dict:
    return {"F16": "1"} if dtype == float16 else {}


def _launch(kernel, xt, R, L, out, scale=1.0, init=0.0):
    if R == 0:
        return
    xt.device.dispatch(kernel, [xt._storage.buffer, out._storage.buffer],
                       [R, L, xt.offset, float(scale), out.offset, float(init)],
                       groups_1d(R, 1))


def _reduce(name: str, x: Tensor, axis, keepdims: bool, mean=False) -> Tensor:
    axes = _axes(x, axis)
    with_grad = x
    if x.dtype != float32 and name == "sum" or mean:
        from .elementwise import cast
        x = cast(x, float32)
    xt, R, L, kept, kd = _rows(x, axes)
    if L == 0 and name in ("max", "min"):
        raise ShapeError(f"{name} of an empty axis (shape {x.shape}, axes {axes}) has no identity")
    out_dtype = x.dtype if name != "sum" else float32  # int max/min stay int (numpy)
    out = Tensor.empty(kd if keepdims else kept, x.device, out_dtype)
    init, comb = _OPS[name]
    k = Kernel.of("reduce", T=DTYPES[xt.dtype], TO=DTYPES[out_dtype], INIT="pf(5u)",
                  COMBINE=comb, GT=">", **_f16(xt.dtype))
    scale = (1.0 / L if L else float("nan")) if mean else 1.0
    _launch(k, xt, R, L, out, scale, init)
    in_shape = x.shape

    if name == "sum":
        def bw(g):
            gk = reshape(g, kd)
            return (map_op("a * pf(48u)", [gk], shape=in_shape, scalars=[scale]),)
        record("mean" if mean else "sum", out, [with_grad], bw)
    else:
        o = saved_output(out)

        def bw(g):
            # gradient to every position equal to the extreme, split evenly between ties
            ok = reshape(o, kd)
            mask = map_op("select(0.0, 1.0, a == b)", [x, ok])
            cnt = _reduce("sum", mask, axes, True)
            return (map_op("a * b / c", [mask, reshape(g, kd), cnt]),)
        record(name, out, [x], bw, saved=[x])
    return out


def sum(x: Tensor, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A001
        keepdims=None) -> Tensor:
    return _reduce("sum", x, pick(dim, axis), keep(keepdim, keepdims))


def mean(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _reduce("sum", x, pick(dim, axis), keep(keepdim, keepdims), mean=True)


MaxMin = namedtuple("MaxMin", ["values", "indices"])  # torch.return_types.max / min


def _extreme(name, x: Tensor, dim, keepdim, axis, keepdims):
    """PyTorch's max/min: no dim -> the value; an int ``dim`` -> (values, indices); numpy's
    ``axis=`` (or a tuple of dims, like torch.amax) -> the values only; a tensor -> elementwise
    maximum/minimum, as torch.max(a, b)."""
    if isinstance(dim, Tensor):
        from .elementwise import maximum, minimum
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
    k = Kernel.of("reduce", "arg", T=DTYPES[xt.dtype], TO="i32", COMBINE="x", GT=gt,
                  INIT="0.0", **_f16(xt.dtype))
    _launch(k, xt, R, L, out)
    return out


def argmax(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _arg(x, pick(dim, axis), keep(keepdim, keepdims), ">")


def argmin(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _arg(x, pick(dim, axis), keep(keepdim, keepdims), "<")


def var(x: Tensor, dim=None, keepdim: bool = False, ddof: int = 0, *, correction=None,
        axis=None, keepdims=None) -> Tensor:
    """numpy's var: ddof=0 by default (PyTorch's default is correction=1, the unbiased
    estimate; pass it as ``correction=1`` or ``ddof=1``)."""
    from .elementwise import mul, square, sub
    axes, keepdims = _axes(x, pick(dim, axis)), keep(keepdim, keepdims)
    ddof = ddof if correction is None else correction
    denom = math.prod(x.shape[a] for a in axes) - ddof
    s = sum(square(sub(x, mean(x, axes, keepdim=True))), axes, keepdims)
    return mul(s, 1.0 / denom if denom > 0 else float("nan"))


def std(x: Tensor, dim=None, keepdim: bool = False, ddof: int = 0, *, correction=None,
        axis=None, keepdims=None) -> Tensor:
    from .elementwise import sqrt
    return sqrt(var(x, dim, keepdim, ddof, correction=correction, axis=axis, keepdims=keepdims))
