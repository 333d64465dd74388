"""Stream compaction (shaders/compact.wgsl): the positions of the non-zero flags, from their
inclusive running count."""
from __future__ import annotations

from ..runtime.kernels import Kernel
from ..tensor import Tensor


def compact(pos: Tensor, out: Tensor) -> None:
    """out[pos[i] - 1] = i wherever pos steps up (``pos``: the inclusive scan of 0/1 flags)."""
    n = pos.numel()
    pos.device.dispatch_1d(Kernel.of("compact"), [pos.buffer, out.buffer], [n, pos.offset], n)
