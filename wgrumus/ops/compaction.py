"""Ops whose output size depends on the data: nonzero (also where(cond); masked_select and
argwhere build on it in wgrumus/composite/logical.py). The positions are found on the device (a
scan of the non-zero flags, then a compaction kernel); the one number read back is the count,
to size the result (PyTorch synchronises here too)."""
from __future__ import annotations

import math

import numpy as np

from ..kernels.compact import compact
from ..kernels.map import run_map
from ..tensor import Tensor, int32
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


__all__ = ["nonzero"]
