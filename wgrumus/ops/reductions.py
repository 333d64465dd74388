"""Reductions beyond sum / mean / max / min with a kernel or a gradient of their own: prod (the
reduce kernel with a product) and the 2-norm, whose gradients follow PyTorch's conventions at
zeros. The others (amax / amin, logsumexp, norms, nansum ...) build on these in
wgrumus/composite/reductions.py."""
from __future__ import annotations

from ..autograd.tape import needs_grad, no_grad, record
from ..kernels.reduce import rows as _row_reduce
from ..tensor import Tensor, float16, float32
from .dims import keep, pick
from .elementwise import cast, fill_, map_op, saved_output, sqrt
from .reduce import _axes, _rows
from .reduce import sum as _sum
from .shape import reshape


def _prod_values(x: Tensor, axes: tuple, keepdims: bool) -> Tensor:
    xt, R, L, kept, kd = _rows(x, axes)
    out = Tensor.empty(kd if keepdims else kept, x.device, x.dtype)
    if R and L:
        _row_reduce("prod", xt, R, L, out, 1.0)
    elif R:
        fill_(out, 1)
    return out


def prod(x: Tensor, dim=None, keepdim: bool = False, *, dtype=None, axis=None,
         keepdims=None) -> Tensor:
    """Product over ``dim`` (None: all elements); int32 multiplies in int32 (wrapping), f16 in
    f32. The gradient is PyTorch's: out / x, and at a zero the product of the others."""
    if dtype is not None:
        x = cast(x, dtype)
    axes, kd = _axes(x, pick(dim, axis)), keep(keepdim, keepdims)
    if x.dtype == float16:
        return cast(_prod_values(cast(x, float32), axes, kd), float16)
    out = _prod_values(x, axes, kd)
    if needs_grad(x):
        kshape = tuple(1 if a in axes else s for a, s in enumerate(x.shape))

        def bw(g):
            zeros = _sum(map_op("select(0.0, 1.0, a == 0.0)", [x]), axes, True)
            others = _prod_values(map_op("select(a, 1.0, a == 0.0)", [x]), axes, True)
            gk = reshape(g, kshape)
            # no zero: g * P / x; at the one zero: g * P(others); two or more: 0
            return (_prod_grad(x, gk, others, zeros),)
        record("prod", out, [x], bw, saved=[x])
    return out


def _prod_grad(x: Tensor, g: Tensor, others: Tensor, zeros: Tensor) -> Tensor:
    gp = map_op("a * b", [g, others])  # g * (product of the non-zero entries)
    return map_op("select(select(0.0, b, c == 1.0 && a == 0.0), b / a, c == 0.0)",
                  [x, gp, zeros], shape=x.shape)


def two_norm(x: Tensor, axes: tuple, keepdims: bool) -> Tensor:
    """sqrt(sum(x^2)) with PyTorch's zero gradient at a zero norm."""
    with _no_grad():
        out = sqrt(_sum(map_op("a * a", [x]), axes, True))
    if needs_grad(x):
        o = saved_output(out)
        record("norm", out, [x], lambda g: (map_op("select(a * b / c, 0.0, c == 0.0)",
                                                   [g, x, o], shape=x.shape),), saved=[x, o])
    if keepdims:
        return out
    return reshape(out, tuple(d for a, d in enumerate(x.shape) if a not in axes))


def _no_grad():
    return no_grad()


__all__ = ["prod", "two_norm"]
