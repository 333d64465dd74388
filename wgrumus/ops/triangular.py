"""tril / triu (the last two dims, any batch): map kernels that read the row and column from the
output's linear index; diagonal (a strided view) and diag_embed (a copy into zeros)."""
from __future__ import annotations

from ..autograd.tape import needs_grad, record
from ..runtime.errors import ShapeError
from ..tensor import Tensor
from .creation import zeros
from .elementwise import copy_into, map_op
from .shape import _norm_axis

_COL = "i32(i % u32(W))"
_ROW = "i32((i / u32(W)) % u32(H))"


def _triangle(name: str, x: Tensor, diagonal: int, keep: str) -> Tensor:
    if x.ndim < 2:
        raise ShapeError(f"{name} needs a tensor with at least 2 dims, got shape {x.shape}")
    expr = f"select(0, a, {keep})"
    s = {"W": x.shape[-1], "H": x.shape[-2], "k": int(diagonal)}
    out = map_op(expr, [x], shape=x.shape, dtype=x.dtype, scalars=s)
    if needs_grad(x):
        record(name, out, [x], lambda g: (map_op(expr, [g], scalars=s),))
    return out


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """Zero above diagonal ``diagonal`` (0: the main one, > 0 above it)."""
    return _triangle("tril", x, diagonal, f"{_COL} - {_ROW} <= k")


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """Zero below diagonal ``diagonal``."""
    return _triangle("triu", x, diagonal, f"{_COL} - {_ROW} >= k")


def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of dims (dim1, dim2) as a strided view, appended as the last dim."""
    d1, d2 = _norm_axis(dim1, x.ndim, "dim"), _norm_axis(dim2, x.ndim, "dim")
    if d1 == d2:
        raise ShapeError(f"diagonal: dim1 and dim2 are both {d1}")
    n1, n2 = x.shape[d1], x.shape[d2]
    n = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    off = x.offset + (offset * x.strides[d2] if offset >= 0 else -offset * x.strides[d1])
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    shape = tuple(x.shape[k] for k in rest) + (n,)
    strides = tuple(x.strides[k] for k in rest) + (x.strides[d1] + x.strides[d2],)
    out = x._view(shape, strides, off if n else x.offset)
    in_shape = x.shape

    def bw(g):
        gx = zeros(in_shape, device=g.device)
        copy_into(diagonal(gx, offset, d1, d2), g)
        return (gx,)
    record("diagonal", out, [x], bw)
    return out


def diag_embed(x: Tensor, offset: int = 0) -> Tensor:
    """A batch of square matrices with x's last dim on diagonal ``offset``."""
    n = x.shape[-1] + abs(int(offset))
    out = zeros(x.shape[:-1] + (n, n), device=x.device, dtype=x.dtype)
    copy_into(diagonal(out, offset, -2, -1), x)
    if needs_grad(x):
        record("diag_embed", out, [x], lambda g: (diagonal(g, offset, -2, -1),))
    return out


__all__ = ["diag_embed", "diagonal", "tril", "triu"]
