"""Tensor parallel's all-reduces overlapped with compute, inside the fused linear ops: the
column-parallel input gradient reduced while the weight gradient is computed (Megatron's
overlap), and the row-parallel output reduced in token chunks, chunk k's all-reduce running while
chunk k+1 is multiplied. Both use the group's asynchronous all-reduce (the thread backend's
CommThread, the processes and MPI backends' communication thread): no threads of their own.
``TUNING.tp_chunks`` and ``TUNING.tp_overlap`` choose; the defaults are one chunk, overlap on."""
from __future__ import annotations

import math

from ...autograd.tape import needs_grad, no_grad, record
from ...ops.elementwise import _f32, contiguous
from ...ops.linear import linear
from ...ops.matmul import matmul
from ...ops.precision import in_forward_precision
from ...ops.shape import cat, getitem, reshape, transpose
from ...runtime.tuning import TUNING
from ..transport import split_bounds


def tp_chunks() -> int:
    """Token chunks of the row-parallel all-reduce (``TUNING.tp_chunks``; None: 1)."""
    n = TUNING.tp_chunks
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"TUNING.tp_chunks must be an int >= 1 (or None for 1), got {n!r}")
    return n


def tp_overlap() -> bool:
    """Whether the column-parallel input gradient's all-reduce overlaps the weight gradient."""
    return TUNING.tp_overlap is None or bool(TUNING.tp_overlap)


class _Ready:
    """A handle of a result already there (the all-reduce ran at once: overlap off)."""

    def __init__(self, value):
        self.value = value

    def wait(self, timeout: float | None = None):
        return self.value


class _Started:
    """An asynchronous all-reduce whose wait first submits the work recorded since it started,
    so that the device computes it while the host part of the all-reduce runs."""

    def __init__(self, work, device):
        self.work, self.device = work, device

    def wait(self, timeout: float | None = None):
        self.device.flush()
        return self.work.wait(timeout)


def start_all_reduce(x, group):
    """Start the SUM all-reduce of device tensor ``x`` over ``group``; a handle to wait on.
    The group issues the download of ``x`` at once, before the work recorded next (dW, the next
    chunk's matmul), which would otherwise run first and hold the host part back by its length."""
    return _Started(group.all_reduce_async(x, "sum"), x.device)


def input_grad_all_reduce(group):
    """``linear``'s ``input_grad``: the column-parallel dX summed over the TP ranks, started
    as soon as dX exists and waited after the weight gradient (at once when overlap is off)."""
    if tp_overlap():
        return lambda dx: start_all_reduce(dx, group)
    return lambda dx: _Ready(group.all_reduce(dx, "sum"))


def chunked_row_parallel(x, weight, group, chunks: int):
    """sum over TP ranks of x @ weight.T (no bias) as one autograd node, its all-reduce in
    ``chunks`` token chunks, chunk k's in flight while chunk k+1 is multiplied. The output is
    replicated, so the backward needs no communication (as reduce_from_tp_region's)."""
    n_out, n_in = weight.shape
    lead = tuple(x.shape[:-1])
    n = math.prod(lead)
    with no_grad():
        x2 = contiguous(reshape(_f32(x), (n, n_in)))
        bounds = split_bounds(n, max(1, min(chunks, n)))
        works = [start_all_reduce(linear(getitem(x2, (slice(a, b),)), weight), group)
                 for a, b in zip(bounds, bounds[1:]) if b > a]
        parts = [w.wait() for w in works]
        y = parts[0] if len(parts) == 1 else cat(parts, 0)
        out = reshape(y, lead + (n_out,))
    if not needs_grad(x, weight):
        return out

    def bw(g):
        g2 = contiguous(reshape(g, (n, n_out)))
        dx = dw = None
        if x.requires_grad:
            dx = reshape(matmul(g2, weight), tuple(x.shape))
        if weight.requires_grad:
            dw = matmul(transpose(g2, 0, 1), x2)  # [out, in]
        return dx, dw
    record("row_parallel_linear", out, [x, weight], in_forward_precision(bw),
           saved=[x2, weight])
    return out
