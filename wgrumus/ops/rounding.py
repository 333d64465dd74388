"""Rounding and sign: floor, ceil, round (half to even, ``decimals``), trunc, sign. int32 stays
int32 (unchanged, or its sign); the gradient is zero, as in PyTorch."""
from __future__ import annotations

from ..autograd.tape import needs_grad, record
from ..tensor import Tensor, float16, int32
from .elementwise import cast, map_op


def _zero_grad_map(name: str, x: Tensor, expr: str, scalars=None) -> Tensor:
    """expr(a) computed in f32 (f16 stays f16), with a zero gradient."""
    if x.dtype == float16:
        return cast(map_op(expr, [cast(x, "float32")], scalars=scalars or {}), float16)
    out = map_op(expr, [x], scalars=scalars or {})
    if needs_grad(x):
        record(name, out, [x], lambda g: (map_op("0.0", [g]),))
    return out


def _rounder(name: str, expr: str):
    def f(x: Tensor) -> Tensor:
        if x.dtype == int32:
            return map_op("a", [x], dtype=int32)  # integers are already whole (a copy)
        return _zero_grad_map(name, x, expr)
    f.__name__ = name
    f.__doc__ = f"Elementwise {name} (WGSL {expr}); zero gradient."
    return f


floor = _rounder("floor", "floor(a)")
ceil = _rounder("ceil", "ceil(a)")
trunc = _rounder("trunc", "trunc(a)")
fix = trunc


def round(x: Tensor, decimals: int = 0) -> Tensor:  # noqa: A001
    """Round half to even (WGSL's round, PyTorch's rule); ``decimals`` scales by 10**decimals
    first, as PyTorch does."""
    if x.dtype == int32:
        return map_op("a", [x], dtype=int32)
    if decimals == 0:
        return _zero_grad_map("round", x, "round(a)")
    return _zero_grad_map("round", x, "round(a * p) / p", {"p": float(10.0 ** int(decimals))})


def sign(x: Tensor) -> Tensor:
    """-1, 0 or 1 (NaN stays NaN); int32 gives int32."""
    if x.dtype == int32:
        return map_op("sign(a)", [x], dtype=int32)
    return _zero_grad_map("sign", x, "select(sign(a), a, isnan_(a))")


__all__ = ["ceil", "fix", "floor", "round", "sign", "trunc"]
