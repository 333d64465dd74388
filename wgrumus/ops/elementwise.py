"""Elementwise ops: unary, binary (numpy broadcasting), scalar variants, where, casts. Each op
is one table row: its WGSL expression and its backward rule (itself a fused map kernel).
"""
from __future__ import annotations

import numpy as np

from ..autograd.tape import needs_grad, record
from ..kernels.map import broadcast_shapes, run_map
from ..runtime.errors import AdapterLimitError
from ..tensor import Tensor, float32, int32, tensor


def _wrap(x, like: Tensor):
    """Tensors and numpy arrays -> a tensor on ``like``'s device; Python/numpy scalars -> None."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray) and x.ndim > 0:
        return tensor(x, device=like.device)
    return None


def _fresh(shape, like: Tensor, dtype=float32) -> Tensor:
    return Tensor.empty(shape, like.device, dtype)


def saved_output(out: Tensor) -> Tensor:
    """An alias of ``out`` without a node for a backward that reads it (``out`` itself would
    make a cycle only the GC frees, delaying the activations' return to the pool)."""
    return Tensor(out.storage, out.shape, out.strides, out.offset, out.dtype)


def map_op(expr, inputs, shape=None, dtype=float32, scalars=()) -> Tensor:
    shape = broadcast_shapes(*[t.shape for t in inputs]) if shape is None else shape
    return run_map(expr, _fresh(shape, inputs[0], dtype), inputs, scalars)


def unbroadcast(g: Tensor, shape) -> Tensor:
    """Sum ``g`` down to ``shape`` (the inverse of broadcasting in the forward), through
    Tensor.sum (reduce.py builds on this module)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and g.shape[lead + i] != 1)
    r = g.sum(axes, keepdim=True) if axes else g
    return r.reshape(shape)


# name: (forward expr of a, backward: (grad expr of b=grad, a=input, c=output) or None)
UNARY = {
    "neg": ("-a", "-a"),
    "exp": ("exp(a)", "a * c"),
    "log": ("log(a)", "a / b"),
    "sqrt": ("sqrt(a)", "a * 0.5 / c"),
    "rsqrt": ("inverseSqrt(a)", "a * -0.5 * c * c * c"),
    "abs": ("abs(a)", "a * sign(b)"),
    "tanh": ("tanh_(a)", "a * (1.0 - c * c)"),
    "sigmoid": ("1.0 / (1.0 + exp(-a))", "a * c * (1.0 - c)"),
    # NaN passes through relu and its gradient, as in PyTorch (WGSL's max may drop it)
    "relu": ("select(max(a, 0.0), a, isnan_(a))", "select(0.0, a, b > 0.0 || isnan_(b))"),
    "gelu": ("gelu_(a)", "a * gelu_grad_(b)"),
    "gelu_tanh": ("gelu_tanh_(a)", "a * gelu_tanh_grad_(b)"),
    "sin": ("sin(a)", "a * cos(b)"),
    "cos": ("cos(a)", "-a * sin(b)"),
    "square": ("a * a", "2.0 * a * b"),
    "reciprocal": ("1.0 / a", "-a * c * c"),
}


def _unary(name: str, x: Tensor) -> Tensor:
    fwd, bwd = UNARY[name]
    if x.dtype == int32 and name in ("neg", "abs"):
        return map_op(fwd.replace("0.0", "0"), [x], dtype=int32)
    xi = _f32(x)
    out = map_op(fwd, [xi])
    if not needs_grad(x):
        return out
    if name == "neg":
        record(name, out, [x], lambda g: (map_op(bwd, [g]),))
    else:
        o = saved_output(out)
        record(name, out, [x], lambda g: (map_op(bwd, [g, xi, o]),), saved=[xi, o])
    return out


def _make_unary(name):
    def f(x: Tensor) -> Tensor:
        return _unary(name, x)
    f.__name__ = name
    f.__doc__ = f"Elementwise {name} (WGSL: {UNARY[name][0]})."
    return f


neg, exp, log, sqrt, rsqrt, abs_, tanh, sigmoid, relu, sin, cos, square, reciprocal = (
    _make_unary(n) for n in ("neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid",
                             "relu", "sin", "cos", "square", "reciprocal"))


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu" if approximate == "none" else "gelu_tanh", x)


def _f32(x: Tensor) -> Tensor:
    return x if x.dtype == float32 else cast(x, float32)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    x = _f32(x)
    slope = {"slope": float(negative_slope)}
    out = map_op("select(a * slope, a, a > 0.0)", [x], scalars=slope)
    record("leaky_relu", out, [x],
           lambda g: (map_op("select(a * slope, a, b > 0.0)", [g, x], scalars=slope),),
           saved=[x])
    return out


_ANY_NAN = "isnan_(a) || isnan_(b)"
# d maximum(x, y) / dx as an expression of g=a, x=b, y=c: PyTorch's rule (half to each at a tie,
# all to both where either is NaN, since the NaN output came from both); minimum mirrors it.
_PICK_GRAD = {
    "maximum": "select(select(a, 0.5 * a, b == c), 0.0, b < c && !isnan_(b) && !isnan_(c))",
    "minimum": "select(select(a, 0.5 * a, b == c), 0.0, b > c && !isnan_(b) && !isnan_(c))",
}
# name: (float expr, int expr or None)
BINARY = {
    "add": ("a + b", "a + b"),
    "sub": ("a - b", "a - b"),
    "mul": ("a * b", "a * b"),
    "div": ("a / b", None),
    "pow": ("pow_(a, b)", "ipow_(a, b)"),
    "maximum": (f"select(max(a, b), a + b, {_ANY_NAN})", "max(a, b)"),
    "minimum": (f"select(min(a, b), a + b, {_ANY_NAN})", "min(a, b)"),
    # floor division and Python's modulo (sign of the divisor); integer x // 0 and x % 0 give 0
    # as numpy does (WGSL integer division never traps)
    "floordiv": ("floor(a / b)", "select(select(a / b, a / b - 1, (a % b != 0) && ((a < 0) != "
                 "(b < 0))), 0, b == 0)"),
    "remainder": ("a - b * floor(a / b)", "select(select(a % b, a % b + b, (a % b != 0) && "
                  "((a % b < 0) != (b < 0))), 0, b == 0)"),
    "eq": ("select(0.0, 1.0, a == b)", None),
    "ne": ("select(0.0, 1.0, a != b)", None),
    "lt": ("select(0.0, 1.0, a < b)", None),
    "le": ("select(0.0, 1.0, a <= b)", None),
    "gt": ("select(0.0, 1.0, a > b)", None),
    "ge": ("select(0.0, 1.0, a >= b)", None),
}
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
_NO_GRAD = _COMPARE | {"floordiv"}  # piecewise constant: zero gradient, as in PyTorch
_TENSOR_ONLY = {"floordiv", "remainder"}  # no scalar variant: a scalar operand is uploaded


def _binary_backward(name, a, b, out):
    sa, sb = a.shape, b.shape

    def bw(g):
        ga = gb = None
        if name == "add":
            ga, gb = g, g
        elif name == "sub":
            ga, gb = g, map_op("-a", [g])
        elif name == "mul":
            ga = map_op("a * b", [g, b]) if a.requires_grad else None
            gb = map_op("a * b", [g, a]) if b.requires_grad else None
        elif name == "div":
            ga = map_op("a / b", [g, b]) if a.requires_grad else None
            gb = map_op("-a * c / b", [g, b, out]) if b.requires_grad else None
        elif name == "pow":
            # PyTorch's edges: 0 where the exponent is 0; d/dy 0 at x = 0 for y >= 0 (out
            # 0 or 1), -inf for y < 0 (out inf), nan for x < 0 (log)
            ga = (map_op("select(a * c * pow_(b, c - 1.0), 0.0, c == 0.0)", [g, a, b])
                  if a.requires_grad else None)
            gb = (map_op("select(a * b * log(c), 0.0, c == 0.0 && b <= 1.0)", [g, out, a])
                  if b.requires_grad else None)
        elif name in ("maximum", "minimum"):
            ga = map_op(_PICK_GRAD[name], [g, a, b])
            gb = map_op(_PICK_GRAD[name], [g, b, a])
        elif name == "remainder":
            ga = g
            gb = map_op("-a * floor(b / c)", [g, a, b]) if b.requires_grad else None
        return (unbroadcast(ga, sa) if ga is not None and a.requires_grad else None,
                unbroadcast(gb, sb) if gb is not None and b.requires_grad else None)
    return bw


def binary(name: str, a, b) -> Tensor:
    if name in _TENSOR_ONLY:
        a, b = _scalar_as_tensor(a, b), _scalar_as_tensor(b, a)
    if not isinstance(a, Tensor):
        ta = _wrap(a, b)
        if ta is None:
            return _scalar_binary(name, b, a, reverse=True)
        a = ta
    tb = _wrap(b, a)
    if tb is None:
        return _scalar_binary(name, a, b)
    b = tb
    fexpr, iexpr = BINARY[name]
    if a.dtype == int32 and b.dtype == int32 and iexpr is not None:
        return map_op(iexpr, [a, b], dtype=int32)
    if a.dtype == int32 and b.dtype == int32 and name in _COMPARE:
        return map_op(fexpr, [a, b])
    a, b = _f32(a), _f32(b)
    out = map_op(fexpr, [a, b])
    if name not in _NO_GRAD and needs_grad(a, b):
        o = saved_output(out)
        record(name, out, [a, b], _binary_backward(name, a, b, o), saved=[a, b, o])
    return out


def _scalar_as_tensor(x, like):
    """A Python/numpy scalar as a 0-d tensor on ``like``'s device (int32 next to an int32
    tensor when the scalar is an integer), so that the tensor kernels apply."""
    if isinstance(x, Tensor) or not isinstance(like, Tensor):
        return x
    v = np.asarray(x)
    dt = int32 if like.dtype == int32 and v.dtype.kind in "iub" else float32
    return tensor(v.astype(dt), device=like.device, dtype=dt)


# scalar variants: the scalar is a kernel parameter, so changing it never recompiles
_SCALAR = {
    "add": ("a + s", "a + s"), "sub": ("a - s", "s - a"),
    "mul": ("a * s", "a * s"), "div": ("a / s", "s / a"),
    "pow": ("pow_(a, s)", "pow_(s, a)"),
    "maximum": ("select(max(a, s), a, isnan_(a))",) * 2,
    "minimum": ("select(min(a, s), a, isnan_(a))",) * 2,
    "eq": ("select(0.0, 1.0, a == s)",) * 2, "ne": ("select(0.0, 1.0, a != s)",) * 2,
    "lt": ("select(0.0, 1.0, a < s)", "select(0.0, 1.0, s < a)"),
    "le": ("select(0.0, 1.0, a <= s)", "select(0.0, 1.0, s <= a)"),
    "gt": ("select(0.0, 1.0, a > s)", "select(0.0, 1.0, s > a)"),
    "ge": ("select(0.0, 1.0, a >= s)", "select(0.0, 1.0, s >= a)"),
}
_SCALAR_GRAD = {  # d out / d a, as an expression of g=a, x=b, out=c and s
    ("add", False): "a", ("add", True): "a", ("sub", False): "a", ("sub", True): "-a",
    ("mul", False): "a * s", ("mul", True): "a * s",
    ("div", False): "a / s", ("div", True): "-a * c / b",
    ("pow", False): "select(a * s * pow_(b, s - 1.0), 0.0, s == 0.0)",
    ("pow", True): "select(a * c * log(s), 0.0, s == 0.0 && b >= 0.0)",
    ("maximum", False): "select(0.0, a, b >= s || isnan_(b))",
    ("maximum", True): "select(0.0, a, b >= s || isnan_(b))",
    ("minimum", False): "select(0.0, a, b <= s || isnan_(b))",
    ("minimum", True): "select(0.0, a, b <= s || isnan_(b))",
}


def _scalar_binary(name, x: Tensor, s, reverse=False) -> Tensor:
    if isinstance(s, np.ndarray):  # 0-d array
        s = s.item()
    if isinstance(s, (bool, np.bool_)):
        s = int(s)
    if not isinstance(s, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: unsupported operand type {type(s).__name__}")
    if x.dtype == int32 and isinstance(s, (int, np.integer)) and name == "pow":
        if not reverse and s < 0:
            raise ValueError("Integers to negative integer powers are not allowed (int32 "
                             "tensor ** negative int); use a float: x.float() ** s")
        return map_op("ipow_(s, a)" if reverse else "ipow_(a, s)", [x], dtype=int32,
                      scalars={"s": int32_scalar(s, name)})
    if x.dtype == int32 and isinstance(s, (int, np.integer)) and (
            name in ("add", "sub", "mul", "maximum", "minimum") or name in _COMPARE):
        e = _SCALAR[name][1 if reverse else 0]
        if name in ("maximum", "minimum"):
            e = f"{name[:3]}(a, s)"
        return map_op(e, [x], dtype=float32 if name in _COMPARE else int32,
                      scalars={"s": int32_scalar(s, name)})
    if x.dtype == int32 and name in _COMPARE:
        return map_op(_SCALAR[name][1 if reverse else 0].replace("a ", "f32(a) ")
                      .replace(" a)", " f32(a))"), [x], scalars={"s": float(s)})
    x = _f32(x)
    out = map_op(_SCALAR[name][1 if reverse else 0], [x], scalars={"s": float(s)})
    if name not in _COMPARE and needs_grad(x):
        ge, o = _SCALAR_GRAD[(name, reverse)], saved_output(out)
        record(name, out, [x], lambda g: (map_op(ge, [g, x, o], scalars={"s": float(s)}),),
               saved=[x, o])
    return out


def _make_binary(name):
    def f(a, b) -> Tensor:
        return binary(name, a, b)
    f.__name__ = name
    return f


add, sub, mul, div, pow_, maximum, minimum, eq, ne, lt, le, gt, ge = (
    _make_binary(n) for n in ("add", "sub", "mul", "div", "pow", "maximum", "minimum",
                              "eq", "ne", "lt", "le", "gt", "ge"))
floor_divide, remainder = _make_binary("floordiv"), _make_binary("remainder")


def where(cond, x=None, y=None):
    """cond != 0 ? x : y, all three broadcast together; int32 where x and y are int32 tensors
    or Python ints (PyTorch's integer result), else float32. where(cond) alone:
    nonzero(cond, as_tuple=True)."""
    if x is None and y is None:
        from .compaction import nonzero  # compaction builds on these maps
        return nonzero(cond, as_tuple=True)
    like = next(t for t in (cond, x, y) if isinstance(t, Tensor))
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
           or isinstance(v, Tensor) and v.dtype == int32 for v in (x, y)):
        x, y = (v if isinstance(v, Tensor) else tensor(np.asarray(v, np.int32),
                                                        device=like.device, dtype=int32)
                for v in (x, y))
        return map_op("select(c, b, a != 0.0)", [_f32(cond), x, y], dtype=int32)
    cond, x, y = (t if isinstance(t, Tensor) else tensor(np.asarray(t, np.float32),
                                                          device=like.device)
                  for t in (cond, x, y))
    c, x, y = _f32(cond), _f32(x), _f32(y)
    out = map_op("select(c, b, a != 0.0)", [c, x, y])

    def bw(g):
        return (None,
                unbroadcast(map_op("select(0.0, a, b != 0.0)", [g, c]), x.shape),
                unbroadcast(map_op("select(a, 0.0, b != 0.0)", [g, c]), y.shape))
    record("where", out, [cond, x, y], bw, saved=[c])
    return out


def int32_scalar(v, what: str) -> int:
    """A Python / numpy integer for an int32 kernel, which would otherwise wrap silently."""
    v = int(v)
    if not -2 ** 31 <= v < 2 ** 31:
        raise OverflowError(f"{what}: the value {v} does not fit in int32 (the tensor's dtype); "
                            f"use a value in [-2**31, 2**31 - 1] or a float32 tensor")
    return v


def clamp(x: Tensor, min=None, max=None) -> Tensor:
    """min(max(x, min), max) like torch (so min > max gives max); int32 stays int32. NaN stays
    NaN, and a NaN bound gives NaN (torch); the gradient passes where min <= x <= max (both
    bounds included, as in PyTorch)."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if x.dtype == int32 and all(v is None or isinstance(v, (int, np.integer)) for v in (min, max)):
        lo = -2 ** 31 if min is None else int32_scalar(min, "clamp min")
        hi = 2 ** 31 - 1 if max is None else int32_scalar(max, "clamp max")
        return map_op("min(max(a, lo), hi)", [x], dtype=int32, scalars={"lo": lo, "hi": hi})
    x = _f32(x)
    lo = -np.inf if min is None else float(min)
    hi = np.inf if max is None else float(max)
    bounds = {"lo": lo, "hi": hi}
    out = map_op("select(min(max(a, lo), hi), a + lo + hi, isnan_(a) || isnan_(lo) || "
                 "isnan_(hi))", [x], scalars=bounds)
    record("clamp", out, [x], lambda g: (map_op(
        "select(0.0, a, b >= lo && b <= hi && !isnan_(b))", [g, x], scalars=bounds),),
        saved=[x])
    return out


def cast(x: Tensor, dtype) -> Tensor:
    dtype = np.dtype(dtype)
    if dtype == x.dtype:
        return x
    if (dtype == np.float16 or x.dtype == np.float16) and "shader-f16" not in x.device.features:
        raise AdapterLimitError(f"float16 needs the adapter feature shader-f16, which "
                                f"{x.device.name} does not have; keep float32")
    # no autograd node: only float32 tensors can require grad, so no cast ever needs one
    return run_map("a", Tensor.empty(x.shape, x.device, dtype), [x])


def copy_into(dst: Tensor, src: Tensor) -> Tensor:
    """dst[...] = src (broadcast); dst may be any view. Bumps dst's version (in-place write)."""
    return run_map("a", dst, [src])


def contiguous(x: Tensor) -> Tensor:
    if x.is_contiguous():
        return x
    out = run_map("a", Tensor.empty(x.shape, x.device, x.dtype), [x])
    record("contiguous", out, [x], lambda g: (g,))
    return out


def clone(x: Tensor) -> Tensor:
    out = run_map("a", Tensor.empty(x.shape, x.device, x.dtype), [x])
    record("clone", out, [x], lambda g: (g,))
    return out


def fill_(x: Tensor, value) -> Tensor:
    if x.dtype == int32:
        return run_map("v", x, [], scalars={"v": int32_scalar(value, "fill_")})
    return run_map("v", x, [], scalars={"v": float(value)})
