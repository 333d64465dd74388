"""Constant padding of the last dims (F.pad's default mode; negative pads crop): a fill and one
strided copy, whose backward is the slice of the gradient. F.pad's other modes gather through
index_select (wgrumus/nn/functional/padding.py)."""
from __future__ import annotations

from ..autograd.tape import record
from ..runtime.errors import ShapeError
from ..tensor import Tensor, int32
from .elementwise import copy_into, fill_
from .shape import _index_view, getitem


def pad_pairs(x: Tensor, pad) -> list:
    """PyTorch's flat pad tuple (last dim first) as [(dim, left, right)]."""
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise ShapeError(f"pad: the padding {pad} must have an even length (left, right per dim)")
    if len(pad) // 2 > x.ndim:
        raise ShapeError(f"pad: {len(pad) // 2} dims of padding for a tensor with {x.ndim} dims")
    return [(x.ndim - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]


def constant_pad(x: Tensor, pad, value=0.0) -> Tensor:
    """F.pad(x, pad, "constant", value): ``value`` around x, negative widths crop."""
    pairs = pad_pairs(x, pad)
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


__all__ = ["constant_pad"]
