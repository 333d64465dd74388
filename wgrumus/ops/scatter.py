"""scatter, scatter_add, scatter_reduce ('sum', 'prod', 'mean', 'amax', 'amin'), index_add,
index_copy, index_fill: torch's semantics through one gather-style kernel (shaders/scatter.wgsl:
each destination loops over its column of the index, so no atomics and the same result every
run; plain scatter keeps the last write). Device indices out of range raise at the next read."""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import needs_grad, record
from ..kernels import scatter as scatter_kernels
from ..kernels.map import run_map
from ..runtime.errors import ShapeError, WgrumusError
from ..tensor import Tensor, float32, int32, tensor
from .elementwise import cast, contiguous, copy_into, fill_, map_op
from .indexing import as_index, gather
from .shape import _index_view, _norm_axis, expand, reshape

REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _check(x: Tensor, d: int, idx: Tensor, src: Tensor | None, op: str):
    if idx.ndim != x.ndim and not (idx.ndim == 0 and x.ndim == 0):
        raise ShapeError(f"{op}: index must have as many dims as the input ({x.ndim}), got "
                         f"{idx.ndim}")
    for k in range(x.ndim):
        if k != d and idx.shape[k] > x.shape[k]:
            raise ShapeError(f"{op}: index shape {idx.shape} is larger than the input shape "
                             f"{x.shape} in dim {k}")
        if src is not None and idx.shape[k] > src.shape[k]:
            raise ShapeError(f"{op}: index shape {idx.shape} is larger than the source shape "
                             f"{src.shape} in dim {k}")


def _region(t: Tensor, shape: tuple, d: int, full_dim: bool) -> Tensor:
    """The leading ``shape`` corner of ``t`` (dim d whole when ``full_dim``), as a view."""
    idx = tuple(slice(None) if (k == d and full_dim) else slice(0, s) for k, s in enumerate(shape))
    return t._view(*_index_view(t, idx))


def _accumulate(reg: Tensor, d: int, idx: Tensor, src: Tensor, mode: str, include_self: bool,
                dev_index: bool):
    """(acc, cnt) over the contiguous region ``reg`` [outer, A, inner]."""
    dev = reg.device
    A, inner = reg.shape[d], math.prod(reg.shape[d + 1:])
    J = idx.shape[d]
    acc = Tensor.empty(reg.shape, dev, reg.dtype)
    cnt = Tensor.empty(reg.shape, dev, float32)
    if include_self:
        copy_into(acc, reg)
        fill_(cnt, 1.0)
    else:
        fill_(acc, 0)
        fill_(cnt, 0.0)
    scatter_kernels.accumulate(acc, cnt, src, idx, A, J, inner, mode, dev_index)
    return acc, cnt


def _scatter(x: Tensor, dim: int, index, src, mode: str, include_self: bool = True,
             op: str = "scatter") -> Tensor:
    d = _norm_axis(dim, x.ndim, "dim")
    dev_index = isinstance(index, Tensor)
    it = as_index(index, x, 2 ** 31 - 1, op, allow_negative=False) if not dev_index else \
        as_index(index, x, x.shape[d] if x.ndim else 1, op)
    if not dev_index:  # host indices: checked now against the dim's size
        a = np.asarray(index)
        if a.size and (a.min() < 0 or a.max() >= x.shape[d]):
            bad = a[(a < 0) | (a >= x.shape[d])].flat[0]
            raise IndexError(f"{op}: index {int(bad)} is out of range for dim {d} of size "
                             f"{x.shape[d]}")
    if not isinstance(src, Tensor):
        src_t = None
        value = src
    else:
        src_t = src if src.dtype == x.dtype else cast(src, x.dtype)
        value = None
    _check(x, d, it, src_t, op)
    if value is not None:  # a scalar: every index entry writes it
        v = tensor(np.asarray(value, dtype=x.dtype), device=x.device, dtype=x.dtype)
        src_t = expand(v, it.shape)
    shape = it.shape
    src_c = contiguous(_region(src_t, shape, d, False))
    reg_shape = tuple(x.shape[k] if k == d else s for k, s in enumerate(shape))
    out = Tensor.empty(x.shape, x.device, x.dtype)
    copy_into(out, x)
    reg = contiguous(_region(x, reg_shape, d, True))
    acc, cnt = _accumulate(reg, d, contiguous(it), src_c, mode, include_self, dev_index)
    if mode == "mean":
        fin = ("select(select(i32(floor(f32(a) / b)), c, b == 0.0), c, b == 0.0)"
               if x.dtype == int32 else "select(a / b, c, b == 0.0)")
    else:
        fin = "select(a, c, b == 0.0)"
    run_map(fin, _region(out, reg_shape, d, True), [acc, cnt, reg])
    if needs_grad(x, src_t if isinstance(src, Tensor) else None):
        _record(op, out, x, src if isinstance(src, Tensor) else None, d, it, shape, reg_shape,
                mode, include_self, cnt)
    return out


