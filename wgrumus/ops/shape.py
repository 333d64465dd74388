"""Views (reshape, transpose, permute, expand, slicing) and the copies that need data movement
(contiguous, cat, stack, to(device)). Views share storage; their backward is a view of the
gradient or a scatter into zeros."""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import record
from ..kernels.map import expand_strides
from ..runtime import get_device
from ..runtime.errors import DimError, ShapeError, WgrumusError
from ..tensor import Tensor, as_dtype, as_shape, check_same_device, contiguous_strides
from .dims import pick, varargs
from .elementwise import cast, contiguous, copy_into, fill_, unbroadcast


def _norm_axis(axis: int, nd: int, what="axis") -> int:
    if not -max(nd, 1) <= axis < max(nd, 1):
        raise DimError(f"{what} {axis} is out of range for a tensor with {nd} dimensions "
                       f"(valid: {-max(nd, 1)}..{max(nd, 1) - 1})")
    return axis % max(nd, 1)


def _infer(shape, n) -> tuple:
    shape = list(as_shape(shape, "reshape", wildcard=True))
    neg = [i for i, s in enumerate(shape) if s == -1]
    if len(neg) > 1:
        raise ShapeError(f"reshape: only one -1 allowed, got {tuple(shape)}")
    known = math.prod(s for s in shape if s != -1)
    if neg:
        if known == 0 or n % known:
            raise ShapeError(f"reshape: cannot infer -1 in {tuple(shape)} for {n} elements")
        shape[neg[0]] = n // known
    if math.prod(shape) != n:
        raise ShapeError(f"cannot reshape a tensor of {n} elements to {tuple(shape)}")
    return tuple(shape)


def reshape(x: Tensor, *shape) -> Tensor:
    shape = _infer(varargs(shape), x.numel())
    src = contiguous(x)
    out = Tensor(src.storage, shape, contiguous_strides(shape), src.offset, src.dtype)
    in_shape = x.shape
    record("reshape", out, [src], lambda g: (reshape(g, in_shape),))
    return out


def permute(x: Tensor, *axes) -> Tensor:
    nd = x.ndim
    axes = tuple(_norm_axis(a, nd) for a in varargs(axes))
    if sorted(axes) != list(range(nd)):
        raise ShapeError(f"permute: {axes} is not a permutation of the {nd} axes")
    out = x._view(tuple(x.shape[a] for a in axes), tuple(x.strides[a] for a in axes), x.offset)
    inv = tuple(sorted(range(nd), key=axes.__getitem__))
    record("permute", out, [x], lambda g: (permute(g, inv),))
    return out


def transpose(x: Tensor, a: int = -2, b: int = -1) -> Tensor:
    nd = x.ndim
    if nd < 2 and (a, b) == (-2, -1):
        return x
    a, b = _norm_axis(a, nd), _norm_axis(b, nd)
    axes = list(range(nd))
    axes[a], axes[b] = axes[b], axes[a]
    return permute(x, axes)


def expand(x: Tensor, *shape) -> Tensor:
    shape = as_shape(varargs(shape), "expand", wildcard=True)
    pad = len(shape) - x.ndim
    if pad < 0 or any(s == -1 for s in shape[:pad]):
        raise ShapeError(f"cannot expand shape {x.shape} to {tuple(shape)} (-1 only keeps an "
                         f"existing dimension)")
    shape = tuple(x.shape[i - pad] if s == -1 else s for i, s in enumerate(shape))
    out = x._view(shape, expand_strides(x, shape), x.offset)
    in_shape = x.shape
    record("expand", out, [x], lambda g: (unbroadcast(g, in_shape),))
    return out


def unsqueeze(x: Tensor, dim: int = None, *, axis=None) -> Tensor:
    if dim is None and axis is None:
        raise TypeError("unsqueeze needs the position of the new axis: unsqueeze(x, dim)")
    axis = _norm_axis(pick(dim, axis), x.ndim + 1)
    return reshape(x, x.shape[:axis] + (1,) + x.shape[axis:])


