"""argsort and unique: a bitonic sort on the device (shaders/sort.wgsl, log2(P) (log2(P) + 1) / 2
passes for rows padded to P = a power of two), stable (equal keys keep their order), NaN last
ascending and first descending as in PyTorch. sort / topk / kthvalue / median gather the values
by these indices (wgrumus/composite/sorting.py), so their gradient is gather's."""
from __future__ import annotations

from ..kernels import sort as sort_kernels
from ..kernels.map import run_map
from ..tensor import Tensor, float32, int32
from .compaction import flat_nonzero
from .elementwise import cast, contiguous, copy_into, fill_
from .indexing import gather
from .scan import cumsum
from .scatter import scatter
from .shape import _norm_axis, cat, permute


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


def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    x, d, scalar = _prepare(x, dim)
    idx = _sorted_indices(x, d, descending)
    return idx.reshape(()) if scalar else idx


def unique(x: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim=None):
    """The distinct values, ascending (a sort, the positions where the value changes, a
    compaction; the count of distinct values is read back to size the result)."""
    if dim is not None:
        raise NotImplementedError("unique(dim=...) is not supported; flatten first")
    flat = x.reshape((-1,))
    n = flat.numel()
    order = _sorted_indices(flat, 0, False)
    v = gather(flat, 0, order)
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


__all__ = ["argsort", "unique"]
