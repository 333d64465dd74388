"""The bitonic sort of rows (shaders/sort.wgsl): log2(P) (log2(P) + 1) / 2 passes over rows padded
to P = a power of two, keys and their indices swapped together (stable through the indices)."""
from __future__ import annotations

from ..runtime.buffer_view import DTYPES, BufferView, int32
from ..runtime.kernels import Kernel


def bitonic(keys: BufferView, idx: BufferView, descending: bool) -> None:
    """Sort each row of contiguous ``keys`` [R, P] (P a power of two) in place, carrying the
    int32 ``idx`` [R, P] along; NaN last ascending, first descending."""
    R, P = keys.shape
    kern = Kernel.of("sort", T=DTYPES[keys.dtype],
                     ISNAN="false" if keys.dtype == int32 else "isnan_(x)")
    n = R * P // 2
    k = 2
    while k <= P:
        j = k // 2
        while j >= 1:
            keys.device.dispatch_1d(kern, [keys.buffer, idx.buffer],
                                    [n, P, k, j, int(descending)], n)
            j //= 2
        k *= 2