def _record(op, out, x, src, d, it, shape, reg_shape, mode, include_self, cnt):
    o = Tensor(out.storage, out.shape, out.strides, out.offset, out.dtype)

    def bw(g):
        g = contiguous(g)
        hit = Tensor.empty(x.shape, g.device, float32)  # 1 where some index wrote
        fill_(hit, 0.0)
        run_map("select(0.0, 1.0, a > 0.0)", _region(hit, reg_shape, d, True), [cnt])
        gx = gs = None
        if mode == "prod":
            raise WgrumusError(f"{op}: scatter_reduce('prod') has no gradient in wgrumus; use "
                               f"'sum' of logs or a loop of multiplications")
        if mode in ("replace", "sum"):
            keep_self = mode == "sum" and include_self
            gx = g if keep_self else map_op("select(a, 0.0, b != 0.0)", [g, hit])
            gs = gather(g, d, it)
        elif mode == "mean":
            n = Tensor.empty(x.shape, g.device, float32)
            fill_(n, 1.0)
            copy_into(_region(n, reg_shape, d, True), map_op("max(a, 1.0)", [cnt]))
            gn = map_op("a / b", [g, n])
            gx = gn if include_self else map_op("select(a, 0.0, b != 0.0)", [gn, hit])
            gs = gather(gn, d, it)
        else:  # amax / amin: shared evenly between every entry equal to the result
            pick = gather(o, d, it)
            srcr = contiguous(_region(src, shape, d, False))
            eq_s = map_op("select(0.0, 1.0, a == b || (isnan_(a) && isnan_(b)))", [srcr, pick])
            ties = _scatter(fill_(Tensor.empty(x.shape, g.device, float32), 0.0), d, it, eq_s,
                            "sum", True, op)
            eq_x = map_op("select(0.0, 1.0, (a == b || (isnan_(a) && isnan_(b))) && "
                          "(c == 0.0 || inc != 0))", [x, o, hit],
                          scalars={"inc": int(include_self)})
            total = map_op("a + b", [ties, eq_x])
            share = map_op("select(a / c, 0.0, c == 0.0)", [g, eq_x, total])
            gx = map_op("select(0.0, a * b, b != 0.0)", [share, eq_x])
            gs = map_op("a * b", [gather(map_op("select(a / b, 0.0, b == 0.0)", [g, total]), d,
                                         it), eq_s])
        return (gx if x.requires_grad else None,
                _pad_to(gs, src.shape, d) if src is not None and src.requires_grad else None)
    record(op, out, [x, src] if src is not None else [x], bw, saved=[x, it, cnt, o])


def _pad_to(g: Tensor, shape: tuple, d: int) -> Tensor:
    """``g`` (the index's shape) in the corner of zeros of ``shape`` (the source's)."""
    if tuple(g.shape) == tuple(shape):
        return g
    out = fill_(Tensor.empty(shape, g.device, float32), 0.0)
    copy_into(_region(out, g.shape, d, False), g)
    return out


def scatter(x: Tensor, dim: int, index, src=None, *, value=None, reduce=None) -> Tensor:
    """out = x with out[..., index[j], ...] = src[j] along ``dim`` (src a tensor or a number);
    ``reduce`` 'add' / 'multiply' as torch's legacy argument."""
    if (src is None) == (value is None):
        raise TypeError("scatter: give src (a tensor or number) or value=, one of them")
    src = value if src is None else src
    mode = {None: "replace", "add": "sum", "multiply": "prod"}.get(reduce)
    if mode is None:
        raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
    return _scatter(x, dim, index, src, mode, mode != "replace", "scatter")


def scatter_add(x: Tensor, dim: int, index, src: Tensor) -> Tensor:
    return _scatter(x, dim, index, src, "sum", True, "scatter_add")


def scatter_reduce(x: Tensor, dim: int, index, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    if reduce not in REDUCES:
        raise ValueError(f"scatter_reduce: reduce must be one of {REDUCES}, got {reduce!r}")
    return _scatter(x, dim, index, src, reduce, include_self, "scatter_reduce")


def _index_as_scatter(x: Tensor, dim: int, index, like_shape: tuple) -> tuple:
    """A 1-D index along ``dim`` expanded to ``like_shape`` (what scatter takes)."""
    d = _norm_axis(dim, x.ndim, "dim")
    it = as_index(index, x, x.shape[d] if x.ndim else 1, "index_add")
    if it.ndim != 1:
        raise ShapeError(f"index ops take a 1-D index, got shape {it.shape}")
    view = (1,) * d + (it.shape[0],) + (1,) * (x.ndim - d - 1)
    return d, contiguous(expand(reshape(it, view), like_shape))


def index_add(x: Tensor, dim: int, index, source: Tensor, *, alpha=1) -> Tensor:
    """x with source's slices added at ``index`` along ``dim`` (repeats add up)."""
    d, it = _index_as_scatter(x, dim, index, source.shape)
    if source.shape[d] != it.shape[d]:
        raise ShapeError(f"index_add: source has {source.shape[d]} slices along dim {d} for "
                         f"{it.shape[d]} indices")
    src = source if alpha == 1 else source * alpha
    return _scatter(x, d, it, src, "sum", True, "index_add")


def index_copy(x: Tensor, dim: int, index, source: Tensor) -> Tensor:
    d, it = _index_as_scatter(x, dim, index, source.shape)
    return _scatter(x, d, it, source, "replace", False, "index_copy")


def index_fill(x: Tensor, dim: int, index, value) -> Tensor:
    d = _norm_axis(dim, x.ndim, "dim")
    n = index.numel() if isinstance(index, Tensor) else np.asarray(index).size
    shape = tuple(n if k == d else s for k, s in enumerate(x.shape))
    d, it = _index_as_scatter(x, dim, index, shape)
    return _scatter(x, d, it, float(value) if x.dtype != int32 else int(value), "replace", False,
                    "index_fill")


__all__ = ["index_add", "index_copy", "index_fill", "scatter", "scatter_add", "scatter_reduce"]
