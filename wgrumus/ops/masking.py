"""Boolean-mask indexing, ``x[mask]`` and ``x[mask] = v``, as in PyTorch.

There is no bool dtype: a float32 tensor index (comparisons give 1.0/0.0) or a numpy bool array
is a mask; an int32 one gathers rows. ``x[mask]`` reads the mask to the host to size the result
(PyTorch synchronises too); the rows are gathered on the device.
"""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor, int32


def is_mask(idx) -> bool:
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


def select(x: Tensor, mask) -> Tensor:
    """x[mask]: the entries (rows, for a mask over the leading dims) where mask is true, as a
    new tensor of shape (count,) + x.shape[mask.ndim:]; differentiable like a gather."""
    from .indexing import index_select
    from .shape import reshape
    m = _host_mask(x, mask)
    rows = reshape(x, (-1,) + x.shape[m.ndim:])
    return index_select(rows, 0, np.flatnonzero(m.reshape(-1)))


def assign(x: Tensor, mask, value) -> None:
    """x[mask] = value (a scalar or a tensor broadcast to x's shape), in place on the device."""
    from ..tensor import tensor
    from .launch import run_map
    m = _host_mask(x, mask)
    mt = tensor(m.reshape(m.shape + (1,) * (x.ndim - m.ndim)).astype(np.float32),
                device=x.device)
    if not isinstance(value, Tensor):
        value = tensor(np.asarray(value, dtype=x.dtype), device=x.device, dtype=x.dtype)
    elif value.dtype != x.dtype:
        from .elementwise import cast
        value = cast(value, x.dtype)
    run_map("select(a, b, c != 0.0)", x, [x, value, mt])
