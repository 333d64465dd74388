"""Index kernels (shaders/index.wgsl): rows picked by index (index_select, embedding) and
torch.gather, and their backward scatter-adds written as gathers: each destination loops over
the indices that may hit it, in passes within the loop budget, so no float atomics and the same
bits every run; many (row, index) pairs take the sorted backward (index_sorted.py). The forward
kernels clamp a bad device index and set the assert flag the next host read raises
(runtime/asserts.py)."""
from __future__ import annotations

import math

import numpy as np

from ..runtime.asserts import CODES
from ..runtime.buffer_view import DTYPES, BufferView, float32
from ..runtime.device import groups_1d
from ..runtime.kernels import Kernel
from . import index_sorted
from .bounds import LOOP_BUDGET
from .rows import row_mode

# index_select's backward sorts the indices by row (shaders/index_sorted.wgsl) from this many
# (destination row, index) pairs on: select_bwd's cost, outer * A * K comparisons, was 230 s
# for an embedding of 100k rows and 300k ids on lavapipe
SORTED_MIN = 1 << 22


def _kernel(entry: str, dtype) -> Kernel:
    defines = {"T": DTYPES[np.dtype(dtype)]}
    if defines["T"] == "f16":
        defines["F16"] = "1"
    return Kernel.of("index", entry, **defines)


def _dispatch_checked(dev, kernel, bufs: list, params: list, groups, op: str, negative: bool,
                      device_index: bool) -> None:
    """Dispatch a forward index kernel with the assert flag bound; device indices arm the
    check of the next read (after the dispatch, so no read in between misses it)."""
    dev.dispatch(kernel, bufs + [dev.asserts.buffer], params + [CODES[op], int(negative)],
                 groups)
    if device_index:
        dev.asserts.arm()


def select(xc: BufferView, it: BufferView, out: BufferView, outer: int, A: int, K: int,
           inner: int, op: str, negative: bool, device_index: bool) -> BufferView:
    """``out`` [outer, K, inner] (contiguous from its offset 0) = the rows of contiguous
    ``xc`` [outer, A, inner] at the int32 indices ``it`` (K of them; negatives wrap where
    ``negative``); ``op`` names the caller in the error a bad index raises."""
    n = math.prod(out.shape)
    if n:
        # wide rows (embeddings): a workgroup copies a row, on CPU adapters an invocation
        # 32 columns of it
        entry, groups = "select_fwd", groups_1d(n)
        if inner >= 32 and row_mode(xc.device) == "thread":
            entry, groups = "select_rows_cpu", groups_1d(outer * K * -(-inner // 32), 64)
        elif inner >= 32:
            entry, groups = "select_rows_fwd", groups_1d(outer * K, 1)
        _dispatch_checked(xc.device, _kernel(entry, xc.dtype), [xc.buffer, it.buffer, out.buffer],
                          [n, A, K, inner, xc.offset, it.offset], groups, op, negative,
                          device_index)
    return out


def select_backward(g: BufferView, it: BufferView, dx: BufferView, outer: int, A: int, K: int,
                    inner: int) -> BufferView:
    """``dx`` [outer, A, inner] (contiguous f32 from its offset 0) = the rows of contiguous
    ``g`` [outer, K, inner] added at the indices ``it``: sorted by row where there are many
    (row, index) pairs, else each row scanning the indices."""
    dev = g.device
    if outer * A * K >= SORTED_MIN and inner and index_sorted.fits(dev, K):
        return index_sorted.backward(g, it, outer, A, K, inner, dx)
    rows = outer * A
    if rows and inner:
        # indices per pass: every one of them may hit this row (skewed ids), and each hit
        # costs a loop over the row's columns
        if row_mode(dev) == "thread":
            k = _kernel("select_bwd_rows", float32)
            groups = groups_1d(rows * -(-inner // 32), 64)
            per = LOOP_BUDGET // 33
        else:
            k, groups = _kernel("select_bwd", float32), groups_1d(rows, 1)
            per = 256 * max(1, LOOP_BUDGET // (9 + 256 * -(-inner // 256)))
        for k0 in range(0, max(K, 1), per):
            dev.dispatch(k, [g.buffer, it.buffer, dx.buffer],
                         [rows, A, K, inner, g.offset, it.offset, k0, min(K, k0 + per),
                          int(k0 > 0)], groups)
    return dx


def gather(xc: BufferView, it: BufferView, out: BufferView, A: int, J: int, inner: int,
           device_index: bool) -> BufferView:
    """``out`` (``it``'s shape, contiguous from its offset 0) = torch.gather of contiguous
    ``xc`` along an axis of A entries (``inner`` elements after it) at the int32 indices
    ``it`` (J along that axis)."""
    n = math.prod(out.shape)
    if n:
        _dispatch_checked(xc.device, _kernel("gather_fwd", xc.dtype),
                          [xc.buffer, it.buffer, out.buffer],
                          [n, A, J, inner, xc.offset, it.offset], groups_1d(n), "gather", True,
                          device_index)
    return out


def gather_backward(g: BufferView, it: BufferView, dx: BufferView, A: int, J: int,
                    inner: int) -> BufferView:
    """``dx`` (contiguous f32 from its offset 0) = contiguous ``g`` added at the gather's
    indices ``it``, in passes of at most the loop budget's index entries."""
    n = math.prod(dx.shape)
    per = LOOP_BUDGET - 64  # index entries one pass adds (one loop iteration each)
    for j0 in range(0, max(J, 1), per) if n else ():
        g.device.dispatch_1d(_kernel("gather_bwd", float32), [g.buffer, it.buffer, dx.buffer],
                             [n, A, J, inner, g.offset, it.offset, j0, min(J, j0 + per),
                              int(j0 > 0)], n)
    return dx
