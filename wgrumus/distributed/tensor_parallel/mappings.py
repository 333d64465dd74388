"""The Megatron mappings: every collective that crosses autograd, one forward/backward pair each
(identities for a group of one rank):

    copy_to_tp_region       identity           | all-reduce SUM   (input of a column-parallel op)
    reduce_from_tp_region   all-reduce SUM     | identity         (output of a row-parallel op)
    scatter_to_tp_region    keep my last-dim part | all-gather last dim
    gather_from_tp_region   all-gather last dim   | keep my last-dim part
    scatter_to_sequence_parallel_region  keep my part of ``axis`` | all-gather ``axis``
    gather_from_sequence_parallel_region  all-gather ``axis``      | reduce-scatter SUM ``axis``
    reduce_scatter_to_sequence_parallel_region  reduce-scatter SUM ``axis`` | all-gather ``axis``
"""
from __future__ import annotations

from ...autograd.tape import record
from ...tensor import Tensor
from .shard import part_size


def _alias(x: Tensor) -> Tensor:
    """A new tensor object over the same data: the node an identity mapping records."""
    return Tensor(x.storage, x.shape, x.strides, x.offset, x.dtype)


def _take(x: Tensor, axis: int, group) -> Tensor:
    """This rank's equal part of ``x`` along ``axis`` (a contiguous copy; no communication)."""
    axis %= x.ndim
    k = part_size(x.shape[axis], group.world_size, f"axis {axis} of shape {x.shape}")
    a, b = group.rank * k, (group.rank + 1) * k
    from ...autograd.tape import no_grad
    from ...ops.elementwise import contiguous
    from ...ops.shape import getitem
    with no_grad():
        return contiguous(getitem(x, (slice(None),) * axis + (slice(a, b),)))


def _gather(x: Tensor, axis: int, group) -> Tensor:
    return group.all_gather(x, axis=axis % x.ndim)


def _single(group) -> bool:
    return group is None or group.world_size == 1


def _mapping(name: str, x: Tensor, group, forward, backward) -> Tensor:
    """Run ``forward`` and record ``backward`` as its gradient (identity without a group)."""
    if _single(group):
        return x
    out = forward(x)
    record(name, out, [x], lambda g: (backward(g),))
    return out


def copy_to_tp_region(x: Tensor, group) -> Tensor:
    """Identity forward; backward sums the input's partial gradients over the TP ranks."""
    return _mapping("copy_to_tp_region", x, group, _alias,
                    lambda g: group.all_reduce(g, "sum"))


def reduce_from_tp_region(x: Tensor, group) -> Tensor:
    """All-reduce SUM forward (partial row-parallel results); identity backward."""
    return _mapping("reduce_from_tp_region", x, group,
                    lambda t: group.all_reduce(t, "sum"), lambda g: g)


def scatter_to_tp_region(x: Tensor, group) -> Tensor:
    """Keep this rank's part of the last dim; backward all-gathers the gradient."""
    return _mapping("scatter_to_tp_region", x, group,
                    lambda t: _take(t, -1, group), lambda g: _gather(g, -1, group))


def gather_from_tp_region(x: Tensor, group) -> Tensor:
    """All-gather along the last dim (rank order); backward keeps this rank's part."""
    return _mapping("gather_from_tp_region", x, group,
                    lambda t: _gather(t, -1, group), lambda g: _take(g, -1, group))


def scatter_to_sequence_parallel_region(x: Tensor, group, axis: int = 1) -> Tensor:
    """Keep this rank's part of the sequence ``axis``; backward all-gathers it."""
    return _mapping("scatter_to_sequence_parallel_region", x, group,
                    lambda t: _take(t, axis, group), lambda g: _gather(g, axis, group))


def gather_from_sequence_parallel_region(x: Tensor, group, axis: int = 1) -> Tensor:
    """All-gather the sequence ``axis``; backward reduce-scatters the partial gradients (SUM)."""
    return _mapping("gather_from_sequence_parallel_region", x, group,
                    lambda t: _gather(t, axis, group),
                    lambda g: group.reduce_scatter(g, "sum", axis=axis % g.ndim))


def reduce_scatter_to_sequence_parallel_region(x: Tensor, group, axis: int = 1) -> Tensor:
    """Reduce-scatter SUM along the sequence ``axis``; backward all-gathers."""
    def forward(t):
        part_size(t.shape[axis % t.ndim], group.world_size,  # equal parts, as Megatron's
                  f"reduce-scatter of axis {axis} of shape {t.shape}")
        return group.reduce_scatter(t, "sum", axis=axis % t.ndim)
    return _mapping("reduce_scatter_to_sequence_parallel_region", x, group, forward,
                    lambda g: _gather(g, axis, group))
