"""Stream compaction (shaders/compact.wgsl): the positions of the non-zero flags, from their
inclusive running count."""
from __future__ import annotations

import math

from ..runtime.buffer_view import BufferView
from ..runtime.kernels import Kernel


def compact(pos: BufferView, out: BufferView) -> None:
    """out[pos[i] - 1] = i wherever pos steps up (``pos``: the inclusive scan of 0/1 flags)."""
    n = math.prod(pos.shape)
    pos.device.dispatch_1d(Kernel.of("compact"), [pos.buffer, out.buffer], [n, pos.offset], n)
