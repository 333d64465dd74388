"""index_select's (and embedding's) backward for many indices (shaders/index_sorted.wgsl): the
indices sorted by destination row with their positions (a bitonic sort), each row's run summed
in ascending position: linear in ids + rows, no atomics, the same bits every run."""
from __future__ import annotations

import functools
import math

from ..runtime.buffer_view import BufferView, View, float32, int32
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from .bounds import LOOP_BUDGET


def fits(dev, K: int) -> bool:
    """Whether the sort's keys (8 bytes a power of two >= K) fit in one binding (else the row
    scan runs: 2^23 indices a call on 128 MiB bindings)."""
    return 8 << max(0, (K - 1).bit_length()) <= dev.max_binding


def backward(g: BufferView, it: BufferView, outer: int, A: int, K: int, inner: int,
             dx: BufferView) -> BufferView:
    """DX [outer, A, inner] (``dx``: contiguous f32 from its offset 0; returned) = the rows of
    G [outer, K, inner] added by index: the indices sorted with their positions, each row's
    run summed in ascending position."""
    dev = g.device
    n = 1 << max(0, (K - 1).bit_length())  # the sort's length: a power of two
    # B entries a block, CW columns an invocation: a run's partial blocks (< 2 B entries) and
    # whole ones (<= K / B) times CW + 1 loop iterations within the loop budget
    B = max(256, math.isqrt(K // 2) + 1)
    nb = -(-K // B)
    cw = next((c for c in (8, 4, 2, 1) if (2 * B + nb) * (c + 1) <= LOOP_BUDGET
               and inner % c == 0), None)
    if cw is None:
        raise ShapeError(f"index_select backward: {K} indices are more than one pass sums "
                         f"within the loop budget; split the indices")
    nc = inner // cw
    keys = View.empty((n, 2), dev, int32)
    lo, hi = View.empty((A,), dev, int32), View.empty((A,), dev, int32)
    bs = View.empty((max(1, outer * nb * inner),), dev, float32)
    bufs = [g.buffer, it.buffer, keys.buffer, lo.buffer, bs.buffer, dx.buffer, hi.buffer]
    k = functools.partial(Kernel.of, "index_sorted", CW=cw)
    if K:
        dev.dispatch_1d(k("sort_init"), bufs, [K, n, A, it.offset], n)
        size = 2
        while size <= n:
            j = size // 2
            while j:
                dev.dispatch_1d(k("sort_step"), bufs, [n // 2, j, size], n // 2)
                j //= 2
            size *= 2
    dev.dispatch_1d(k("seg_clear"), bufs, [A], A)
    if K:
        dev.dispatch_1d(k("seg_bounds"), bufs, [K], K)
        dev.dispatch_1d(k("block_sums"), bufs, [K, inner, nb, g.offset, B, outer * nb * nc],
                        outer * nb * nc)
    dev.dispatch_1d(k("seg_sum"), bufs, [A, K, inner, nb, g.offset, B, outer * A * nc],
                    outer * A * nc)
    return dx
