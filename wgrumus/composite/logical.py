"""Masks and predicates. There is no bool dtype on WebGPU: a mask is a float32 tensor of
1.0 / 0.0 (what comparisons return). ``& | ^ ~`` on masks are logical; on int32 tensors they
are bitwise, as in PyTorch. Also isnan / isinf / isfinite, isclose / allclose, any / all,
masked_fill, each an expression for ops' map op (any / all then a sum), and masked_select /
argwhere over ops' device compaction."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import is_grad_enabled
from ..kernels.map import broadcast_shapes
from ..ops.compaction import flat_nonzero, nonzero
from ..ops.elementwise import _f32, cast, copy_into, map_op, where
from ..ops.indexing import index_select
from ..ops.reduce import sum as _sum
from ..runtime.errors import ShapeError
from ..tensor import Tensor, float16, float32, int32, tensor

_TRUE = "select(0.0, 1.0, {})"


def _operand(v, like: Tensor) -> Tensor:
    if isinstance(v, Tensor):
        return v
    a = np.asarray(v)
    if a.dtype == np.bool_:
        a = a.astype(np.float32)
    dt = int32 if a.dtype.kind in "iu" and like.dtype == int32 else float32
    return tensor(a.astype(dt), device=like.device, dtype=dt)


def _bitwise_or_logical(name: str, int_expr: str, logic: str, a, b) -> Tensor:
    like = a if isinstance(a, Tensor) else b
    a, b = _operand(a, like), _operand(b, like)
    if a.dtype == int32 and b.dtype == int32:
        return map_op(int_expr, [a, b], dtype=int32)
    return _logical(logic, a, b)


def _logical(logic: str, a: Tensor, b: Tensor) -> Tensor:
    return map_op(_TRUE.format(logic), [a, b])


def bitwise_and(a, b) -> Tensor:
    return _bitwise_or_logical("and", "a & b", "a != 0 && b != 0", a, b)


def bitwise_or(a, b) -> Tensor:
    return _bitwise_or_logical("or", "a | b", "a != 0 || b != 0", a, b)


def bitwise_xor(a, b) -> Tensor:
    return _bitwise_or_logical("xor", "a ^ b", "(a != 0) != (b != 0)", a, b)


def bitwise_not(x: Tensor) -> Tensor:
    """~x: bitwise on int32, logical on a mask."""
    if x.dtype == int32:
        return map_op("~a", [x], dtype=int32)
    return map_op(_TRUE.format("a == 0"), [x])


def _pair(a, b):
    like = a if isinstance(a, Tensor) else b
    return _operand(a, like), _operand(b, like)


def logical_and(a, b) -> Tensor:
    return _logical("a != 0 && b != 0", *_pair(a, b))


def logical_or(a, b) -> Tensor:
    return _logical("a != 0 || b != 0", *_pair(a, b))


def logical_xor(a, b) -> Tensor:
    return _logical("(a != 0) != (b != 0)", *_pair(a, b))


def logical_not(x: Tensor) -> Tensor:
    return map_op(_TRUE.format("a == 0"), [x])


def _float_test(x: Tensor, cond: str, on_int: str) -> Tensor:
    """1.0 where the float predicate ``cond`` holds; int32 values are never NaN or infinite, so
    the mask is the constant ``on_int``."""
    if x.dtype == int32:
        return map_op(on_int, [x])
    return map_op(_TRUE.format(cond), [x])


def isnan(x: Tensor) -> Tensor:
    return _float_test(x, "isnan_(f32(a))", "0.0")


def isinf(x: Tensor) -> Tensor:
    return _float_test(x, "abs(f32(a)) == bitcast<f32>(0x7f800000u)", "0.0")


def isposinf(x: Tensor) -> Tensor:
    return _float_test(x, "f32(a) == bitcast<f32>(0x7f800000u)", "0.0")


def isneginf(x: Tensor) -> Tensor:
    return _float_test(x, "f32(a) == bitcast<f32>(0xff800000u)", "0.0")


def isfinite(x: Tensor) -> Tensor:
    return _float_test(x, "abs(f32(a)) < bitcast<f32>(0x7f800000u)", "1.0")


def isclose(a, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    """|a - b| <= atol + rtol |b| (equal infinities close; NaN only with equal_nan)."""
    a, b = _pair(a, b)
    a, b = _f32(a), _f32(b)
    nan = " || (isnan_(a) && isnan_(b))" if equal_nan else ""
    return map_op(_TRUE.format(f"a == b || abs(a - b) <= at + rt * abs(b){nan}"), [a, b],
                  scalars={"at": float(atol), "rt": float(rtol)})


def allclose(a, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    """isclose everywhere, as a Python bool (reads one number back)."""
    return bool(all_(isclose(a, b, rtol, atol, equal_nan)).item())


def equal(a: Tensor, b: Tensor) -> bool:
    """Same shape and the same values (a Python bool)."""
    return tuple(a.shape) == tuple(b.shape) and bool(all_(map_op(
        _TRUE.format("a == b"), [a, b])).item())


def any_(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """1.0 where some element along ``dim`` is non-zero (NaN counts), else 0.0."""
    s = _sum(map_op(_TRUE.format("f32(a) != 0.0"), [x]), dim, keepdim)
    return map_op(_TRUE.format("a > 0.0"), [s])


def all_(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """1.0 where every element along ``dim`` is non-zero (true for an empty dim), else 0.0."""
    s = _sum(map_op(_TRUE.format("f32(a) == 0.0"), [x]), dim, keepdim)
    return map_op(_TRUE.format("a == 0.0"), [s])


def masked_fill(x: Tensor, mask, value) -> Tensor:
    """``value`` where ``mask`` (broadcast to x) is true, else x; x's dtype kept. A 0-d tensor
    value takes part in autograd."""
    m = _operand(mask, x)
    if isinstance(value, Tensor) and value.ndim:
        raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got shape "
                         f"{value.shape}")
    if broadcast_shapes(m.shape, x.shape) != x.shape:
        raise ShapeError(f"masked_fill: mask of shape {m.shape} does not broadcast to the "
                         f"input's shape {x.shape}")
    if x.dtype == int32:
        if isinstance(value, Tensor):
            value = value.item()
        if isinstance(value, float) and value != int(value):
            raise TypeError("masked_fill: a fractional value for an int32 tensor")
        return where(m, int(value), x)
    if x.dtype == float16:
        v = value.item() if isinstance(value, Tensor) else float(value)
        return map_op("select(a, f16(v), b != 0.0)", [x, _f32(m)], dtype=float16,
                      scalars={"v": v})
    return where(m, value if isinstance(value, Tensor) else float(value), x)


def masked_fill_(x: Tensor, mask, value) -> Tensor:
    """masked_fill in place (refused on a tensor that requires grad, outside no_grad)."""
    if x.requires_grad and is_grad_enabled():
        raise RuntimeError("masked_fill_ on a tensor that requires grad; use masked_fill or "
                           "wrap it in wr.no_grad()")
    r = masked_fill(x, mask, value)
    copy_into(x, r if r.dtype == x.dtype else cast(r, x.dtype))
    return x


def argwhere(x: Tensor) -> Tensor:
    return nonzero(x)


def masked_select(x: Tensor, mask) -> Tensor:
    """The entries of x where mask (broadcast with x) is true, as a 1-D tensor; differentiable
    in x (an index_select by the device-found positions)."""
    m = _operand(mask, x)
    shape = broadcast_shapes(x.shape, m.shape)
    lin = flat_nonzero(m.expand(shape) if m.shape != shape else m)
    xs = x.expand(shape) if x.shape != shape else x
    return index_select(xs.reshape((-1,)), 0, lin)


__all__ = ["all_", "allclose", "any_", "argwhere", "bitwise_and", "bitwise_not", "bitwise_or",
           "bitwise_xor", "equal", "isclose", "isfinite", "isinf", "isnan", "isneginf",
           "isposinf", "logical_and", "logical_not", "logical_or", "logical_xor", "masked_fill",
           "masked_fill_", "masked_select"]
