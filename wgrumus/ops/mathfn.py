"""Elementwise math beyond the core table: erf, log2 / log10 / exp2, log1p / expm1, the trig and
hyperbolic families, atan2, logaddexp, lerp, nan_to_num, the square root of distances. One map
kernel forward, one backward each."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import needs_grad, record
from ..tensor import Tensor, float16, float32, int32
from .activations import unary_map
from .elementwise import _scalar_as_tensor, _wrap, add, cast, map_op, mul, sub, unbroadcast

_LN2, _LN10 = 0.6931471805599453, 2.302585092994046
# name: (forward of a, backward of g = a, x = b, out = c)
MATH = {
    "erf": ("erf_(a)", "a * 1.1283791670955126 * exp(-b * b)"),
    "erfc": ("1.0 - erf_(a)", "-a * 1.1283791670955126 * exp(-b * b)"),
    "log2": ("log2(a)", f"a / (b * {_LN2})"),
    "log10": (f"log(a) / {_LN10}", f"a / (b * {_LN10})"),
    "exp2": ("exp2(a)", f"a * c * {_LN2}"),
    "expm1": ("expm1_(a)", "a * (c + 1.0)"),
    "log1p": ("log1p_(a)", "a / (1.0 + b)"),
    "tan": ("tan(a)", "a * (1.0 + c * c)"),
    # through atan2: some drivers' asin / acos are off by 1e-4
    "asin": ("select(atan2(a, sqrt((1.0 - a) * (1.0 + a))), nan_(), abs(a) > 1.0)",
             "a * inverseSqrt(1.0 - b * b)"),
    "acos": ("select(atan2(sqrt((1.0 - a) * (1.0 + a)), a), nan_(), abs(a) > 1.0)",
             "-a * inverseSqrt(1.0 - b * b)"),
    "atan": ("atan(a)", "a / (1.0 + b * b)"),
    "sinh": ("sinh(a)", "a * cosh(b)"),
    "cosh": ("cosh(a)", "a * sinh(b)"),
    "asinh": ("asinh(a)", "a * inverseSqrt(b * b + 1.0)"),
    "acosh": ("select(acosh(a), nan_(), a < 1.0)", "a * inverseSqrt(b * b - 1.0)"),
    "atanh": ("select(select(atanh(a), nan_(), abs(a) > 1.0), select(bitcast<f32>(0xff800000u), "
              "bitcast<f32>(0x7f800000u), a > 0.0), abs(a) == 1.0)",
              "a / (1.0 - b * b)"),
    "deg2rad": ("a * 0.017453292519943295", "a * 0.017453292519943295"),
    "rad2deg": ("a * 57.29577951308232", "a * 57.29577951308232"),
    "logit": ("log(a / (1.0 - a))", "a / (b * (1.0 - b))"),
    "sinc": ("select(sin(3.141592653589793 * a) / (3.141592653589793 * a), 1.0, a == 0.0)",
             "select(a * (cos(3.141592653589793 * b) - c) / b, 0.0, b == 0.0)"),
}


def _make(name):
    fwd, bwd = MATH[name]

    def f(x: Tensor) -> Tensor:
        return unary_map(name, x, fwd, bwd)
    f.__name__ = name
    f.__doc__ = f"Elementwise {name} (WGSL: {fwd})."
    return f


(erf, erfc, log2, log10, exp2, expm1, log1p, tan, asin, acos, atan, sinh, cosh, asinh, acosh,
 atanh, deg2rad, rad2deg, logit, sinc) = (_make(n) for n in MATH)
arcsin, arccos, arctan, arcsinh, arccosh, arctanh = asin, acos, atan, asinh, acosh, atanh


def _pair(a, b):
    """Two operands as float32 tensors on one device (scalars uploaded as 0-d tensors)."""
    like = a if isinstance(a, Tensor) else b
    a, b = (v if isinstance(v, Tensor) else _wrap(v, like) if _wrap(v, like) is not None
            else _scalar_as_tensor(float(v), like) for v in (a, b))
    return (a if a.dtype == float32 else cast(a, float32),
            b if b.dtype == float32 else cast(b, float32))


def _binary(name, a, b, fwd, ga_expr, gb_expr) -> Tensor:
    """out = fwd(a, b); gradients ga_expr / gb_expr of (a = g, b = x, c = y)."""
    x, y = _pair(a, b)
    out = map_op(fwd, [x, y])
    if needs_grad(x, y):
        def bw(g):
            return (unbroadcast(map_op(ga_expr, [g, x, y]), x.shape) if x.requires_grad
                    else None,
                    unbroadcast(map_op(gb_expr, [g, x, y]), y.shape) if y.requires_grad
                    else None)
        record(name, out, [x, y], bw, saved=[x, y])
    return out


def atan2(y, x) -> Tensor:
    """The angle of (x, y), quadrant-aware (PyTorch's argument order: y first)."""
    return _binary("atan2", y, x, "atan2(a, b)", "a * c / (b * b + c * c)",
                   "-a * b / (b * b + c * c)")


arctan2 = atan2


def hypot(a, b) -> Tensor:
    return _binary("hypot", a, b, "sqrt(a * a + b * b)", "a * b / sqrt(b * b + c * c)",
                   "a * c / sqrt(b * b + c * c)")


def logaddexp(a, b) -> Tensor:
    """log(exp(a) + exp(b)) without overflow."""
    return _binary("logaddexp", a, b,
                   "select(max(a, b) + log1p_(exp(-abs(a - b))), a, a == b)",
                   "a * sigmoid_(b - c)", "a * sigmoid_(c - b)")


def xlogy(a, b) -> Tensor:
    """a * log(b), 0 where a == 0 (unless b is NaN)."""
    return _binary("xlogy", a, b, "select(a * log(b), 0.0, a == 0.0 && !isnan_(b))",
                   "select(a * log(c), 0.0, b == 0.0 && !isnan_(c))", "a * b / c")


def lerp(start, end, weight) -> Tensor:
    """start + weight * (end - start); ``weight`` a number or a tensor."""
    if not isinstance(weight, Tensor):
        w = float(weight)
        if abs(w) < 0.5:
            return add(start, mul(sub(end, start), w))
        return sub(end, mul(sub(end, start), 1.0 - w))  # PyTorch's form for weight >= 0.5
    s, e = _pair(start, end)
    w = weight if weight.dtype == float32 else cast(weight, float32)
    out = map_op("select(a + c * (b - a), b - (b - a) * (1.0 - c), abs(c) >= 0.5)", [s, e, w])
    if needs_grad(s, e, w):
        def bw(g):
            return (unbroadcast(map_op("a * (1.0 - b)", [g, w]), s.shape) if s.requires_grad
                    else None,
                    unbroadcast(map_op("a * b", [g, w]), e.shape) if e.requires_grad else None,
                    unbroadcast(map_op("a * (c - b)", [g, s, e]), w.shape) if w.requires_grad
                    else None)
        record("lerp", out, [s, e, w], bw, saved=[s, e, w])
    return out


def nan_to_num(x: Tensor, nan: float = 0.0, posinf=None, neginf=None) -> Tensor:
    """NaN -> nan, inf -> posinf (default the dtype's largest), -inf -> neginf; the gradient
    passes where x was finite."""
    if x.dtype == int32:
        return map_op("a", [x], dtype=int32)
    big = float(np.finfo(np.float16 if x.dtype == float16 else np.float32).max)
    s = {"nv": float(nan), "pv": big if posinf is None else float(posinf),
         "mv": -big if neginf is None else float(neginf)}
    return unary_map("nan_to_num", x,
                     "select(select(select(a, mv, a == bitcast<f32>(0xff800000u)), pv, "
                     "a == bitcast<f32>(0x7f800000u)), nv, isnan_(a))",
                     "select(0.0, a, abs(b) < bitcast<f32>(0x7f800000u))", s)


def distance_sqrt(x: Tensor) -> Tensor:
    """sqrt(max(x, 0)) of squared distances, with PyTorch's zero gradient at 0 (cdist)."""
    return unary_map("cdist", x, "sqrt(max(a, 0.0))", "select(a * 0.5 / c, 0.0, c == 0.0)")


__all__ = ["acos", "acosh", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctan2",
           "arctanh", "asin", "asinh", "atan", "atan2", "atanh", "cosh", "deg2rad", "erf",
           "erfc", "exp2", "expm1", "hypot", "lerp", "log10", "log1p", "log2", "logaddexp",
           "logit", "nan_to_num", "rad2deg", "sinc", "sinh", "tan", "xlogy"]
