"""Reductions over any axes: reduced axes moved last (at most one copy), each row reduced by one
invocation when short, else in chunks and passes so no shader loop runs long. int32 reduces in
integers; NaN propagates through max / min / argmax as in PyTorch."""
from __future__ import annotations

import builtins
import math
from collections import namedtuple

import numpy as np

from ..autograd.tape import record
from ..kernels.rows import row_mode
from ..runtime.device import groups_1d
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..tensor import DTYPES, Tensor, float16, float32, int32
from .dims import keep, pick
from .elementwise import (
    cast,
    contiguous,
    fill_,
    map_op,
    maximum,
    minimum,
    mul,
    saved_output,
    sqrt,
    square,
    sub,
)
from .shape import permute, reshape

# Rows up to this length take one invocation each (no barriers); longer ones a workgroup per
# CHUNK. CPU adapters, where barriers are expensive, take longer rows per invocation.
SHORT_ROW = 64
SHORT_ROW_CPU = 4096
# Elements per workgroup: 512 iterations per invocation, far below llvmpipe's 65,535 cut-off.
CHUNK = 256 * 512
# A float sum over at most this many leading rows of a contiguous tensor (the gradient of a
# broadcast over the batch) is a column sum in place (at most 8 steps of 8 loads a column):
# one dispatch instead of a transposing copy and a row reduction (lavapipe, quick GPT's
# position embedding: 119 -> 57 us, one thread).
LEADING_ROWS_MAX = 64


def _isnan(dtype) -> str:
    return "false" if dtype == int32 else "isnan_(x)"


def _ops(name: str, dtype) -> tuple:
    """(init, COMBINE) in ``dtype``'s arithmetic (NaN kept through max/min: WGSL may drop it)."""
    if dtype == int32:
        return {"sum": (0, "x + y"), "max": (-2 ** 31, "max(x, y)"),
                "min": (2 ** 31 - 1, "min(x, y)")}[name]
    nan = "select({0}, x + y, isnan_a(x) || isnan_a(y))"
    return {"sum": (0.0, "x + y"), "max": (float("-inf"), nan.format("max(x, y)")),
            "min": (float("inf"), nan.format("min(x, y)"))}[name]


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


def _kernel(entry: str, dtype, out_dtype, comb: str, gt: str = ">",
            fin: str = "{TO}(v)") -> Kernel:
    acc = "i32" if dtype == int32 else "f32"
    defines = {"F16": "1"} if dtype == float16 else {}
    return Kernel.of("reduce", entry, T=DTYPES[dtype], A=acc, TO=DTYPES[out_dtype],
                     INIT="pi(5u)" if acc == "i32" else "pf(5u)", COMBINE=comb, GT=gt,
                     FIN=fin.format(TO=DTYPES[out_dtype]), ISNAN=_isnan(dtype), **defines)


def _short_row(dev) -> int:
    return SHORT_ROW_CPU if row_mode(dev) == "thread" else SHORT_ROW


def _row_reduce(name: str, xt: Tensor, R: int, L: int, out: Tensor, scale: float) -> None:
    """out[r] = reduction of row r of contiguous [R, L] ``xt``, in passes of bounded loops."""
    dev = xt.device
    init, comb = _ops(name, xt.dtype)
    scaled = xt.dtype != int32 and scale != 1.0
    fin = "{TO}(v * pf(3u))" if scaled else "{TO}(v)"
    short = _short_row(dev)
    while True:
        if L <= short:
            k = _kernel("rows", xt.dtype, out.dtype, comb, fin=fin)
            dev.dispatch(k, [xt.buffer, out.buffer],
                         [R, L, xt.offset, float(scale), out.offset, init], groups_1d(R, 64))
            return
        nc = -(-L // CHUNK)
        dst = out if nc == 1 else Tensor.empty((R, nc), dev, out.dtype)
        k = _kernel("main", xt.dtype, dst.dtype, comb, fin=fin if nc == 1 else "{TO}(v)")
        dev.dispatch(k, [xt.buffer, dst.buffer],
                     [R * nc, L, xt.offset, float(scale), dst.offset, init, CHUNK, nc],
                     groups_1d(R * nc, 1))
        if nc == 1:
            return
        xt, L = dst, nc


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
        x.device.dispatch(Kernel.of("colsum"), [xt.buffer, out.buffer],
                          [R, L, xt.offset, out.offset], groups_1d(R, 64))
    elif R and L:
        _row_reduce(name, xt, R, L, out, scale)
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


def _arg_rows(xt: Tensor, R: int, L: int, out: Tensor, gt: str) -> None:
    """out[r] = index of row r's extreme (first NaN, else first of ties), in passes."""
    dev = xt.device
    init = _ops("max" if gt == ">" else "min", xt.dtype)[0]
    if L <= _short_row(dev):
        dev.dispatch(_kernel("arg_rows", xt.dtype, int32, "x", gt),
                     [xt.buffer, out.buffer],
                     [R, L, xt.offset, 1.0, out.offset, init], groups_1d(R, 64))
        return
    ix = None
    while True:
        nc = -(-L // CHUNK)
        dst = out if nc == 1 else Tensor.empty((R, nc), dev, int32)
        vals = Tensor.empty((R, nc), dev, xt.dtype)
        ixb, ixo = (ix.buffer, ix.offset) if ix is not None else (xt.buffer, 0)
        dev.dispatch(_kernel("arg", xt.dtype, int32, "x", gt),
                     [xt.buffer, dst.buffer, ixb, vals.buffer],
                     [R * nc, L, xt.offset, 1.0, dst.offset, init, CHUNK, nc,
                      int(ix is not None), ixo, vals.offset], groups_1d(R * nc, 1))
        if nc == 1:
            return
        xt, ix, L = vals, dst, nc


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
        _arg_rows(xt, R, L, out, gt)
    return out


def argmax(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _arg(x, pick(dim, axis), keep(keepdim, keepdims), ">")


def argmin(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    return _arg(x, pick(dim, axis), keep(keepdim, keepdims), "<")


def var(x: Tensor, dim=None, keepdim: bool = False, ddof: int = 0, *, correction=None,
        axis=None, keepdims=None) -> Tensor:
    """numpy's var: ddof=0 by default (PyTorch's default is correction=1, the unbiased
    estimate; pass it as ``correction=1`` or ``ddof=1``)."""
    axes, keepdims = _axes(x, pick(dim, axis)), keep(keepdim, keepdims)
    ddof = ddof if correction is None else correction
    denom = math.prod(x.shape[a] for a in axes) - ddof
    s = sum(square(sub(x, mean(x, axes, keepdim=True))), axes, keepdims)
    return mul(s, 1.0 / denom if denom > 0 else float("nan"))


def std(x: Tensor, dim=None, keepdim: bool = False, ddof: int = 0, *, correction=None,
        axis=None, keepdims=None) -> Tensor:
    return sqrt(var(x, dim, keepdim, ddof, correction=correction, axis=axis, keepdims=keepdims))
