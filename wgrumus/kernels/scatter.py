"""The scatter family's kernel (shaders/scatter.wgsl): each destination loops over its column of
the index (in passes within the loop budget), so no atomics and the same result every run."""
from __future__ import annotations

import math

from ..runtime.asserts import CODES
from ..runtime.buffer_view import DTYPES, BufferView, float32
from ..runtime.kernels import Kernel
from .bounds import LOOP_BUDGET

_NAN = "select({0}, x + y, isnan_(f32(x)) || isnan_(f32(y)))"
_COMBINE = {"replace": "y", "sum": "x + y", "prod": "x * y", "mean": "x + y",
            "amax": "max(x, y)", "amin": "min(x, y)"}


def accumulate(acc: BufferView, cnt: BufferView, src: BufferView, idx: BufferView, A: int,
               J: int, inner: int, mode: str, dev_index: bool) -> None:
    """Combine ``src`` into contiguous ``acc`` [outer, A, inner] at ``idx`` (J entries along A)
    with ``mode``'s combine, counting the writes per element in ``cnt``; device indices out of
    range raise at the next host read."""
    dev = acc.device
    comb = _COMBINE[mode]
    if mode in ("amax", "amin") and acc.dtype == float32:
        comb = _NAN.format(comb)
    k = Kernel.of("scatter", T=DTYPES[acc.dtype], COMBINE=comb)
    n = math.prod(acc.shape)
    per = LOOP_BUDGET - 64
    for j0 in range(0, J, per) if n else ():
        dev.dispatch_1d(k, [src.buffer, idx.buffer, acc.buffer, cnt.buffer, dev.asserts.buffer],
                        [n, A, J, inner, src.offset, idx.offset, j0, min(J, j0 + per), 1,
                         CODES["scatter"]], n)
    if dev_index and n and J:
        dev.asserts.arm()
