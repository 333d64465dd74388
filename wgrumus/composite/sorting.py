"""sort / topk / kthvalue / median / msort: ops' argsort (the device's bitonic sort), then the
values gathered from the input by the indices, so their gradient is gather's."""
from __future__ import annotations

from collections import namedtuple

from ..ops.elementwise import contiguous, fill_, where
from ..ops.indexing import gather
from ..ops.sorting import _prepare, _sorted_indices
from ..tensor import Tensor, int32
from .logical import isnan

SortResult = namedtuple("SortResult", ["values", "indices"])  # torch.return_types.sort


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> SortResult:
    """(values, indices) along ``dim``; always stable here (``stable`` accepted)."""
    x, d, scalar = _prepare(x, dim)
    idx = _sorted_indices(x, d, descending)
    vals = gather(x, d, idx)
    if scalar:
        return SortResult(vals.reshape(()), idx.reshape(()))
    return SortResult(vals, idx)


def msort(x: Tensor) -> Tensor:
    return sort(x, 0).values


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) \
        -> SortResult:  # noqa: A002
    """The k largest (smallest) entries along ``dim`` and their indices, in order."""
    x, d, scalar = _prepare(x, dim)
    L = x.shape[d]
    if not 0 <= k <= L:
        raise IndexError(f"topk: k ({k}) is out of range for dim {d} of size {L}")
    idx = _sorted_indices(x, d, largest)
    idx = contiguous(idx[(slice(None),) * d + (slice(0, k),)])
    vals = gather(x, d, idx)
    return SortResult(vals, idx)


def kthvalue(x: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> SortResult:
    """The k-th smallest entry (1-based) along ``dim`` and its index."""
    x, d, scalar = _prepare(x, dim)
    L = x.shape[d]
    if not 1 <= k <= L:
        raise IndexError(f"kthvalue: k ({k}) is out of range for dim {d} of size {L}")
    idx = _sorted_indices(x, d, False)
    idx = contiguous(idx[(slice(None),) * d + (slice(k - 1, k),)])
    vals = gather(x, d, idx)
    if not keepdim:
        vals, idx = vals.squeeze(d), idx.squeeze(d)
    return SortResult(vals, idx)


def median(x: Tensor, dim=None, keepdim: bool = False):
    """PyTorch's median: the lower of the two middle values (no averaging); with ``dim``,
    (values, indices)."""
    if dim is None:
        flat = x.reshape((-1,))
        n = flat.numel()
        if n == 0:
            return fill_(Tensor.empty((), x.device, x.dtype), float("nan"))
        nan_first = sort(flat, 0, descending=True).values[0:1] if x.dtype != int32 else None
        v = kthvalue(flat, (n - 1) // 2 + 1, 0).values
        if nan_first is not None:  # any NaN makes the median NaN, as in PyTorch
            return where(isnan(nan_first.reshape(())), nan_first.reshape(()), v)
        return v
    x, d, _ = _prepare(x, dim)
    return kthvalue(x, (x.shape[d] - 1) // 2 + 1, d, keepdim)


__all__ = ["kthvalue", "median", "msort", "sort", "topk"]
