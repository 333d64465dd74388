"""Scans along a dim: cumsum, cumprod. Hillis-Steele passes of the map kernel over shifted
views (log2(L) passes of two launches each, no loop in any shader, any length). cumprod's
gradient solves its recurrence S_k = g_k + x_{k+1} S_{k+1} with the same passes (an affine
scan), so zeros in x give PyTorch's exact gradient rather than a division by zero."""
from __future__ import annotations

from ..autograd.tape import needs_grad, record
from ..kernels.map import run_map
from ..tensor import Tensor, float16, float32
from .elementwise import cast, copy_into, fill_
from .shape import _index_view, _norm_axis


def _cut(x: Tensor, d: int, lo, hi) -> Tensor:
    """The view x[..., lo:hi, ...] along dim d (no autograd)."""
    return x._view(*_index_view(x, (slice(None),) * d + (slice(lo, hi),)))


def _fresh(x: Tensor, dtype=None) -> Tensor:
    return Tensor.empty(x.shape, x.device, dtype or x.dtype)


def scan(x: Tensor, d: int, expr: str, reverse: bool = False) -> Tensor:
    """Inclusive scan of ``x`` along dim ``d`` with the associative ``expr`` of (a, b): a the
    element, b the partial result ``s`` places before (after, when ``reverse``)."""
    L = x.shape[d]
    if L < 2:  # no pass: the result is a copy
        return copy_into(_fresh(x), x)
    cur, s = x, 1  # the first pass reads x itself
    while s < L:
        nxt = _fresh(x)
        if reverse:
            copy_into(_cut(nxt, d, L - s, L), _cut(cur, d, L - s, L))
            run_map(expr, _cut(nxt, d, 0, L - s), [_cut(cur, d, 0, L - s), _cut(cur, d, s, L)])
        else:
            copy_into(_cut(nxt, d, 0, s), _cut(cur, d, 0, s))
            run_map(expr, _cut(nxt, d, s, L), [_cut(cur, d, s, L), _cut(cur, d, 0, L - s)])
        cur, s = nxt, 2 * s
    return cur


def _prepare(x: Tensor, dim, dtype):
    if dtype is not None:
        x = cast(x, dtype)
    d = _norm_axis(dim, x.ndim, "dim")
    if x.ndim == 0:
        return x.reshape((1,)), 0, True
    return x, d, False


def cumsum(x: Tensor, dim: int, dtype=None) -> Tensor:
    """Running sums along ``dim`` (int32 stays int32, wrapping past 2^31; f16 accumulates in
    f32)."""
    x, d, scalar = _prepare(x, dim, dtype)
    half = x.dtype == float16
    xs = cast(x, float32) if half else x
    out = scan(xs, d, "a + b")
    if half:
        out = cast(out, float16)
    elif needs_grad(x):
        record("cumsum", out, [x], lambda g: (scan(g, d, "a + b", reverse=True),))
    return out.reshape(()) if scalar else out


def _shift(x: Tensor, d: int, by: int, fill) -> Tensor:
    """x moved ``by`` (+1 / -1) places along d, the vacated end filled with ``fill``."""
    L = x.shape[d]
    out = _fresh(x)
    if by > 0:
        fill_(_cut(out, d, 0, 1), fill)
        copy_into(_cut(out, d, 1, L), _cut(x, d, 0, L - 1))
    else:
        fill_(_cut(out, d, L - 1, L), fill)
        copy_into(_cut(out, d, 0, L - 1), _cut(x, d, 1, L))
    return out


def _cumprod_grad(x: Tensor, out: Tensor, g: Tensor, d: int) -> Tensor:
    """d/dx_k = (prod_{i<k} x_i) * S_k, S_k = g_k + x_{k+1} S_{k+1}: exact with zeros."""
    L = x.shape[d]
    c = _fresh(g, float32)
    copy_into(c, g)
    m = _shift(x, d, -1, 0.0)  # m_k = x_{k+1}, 0 past the end
    s = 1
    while s < L:  # S_k = c_k + m_k S_{k+s}
        c2, m2 = _fresh(c), _fresh(m)
        copy_into(_cut(c2, d, L - s, L), _cut(c, d, L - s, L))
        copy_into(_cut(m2, d, L - s, L), _cut(m, d, L - s, L))
        run_map("a + b * c", _cut(c2, d, 0, L - s),
                [_cut(c, d, 0, L - s), _cut(m, d, 0, L - s), _cut(c, d, s, L)])
        run_map("a * b", _cut(m2, d, 0, L - s), [_cut(m, d, 0, L - s), _cut(m, d, s, L)])
        c, m, s = c2, m2, 2 * s
    excl = _shift(out, d, 1, 1.0)  # prod_{i<k} x_i
    return run_map("a * b", _fresh(c), [excl, c])


def cumprod(x: Tensor, dim: int, dtype=None) -> Tensor:
    """Running products along ``dim``; the gradient is exact where x has zeros."""
    x, d, scalar = _prepare(x, dim, dtype)
    half = x.dtype == float16
    xs = cast(x, float32) if half else x
    out = scan(xs, d, "a * b")
    if half:
        out = cast(out, float16)
    elif needs_grad(x) and x.shape[d]:
        o = Tensor(out.storage, out.shape, out.strides, out.offset, out.dtype)
        record("cumprod", out, [x], lambda g: (_cumprod_grad(x, o, g, d),), saved=[x, o])
    return out.reshape(()) if scalar else out


__all__ = ["cumprod", "cumsum"]
