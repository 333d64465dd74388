"""sort / argsort / topk / kthvalue / median / msort: a bitonic sort on the device
(shaders/sort.wgsl, log2(P) (log2(P) + 1) / 2 passes for rows padded to P = a power of two),
stable (equal keys keep their order), NaN last ascending and first descending as in PyTorch.
Values are gathered from the input by the indices, so their gradient is gather's."""
from __future__ import annotations

from collections import namedtuple

from ..kernels import sort as sort_kernels
from ..kernels.map import run_map
from ..tensor import Tensor, float32, int32
from .compaction import flat_nonzero
from .elementwise import cast, contiguous, copy_into, fill_, where
from .indexing import gather
from .logical import isnan
from .scan import cumsum
from .scatter import scatter
from .shape import _norm_axis, cat, permute

SortResult = namedtuple("SortResult", ["values", "indices"])  # torch.return_types.sort


def _sorted_indices(x: Tensor, d: int, descending: bool) -> Tensor:
    """int32 indices along dim d that sort x (stable)."""
    order = [k for k in range(x.ndim) if k != d] + [d]
    xt = permute(x, order) if d != x.ndim - 1 else x
    L = x.shape[d]
    R = x.numel() // L if L else 0
    P = 1 << max(0, (L - 1).bit_length())
    kdt = int32 if x.dtype == int32 else float32
    keys = Tensor.empty((R, P), x.device, kdt)
    idx = Tensor.empty((R, P), x.device, int32)
    if R and L:
        if P > L:
            pad = keys._view((R, P - L), (P, 1), L)
            if kdt == int32:
                fill_(pad, -2 ** 31 if descending else 2 ** 31 - 1)
            else:
                fill_(pad, float("-inf") if descending else float("nan"))
        src = xt if xt.dtype == kdt else cast(xt, kdt)
        copy_into(keys._view((R, L), (P, 1), 0), src.reshape((R, L)))
        run_map("i32(i % u32(P))", idx, [], {"P": P})
        sort_kernels.bitonic(keys, idx, descending)
    out = contiguous(idx._view((R, L), (P, 1), 0)).reshape(xt.shape)
    if d != x.ndim - 1:
        inv = sorted(range(x.ndim), key=order.__getitem__)
        out = contiguous(permute(out, inv))
    return out


def _prepare(x: Tensor, dim):
    if x.ndim == 0:
        return x.reshape((1,)), 0, True
    return x, _norm_axis(dim, x.ndim, "dim"), False


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> SortResult:
    """(values, indices) along ``dim``; always stable here (``stable`` accepted)."""
    x, d, scalar = _prepare(x, dim)
    idx = _sorted_indices(x, d, descending)
    vals = gather(x, d, idx)
    if scalar:
        return SortResult(vals.reshape(()), idx.reshape(()))
    return SortResult(vals, idx)


def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    x, d, scalar = _prepare(x, dim)
    idx = _sorted_indices(x, d, descending)
    return idx.reshape(()) if scalar else idx


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


def unique(x: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim=None):
    """The distinct values, ascending (a sort, the positions where the value changes, a
    compaction; the count of distinct values is read back to size the result)."""
    if dim is not None:
        raise NotImplementedError("unique(dim=...) is not supported; flatten first")
    flat = x.reshape((-1,))
    n = flat.numel()
    v, order = sort(flat)
    if n:
        first = Tensor.empty((n,), x.device, int32)
        fill_(first._view((1,), (1,), 0), 1)
        if n > 1:
            run_map("select(0, 1, a != b)", first._view((n - 1,), (1,), 1),
                    [v._view((n - 1,), (1,), v.offset + 1), v._view((n - 1,), (1,), v.offset)])
        starts = flat_nonzero(first)
    else:
        first = starts = Tensor.empty((0,), x.device, int32)
    vals = gather(v.detach(), 0, starts) if n else v
    out = [vals]
    if return_inverse:
        rank = cumsum(first, 0) - 1 if n else first
        inv = scatter(fill_(Tensor.empty((n,), x.device, int32), 0), 0, order, rank)
        out.append(inv.reshape(x.shape))
    if return_counts:
        ends = cat([starts[1:], fill_(Tensor.empty((1,), x.device, int32), n)], 0) \
            if starts.numel() else starts
        out.append(ends - starts)
    return out[0] if len(out) == 1 else tuple(out)


__all__ = ["argsort", "kthvalue", "median", "msort", "sort", "topk", "unique"]
