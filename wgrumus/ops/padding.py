"""F.pad: constant (negative pads crop), reflect, replicate and circular padding of the last
dims. Constant padding is a fill and one strided copy; the other modes gather each padded dim
through index_select (the index is the pad's geometry, built on the host; the data never
leaves the device)."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import record
from ..runtime.errors import ShapeError
from ..tensor import Tensor, int32
from .elementwise import copy_into, fill_
from .indexing import index_select
from .shape import _index_view, getitem

MODES = ("constant", "reflect", "replicate", "circular")


def _pairs(x: Tensor, pad) -> list:
    """PyTorch's flat pad tuple (last dim first) as [(dim, left, right)]."""
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise ShapeError(f"pad: the padding {pad} must have an even length (left, right per dim)")
    if len(pad) // 2 > x.ndim:
        raise ShapeError(f"pad: {len(pad) // 2} dims of padding for a tensor with {x.ndim} dims")
    return [(x.ndim - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]


def _index(mode: str, n: int, lo: int, hi: int) -> np.ndarray:
    i = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    if mode == "circular":
        return i % n
    return (n - 1) - np.abs((n - 1) - np.abs(i))  # reflect: no edge repeat


def pad(x: Tensor, pad, mode: str = "constant", value=0.0) -> Tensor:
    """torch.nn.functional.pad."""
    if mode not in MODES:
        raise ValueError(f"pad: mode must be one of {MODES}, got {mode!r}")
    pairs = _pairs(x, pad)
    if mode != "constant":
        for d, lo, hi in pairs:
            n = x.shape[d]
            if lo < 0 or hi < 0:
                raise ShapeError(f"pad: negative padding crops only in 'constant' mode, got "
                                 f"({lo}, {hi}) on dim {d} in {mode!r}")
            limit = n - 1 if mode == "reflect" else n
            if n == 0 or max(lo, hi) > limit:
                what = "size - 1" if mode == "reflect" else "the size"
                raise ShapeError(f"pad: {mode} padding ({lo}, {hi}) on dim {d} of size {n} must "
                                 f"be at most {limit} ({what})")
            if lo or hi:
                x = index_select(x, d, _index(mode, n, lo, hi).astype(np.int32))
        return x
    crop = [slice(None)] * x.ndim
    for d, lo, hi in pairs:
        crop[d] = slice(max(-lo, 0), x.shape[d] - max(-hi, 0))
    if any(s != slice(None) for s in crop):
        x = getitem(x, tuple(crop))
    shape = list(x.shape)
    inner = [slice(None)] * x.ndim
    for d, lo, hi in pairs:
        shape[d] = x.shape[d] + max(lo, 0) + max(hi, 0)
        inner[d] = slice(max(lo, 0), max(lo, 0) + x.shape[d])
    if tuple(shape) == x.shape:
        return x
    out = Tensor.empty(shape, x.device, x.dtype)
    fill_(out, int(value) if x.dtype == int32 else value)
    inner = tuple(inner)
    copy_into(out._view(*_index_view(out, inner)), x)
    record("pad", out, [x], lambda g: (getitem(g, inner),))
    return out


__all__ = ["pad"]
