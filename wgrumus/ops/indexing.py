"""Indexing: ``x[idx]`` and ``x[idx] = v`` (views for ints and slices: shape.py), by integer
tensors (index_select, gather, embedding) and by boolean masks, as in PyTorch.

Backward scatter-adds are written as gathers (kernels/index.py): no float atomics, the same bits
every run. Host indices are range-checked before upload; device indices by the forward kernels,
which clamp a bad one and set the assert flag the next host read raises (runtime/asserts.py).

There is no bool dtype: a float32 tensor index (comparisons give 1.0/0.0) or a numpy bool array
is a mask; an int32 one gathers rows. ``x[mask]`` reads the mask to the host to size the result
(PyTorch synchronises too); the rows are gathered on the device.
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import is_grad_enabled, no_grad, record
from ..kernels import index as index_kernels
from ..kernels.map import run_map
from ..runtime.errors import DeviceMismatchError, ShapeError, WgrumusError
from ..tensor import Tensor, float32, int32, tensor
from .elementwise import cast, contiguous, copy_into, fill_
from .shape import _index_view, _norm_axis, reshape
from .shape import getitem as view_getitem


def as_index(idx, like: Tensor, size: int, what: str, allow_negative: bool = True) -> Tensor:
    """Indices as a contiguous int32 tensor on ``like``'s device. Host indices are checked
    against ``size`` here (and negatives wrapped when allowed)."""
    if isinstance(idx, Tensor):
        if idx.dtype != int32:
            raise WgrumusError(f"{what}: indices must be an int32 tensor, got {idx.dtype}; "
                               f"convert with .int()")
        if idx.device is not like.device:
            raise DeviceMismatchError(f"{what}: data on {like.device}, indices on {idx.device}; "
                                      f"move them to one device with .to(device) first")
        return contiguous(idx)
    a = np.asarray(idx)
    if a.dtype == np.bool_:
        raise IndexError(f"{what}: takes integer indices, not a boolean mask; select with "
                         f"x[mask] (or integer indices np.nonzero(mask)[0])")
    if a.size == 0:
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise IndexError(f"{what}: indices must be integers, got dtype {a.dtype}")
    lo = -size if allow_negative else 0
    bad = a[(a < lo) | (a >= size)]
    if bad.size:
        valid = f"-{size}..{size - 1}" if allow_negative else f"0..{size - 1}"
        raise IndexError(f"{what}: index {int(bad.flat[0])} is out of range for size {size} "
                         f"(valid: {valid})")
    if allow_negative:
        a = np.where(a < 0, a + size, a)
    return Tensor.from_numpy(a.astype(np.int64), device=like.device, dtype=int32)


def index_select(x: Tensor, axis: int, idx, _op: str = "index_select",
                 _negative: bool = True) -> Tensor:
    """numpy's ``take`` along ``axis`` (torch's index_select for 1-D idx)."""
    axis = _norm_axis(axis, x.ndim)
    A = x.shape[axis]
    it = as_index(idx, x, A, _op, _negative)
    if A == 0 and it.numel():
        raise IndexError(f"index_select: axis {axis} of shape {x.shape} is empty")
    xc = contiguous(x)
    outer = math.prod(x.shape[:axis])
    inner = math.prod(x.shape[axis + 1:])
    K = it.numel()
    out = Tensor.empty(x.shape[:axis] + it.shape + x.shape[axis + 1:], x.device, x.dtype)
    index_kernels.select(xc, it, out, outer, A, K, inner, _op, _negative,
                         isinstance(idx, Tensor))

    def bw(g):
        dx = Tensor.empty(x.shape, g.device, float32)
        return (index_kernels.select_backward(contiguous(g), it, dx, outer, A, K, inner),)
    record("index_select", out, [xc], bw, saved=[it])
    return out


def gather(x: Tensor, axis: int, idx) -> Tensor:
    """torch.gather: out[i][j][k] = x[i][idx[i][j][k]][k] (for axis=1); idx has x's number of
    dims and is no larger than x outside ``axis``; out has idx's shape."""
    axis = _norm_axis(axis, x.ndim)
    A = x.shape[axis]
    it = as_index(idx, x, A, "gather")
    if it.ndim != x.ndim or any(it.shape[d] > x.shape[d] for d in range(x.ndim) if d != axis):
        raise ShapeError(f"gather: index shape {it.shape} must have {x.ndim} dims and be no "
                         f"larger than the input shape {x.shape} outside axis {axis}")
    if A == 0 and it.numel():
        raise IndexError(f"gather: axis {axis} of shape {x.shape} is empty")
    if any(it.shape[d] < x.shape[d] for d in range(x.ndim) if d != axis):
        x = view_getitem(x, tuple(slice(None) if d == axis else slice(0, it.shape[d])
                             for d in range(x.ndim)))
    xc = contiguous(x)
    inner = math.prod(x.shape[axis + 1:])
    J = it.shape[axis]
    out = Tensor.empty(it.shape, x.device, x.dtype)
    index_kernels.gather(xc, it, out, A, J, inner, isinstance(idx, Tensor))

    def bw(g):
        dx = Tensor.empty(xc.shape, g.device, float32)
        return (index_kernels.gather_backward(contiguous(g), it, dx, A, J, inner),)
    record("gather", out, [xc], bw, saved=[it])
    return out


