"""Copies that repeat or reorder a tensor: repeat, tile, repeat_interleave, flip, roll and
Tensor.unfold's windows. Each is a view (expand, negative strides, slices) followed by one
strided copy or an index_select, so every one is a device kernel with the views' autograd."""
from __future__ import annotations

import numpy as np

from ..ops.dims import varargs
from ..ops.elementwise import clone, contiguous
from ..ops.indexing import index_select
from ..ops.shape import _norm_axis, cat, expand, getitem, reshape
from ..runtime.errors import ShapeError
from ..tensor import Tensor, as_shape


def repeat(x: Tensor, *sizes) -> Tensor:
    """torch's Tensor.repeat: tile ``x`` sizes[k] times along dim k (leading sizes add dims)."""
    sizes = as_shape(varargs(sizes), "repeat")
    if len(sizes) < x.ndim:
        raise ShapeError(f"repeat: {len(sizes)} repeat counts for a tensor with {x.ndim} dims; "
                         f"give at least one per dim")
    shape = (1,) * (len(sizes) - x.ndim) + x.shape
    inter, big = [], []
    for r, s in zip(sizes, shape):
        inter += [1, s]
        big += [r, s]
    y = expand(reshape(x, tuple(inter)), tuple(big))
    return reshape(contiguous(y), tuple(r * s for r, s in zip(sizes, shape)))


def tile(x: Tensor, dims) -> Tensor:
    """torch.tile: repeat with the counts padded with leading ones."""
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    return repeat(x, (1,) * (x.ndim - len(dims)) + dims)


def repeat_interleave(x: Tensor, repeats, dim=None, *, output_size=None) -> Tensor:
    """Each element (dim None: of the flattened tensor) repeated ``repeats`` times in place.
    A tensor of counts is read to the host to size the result (PyTorch synchronises too
    unless told ``output_size``)."""
    if dim is None:
        x, dim = reshape(x, (-1,)), 0
    dim = _norm_axis(dim, x.ndim, "dim")
    n = x.shape[dim]
    r = repeats.numpy() if isinstance(repeats, Tensor) else np.asarray(repeats)
    if r.ndim == 0 or r.size == 1:
        r = np.full(n, int(r.reshape(-1)[0]) if r.size else 0)
    if r.shape != (n,):
        raise ShapeError(f"repeat_interleave: {r.size} counts for dim {dim} of size {n}")
    if r.dtype.kind not in "iu" and not np.all(r == np.floor(r)):
        raise ValueError("repeat_interleave: counts must be whole numbers")
    r = r.astype(np.int64)
    if (r < 0).any():
        raise ValueError("repeat_interleave: counts must be >= 0")
    idx = np.repeat(np.arange(n), r)
    if output_size is not None and output_size != idx.size:
        raise ShapeError(f"repeat_interleave: output_size {output_size} but the counts add up "
                         f"to {idx.size}")
    return index_select(x, dim, idx.astype(np.int32))


def _dims(x: Tensor, dims) -> tuple:
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    out = tuple(_norm_axis(d, x.ndim, "dim") for d in dims)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated dim in {dims}")
    return out


def flip(x: Tensor, dims) -> Tensor:
    """A copy with the order along ``dims`` reversed (a negative-stride view, copied)."""
    dims = _dims(x, dims)
    if x.ndim == 0 or not dims:
        return clone(x)
    v = getitem(x, tuple(slice(None, None, -1) if d in dims else slice(None)
                         for d in range(x.ndim)))
    return clone(v)


def fliplr(x: Tensor) -> Tensor:
    if x.ndim < 2:
        raise ShapeError("fliplr needs a tensor with at least 2 dims")
    return flip(x, 1)


def flipud(x: Tensor) -> Tensor:
    if x.ndim < 1:
        raise ShapeError("flipud needs a tensor with at least 1 dim")
    return flip(x, 0)


def roll(x: Tensor, shifts, dims=None) -> Tensor:
    """torch.roll: elements shifted along ``dims`` (wrapping); no dims: the flattened tensor."""
    if dims is None:
        if isinstance(shifts, (tuple, list)) and len(shifts) != 1:
            raise ShapeError("roll: without dims, give one shift (the flattened tensor's)")
        s = shifts[0] if isinstance(shifts, (tuple, list)) else shifts
        return reshape(roll(reshape(x, (-1,)), s, 0), x.shape)
    shifts = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts) != len(dims):
        raise ShapeError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    out = x
    for s, d in zip(shifts, dims):
        d = _norm_axis(d, x.ndim, "dim")
        n = x.shape[d]
        k = int(s) % n if n else 0
        if k:
            lead = (slice(None),) * d
            out = cat([getitem(out, lead + (slice(n - k, n),)),
                       getitem(out, lead + (slice(0, n - k),))], d)
    if out is x:
        out = clone(x)
    return out


def tensor_unfold(x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """Tensor.unfold: windows of ``size`` every ``step`` along ``dimension``, as a new last dim
    (a copy through index_select, whose gradient adds overlapping windows)."""
    d = _norm_axis(dimension, x.ndim, "dimension")
    n = x.shape[d] if x.ndim else 1
    if size > n or step < 1:
        raise ShapeError(f"unfold: size {size} exceeds dim {d} of size {n}, or step {step} < 1")
    count = (n - size) // step + 1
    idx = (np.arange(count)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
    y = index_select(x, d, idx.astype(np.int32))
    y = reshape(y, x.shape[:d] + (count, size) + x.shape[d + 1:])
    order = list(range(d + 1)) + list(range(d + 2, y.ndim)) + [d + 1]
    return y.permute(order)



__all__ = ["flip", "fliplr", "flipud", "repeat", "repeat_interleave", "roll", "tile"]
