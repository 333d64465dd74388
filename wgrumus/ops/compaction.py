"""Ops whose output size depends on the data: nonzero / argwhere, masked_select, where(cond).
The positions are found on the device (a scan of the non-zero flags, then a compaction
kernel); the one number read back is the count, to size the result (PyTorch synchronises
here too)."""
from __future__ import annotations

import math

import numpy as np

from ..kernels.compact import compact
from ..kernels.map import broadcast_shapes, run_map
from ..tensor import Tensor, int32
from .indexing import index_select
from .logical import _operand
from .scan import scan


def flat_nonzero(x: Tensor) -> Tensor:
    """int32 linear indices of x's non-zero entries (NaN counts as non-zero), ascending."""
    n = x.numel()
    if n == 0:
        return Tensor.empty((0,), x.device, int32)
    flags = run_map("select(0, 1, a != 0)", Tensor.empty((n,), x.device, int32),
                    [x.reshape((-1,)) if x.is_contiguous() else x.contiguous().reshape((-1,))])
    pos = scan(flags, 0, "a + b")
    count = int(pos[n - 1].item())
    out = Tensor.empty((count,), x.device, int32)
    if count:
        compact(pos, out)
    return out


def nonzero(x: Tensor, *, as_tuple: bool = False):
    """[count, ndim] int32 coordinates of the non-zero entries (row-major order); as_tuple:
    one 1-D tensor per dim."""
    lin = flat_nonzero(x)
    nd = max(x.ndim, 1)
    shape = x.shape if x.ndim else (1,)
    strides = [math.prod(shape[k + 1:]) for k in range(nd)]
    meta = Tensor.from_numpy(np.array([strides, shape], np.int64), device=x.device, dtype=int32)
    out = Tensor.empty((lin.numel(), nd), x.device, int32)
    run_map("(a / b) % c", out, [lin.reshape((-1, 1)), meta[0].reshape((1, nd)),
                                 meta[1].reshape((1, nd))])
    if x.ndim == 0:
        out = out[:, :0]
    if as_tuple:
        return tuple(out[:, k] for k in range(out.shape[1]))
    return out


def argwhere(x: Tensor) -> Tensor:
    return nonzero(x)


def masked_select(x: Tensor, mask) -> Tensor:
    """The entries of x where mask (broadcast with x) is true, as a 1-D tensor; differentiable
    in x (an index_select by the device-found positions)."""
    m = _operand(mask, x)
    shape = broadcast_shapes(x.shape, m.shape)
    lin = flat_nonzero(m.expand(shape) if m.shape != shape else m)
    xs = x.expand(shape) if x.shape != shape else x
    return index_select(xs.reshape((-1,)), 0, lin)


__all__ = ["argwhere", "masked_select", "nonzero"]