def embedding(idx, weight: Tensor) -> Tensor:
    """Rows of ``weight`` [V, D] for integer ``idx`` of any shape -> idx.shape + (D,).
    Indices outside [0, V) raise: host ones at once, device ones at the next read."""
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be [num_embeddings, dim], got {weight.shape}")
    return index_select(weight, 0, idx, "embedding", False)


def getitem(x: Tensor, idx) -> Tensor:
    """x[idx]: a view for ints, slices, None and ...; rows of an int32 tensor, list or array
    (index_select); the entries of a boolean mask."""
    if isinstance(idx, (Tensor, list, np.ndarray)):
        return _mask_select(x, idx) if _is_mask(idx) else index_select(x, 0, idx)
    return view_getitem(x, idx)


def setitem(x: Tensor, idx, value) -> None:
    if x.requires_grad and is_grad_enabled():
        raise RuntimeError("in-place assignment into a tensor that requires grad; wrap it in "
                           "wr.no_grad() or build the value with wr.where / wr.cat")
    if isinstance(value, Tensor) and value.storage is x.storage:
        # the value may overlap the written view (x[1:] = x[:-1], y[:] = y.t()): the kernel
        # would read elements it has already written, so assign from a copy, as numpy does
        with no_grad():
            value = value.clone()
    if isinstance(idx, (Tensor, list, np.ndarray)) and _is_mask(idx):
        _mask_assign(x, idx, value)
        return
    shape, strides, off = _index_view(x, idx)
    view = x._view(shape, strides, off)
    if not isinstance(value, Tensor):
        if isinstance(value, (int, float, np.integer, np.floating)):
            fill_(view, value)
            return
        value = tensor(np.asarray(value), device=x.device, dtype=x.dtype)
    copy_into(view, value)


def _is_mask(idx) -> bool:
    """A float tensor or a numpy bool array. A list of bools raises: lists index rows."""
    if isinstance(idx, Tensor):
        return idx.dtype != int32
    if isinstance(idx, list) and idx and all(isinstance(i, (bool, np.bool_)) for i in idx):
        raise IndexError("a list of bools is not a boolean mask here (lists are row "
                         "indices); pass np.array(mask) or a mask tensor such as x > 0")
    return isinstance(idx, np.ndarray) and idx.dtype == np.bool_


def _host_mask(x: Tensor, mask) -> np.ndarray:
    m = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    if m.shape != x.shape[:m.ndim]:
        raise IndexError(f"boolean mask of shape {m.shape} does not match the leading "
                         f"dimensions of the indexed tensor's shape {x.shape}")
    if m.dtype != np.bool_:
        if not np.all((m == 0) | (m == 1)):
            raise IndexError("a float tensor used as an index is read as a mask (what "
                             "comparisons return: 1.0 where true, 0.0 elsewhere), but this one "
                             "holds other values; to gather rows, index with an int32 tensor")
        m = m != 0
    return m


def _mask_select(x: Tensor, mask) -> Tensor:
    """x[mask]: the entries (rows, for a mask over the leading dims) where mask is true, as a
    new tensor of shape (count,) + x.shape[mask.ndim:]; differentiable like a gather."""
    m = _host_mask(x, mask)
    rows = reshape(x, (-1,) + x.shape[m.ndim:])
    return index_select(rows, 0, np.flatnonzero(m.reshape(-1)))


def _mask_assign(x: Tensor, mask, value) -> None:
    """x[mask] = value (a scalar or a tensor broadcast to x's shape), in place on the device."""
    m = _host_mask(x, mask)
    mt = tensor(m.reshape(m.shape + (1,) * (x.ndim - m.ndim)).astype(np.float32),
                device=x.device)
    if not isinstance(value, Tensor):
        value = tensor(np.asarray(value, dtype=x.dtype), device=x.device, dtype=x.dtype)
    elif value.dtype != x.dtype:
        value = cast(value, x.dtype)
    run_map("select(a, b, c != 0.0)", x, [x, value, mt])