def squeeze(x: Tensor, dim=None, *, axis=None) -> Tensor:
    """PyTorch's squeeze: the given dims (an int or a tuple) that have size 1 removed; a dim of
    another size is left as it is (no error), as is a 0-d tensor."""
    axis = pick(dim, axis)
    if axis is None:
        return reshape(x, tuple(s for s in x.shape if s != 1))
    axes = {_norm_axis(a, x.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}
    return reshape(x, tuple(s for k, s in enumerate(x.shape) if not (k in axes and s == 1)))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = _norm_axis(start_dim, x.ndim), _norm_axis(end_dim, x.ndim)
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def unflatten(x: Tensor, dim: int, sizes) -> Tensor:
    """Dim ``dim`` split into ``sizes`` (one of them may be -1)."""
    d = _norm_axis(dim, x.ndim, "dim")
    sizes = _infer(tuple(sizes), x.shape[d])
    return reshape(x, x.shape[:d] + sizes + x.shape[d + 1:])


def _index_view(x: Tensor, idx):
    """Basic indexing (ints, slices with any step, None, Ellipsis) -> (shape, strides, offset)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if sum(i is Ellipsis for i in idx) > 1:
        raise IndexError("an index can only have a single ellipsis")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"too many indices ({n_real}) for a tensor with {x.ndim} dimensions")
    if Ellipsis in idx:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (x.ndim - n_real) + idx[k + 1:]
    idx = idx + (slice(None),) * (x.ndim - sum(1 for i in idx if i is not None))
    shape, strides, off, d = [], [], x.offset, 0
    for i in idx:
        if i is None:
            shape.append(1)
            strides.append(0)
            continue
        size, st = x.shape[d], x.strides[d]
        if isinstance(i, (bool, np.bool_)):
            raise IndexError("boolean indices are not supported; use wr.where or an index tensor")
        if isinstance(i, (int, np.integer)):
            j = int(i)
            if not -size <= j < size:
                raise IndexError(f"index {j} is out of bounds for axis {d} with size {size}")
            off += (j % size) * st
        elif isinstance(i, slice):
            start, stop, step = i.indices(size)
            n = len(range(start, stop, step))
            shape.append(n)
            strides.append(st * step)
            if n:
                off += start * st
        else:
            raise IndexError(f"unsupported index {i!r}; use ints, slices, None, ... (or "
                             f"wr.gather / index_select for index tensors)")
        d += 1
    return tuple(shape), tuple(strides), off


def getitem(x: Tensor, idx) -> Tensor:
    """x[idx] for ints, slices, None and ...: a view (indexing.getitem takes index tensors)."""
    shape, strides, off = _index_view(x, idx)
    out = x._view(shape, strides, off)
    in_shape = x.shape

    def bw(g):
        # scatter into zeros laid out contiguously: index the gradient, not x's (maybe strided) view
        gx = fill_(Tensor.empty(in_shape, g.device, g.dtype), 0.0)
        copy_into(gx._view(*_index_view(gx, idx)), g)
        return (gx,)
    record("getitem", out, [x], bw)
    return out


def cat(tensors, dim: int = None, *, axis=None) -> Tensor:
    axis = pick(dim, axis, 0)
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("cat needs at least one tensor")
    check_same_device(*tensors, op="cat")
    nd = tensors[0].ndim
    axis = _norm_axis(axis, nd)
    for t in tensors:
        if t.ndim != nd or any(t.shape[k] != tensors[0].shape[k] for k in range(nd) if k != axis):
            raise ShapeError("cat: shapes " + ", ".join(str(t.shape) for t in tensors)
                             + f" differ outside axis {axis}")
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        raise WgrumusError("cat: dtypes differ (" + ", ".join(str(t.dtype) for t in tensors)
                           + "); convert with .float() / .int() first")
    shape = list(tensors[0].shape)
    shape[axis] = sum(t.shape[axis] for t in tensors)
    out = Tensor.empty(shape, tensors[0].device, dtype)
    bounds = np.cumsum([0] + [t.shape[axis] for t in tensors])
    for t, a, b in zip(tensors, bounds[:-1], bounds[1:]):
        sl = (slice(None),) * axis + (slice(int(a), int(b)),)
        sh, st, off = _index_view(out, sl)
        copy_into(out._view(sh, st, off), t)

    def bw(g):
        return tuple(getitem(g, (slice(None),) * axis + (slice(int(a), int(b)),))
                     for a, b in zip(bounds[:-1], bounds[1:]))
    record("cat", out, tensors, bw)
    return out


def stack(tensors, dim: int = None, *, axis=None) -> Tensor:
    axis = pick(dim, axis, 0)
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("stack needs at least one tensor")
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise ShapeError(f"stack: all tensors need the same shape, got {sorted(shapes)}")
    axis = _norm_axis(axis, tensors[0].ndim + 1)
    return cat([unsqueeze(t, axis) for t in tensors], axis)


def split(x: Tensor, sizes, dim: int = None, *, axis=None) -> list:
    axis = _norm_axis(pick(dim, axis, 0), x.ndim)
    n = x.shape[axis]
    if isinstance(sizes, (int, np.integer)):
        if sizes < 1:
            raise ShapeError(f"split size must be >= 1, got {sizes}")
        sizes = [int(sizes)] * (n // sizes) + ([n % sizes] if n % sizes else [])
    if sum(sizes) != n:
        raise ShapeError(f"split sizes {list(sizes)} do not add up to {n} (axis {axis})")
    out, a = [], 0
    for s in sizes:
        out.append(getitem(x, (slice(None),) * axis + (slice(a, a + s),)))
        a += s
    return out


def chunk(x: Tensor, chunks: int, dim: int = None, *, axis=None) -> list:
    axis = pick(dim, axis, 0)
    n = x.shape[_norm_axis(axis, x.ndim)]
    size = max(1, -(-n // chunks))
    return split(x, size, axis)


def _to_args(args, device, dtype):
    """PyTorch's to() forms: to(device), to(dtype), to(device, dtype), to(other_tensor)."""
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, (np.dtype, type)) or isinstance(a, str) and _is_dtype_name(a):
            dtype = a
        else:
            device = a
    return device, None if dtype is None else as_dtype(dtype)


def _is_dtype_name(name: str) -> bool:
    try:
        np.dtype(name)
        return True
    except TypeError:
        return False


def to(x: Tensor, *args, device=None, dtype=None) -> Tensor:
    """x on ``device`` and/or in ``dtype`` (x itself when nothing changes)."""
    device, dtype = _to_args(args, device, dtype)
    if isinstance(device, str):  # refused before any cast ("cpu": how to read to the host)
        get_device(device)
    if dtype is not None and dtype != x.dtype:
        x = cast(x, dtype)
    return x if device is None else _to_device(x, device)


def _to_device(x: Tensor, device) -> Tensor:
    dev = get_device(device)
    if dev is x.device:
        return x
    src = contiguous(x)
    out = Tensor.empty(x.shape, dev, x.dtype)
    if x.numel():
        # Across adapters the bytes go through the host (persistent staging both ways).
        arr = src.device.read_array(src.buffer, src.offset * src.dtype.itemsize,
                                    src.numel(), src.dtype)
        dev.write(out.buffer, arr)
    src_dev = x.device
    record("to", out, [x], lambda g: (_to_device(g, src_dev),))
    return out


def detach(x: Tensor) -> Tensor:
    return Tensor(x.storage, x.shape, x.strides, x.offset, x.dtype)
