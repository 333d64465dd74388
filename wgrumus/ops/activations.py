"""PyTorch's activation functions, each one map kernel forward and one backward (expressions of
g = a, x = b, out = c), with PyTorch's boundary conventions (relu6, prelu and glu build on these:
wgrumus/nn/functional/activations.py). f16 inputs compute in f32 and come back f16 (only
float32 tensors take part in autograd)."""
from __future__ import annotations

from ..autograd.tape import needs_grad, record
from ..tensor import Tensor, float16, float32
from .elementwise import cast, map_op, saved_output

SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717


def unary_map(name: str, x: Tensor, fwd: str, bwd: str | None, scalars=None) -> Tensor:
    """fwd(a) elementwise with the backward ``bwd(a = g, b = x, c = out)``; None: no gradient."""
    scalars = scalars or {}
    if x.dtype == float16:
        return cast(map_op(fwd, [cast(x, float32)], scalars=scalars), float16)
    if x.dtype != float32:
        x = cast(x, float32)
    out = map_op(fwd, [x], scalars=scalars)
    if bwd is not None and needs_grad(x):
        o = saved_output(out)
        record(name, out, [x], lambda g: (map_op(bwd, [g, x, o], scalars=scalars),),
               saved=[x, o])
    return out


def silu(x: Tensor) -> Tensor:
    return unary_map("silu", x, "a * sigmoid_(a)",
                     "a * sigmoid_(b) * (1.0 + b * (1.0 - sigmoid_(b)))")


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, linear where beta x > threshold (PyTorch's switch)."""
    return unary_map("softplus", x, "select(softplus_(a * be) / be, a, a * be > th)",
                     "select(a * sigmoid_(b * be), a, b * be > th)",
                     {"be": float(beta), "th": float(threshold)})


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    return unary_map("elu", x, "select(al * expm1_(a), a, a > 0.0)",
                     "select(a * (c + al), a, b > 0.0)", {"al": float(alpha)})


def selu(x: Tensor) -> Tensor:
    return unary_map("selu", x, "sc * select(al * expm1_(a), a, a > 0.0)",
                     "select(a * sc * al * exp(b), a * sc, b > 0.0)",
                     {"sc": SELU_SCALE, "al": SELU_ALPHA})


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0")
    return unary_map("celu", x, "select(al * expm1_(a / al), a, a > 0.0)",
                     "select(a * exp(b / al), a, b > 0.0)", {"al": float(alpha)})


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """clamp to [min_val, max_val]; the gradient passes strictly inside (PyTorch's rule)."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} is greater than max_val {max_val}")
    return unary_map("hardtanh", x, "select(min(max(a, lo), hi), a, isnan_(a))",
                     "select(0.0, a, b > lo && b < hi)", {"lo": float(min_val),
                                                          "hi": float(max_val)})


def hardsigmoid(x: Tensor) -> Tensor:
    return unary_map("hardsigmoid", x, "select(min(max(a + 3.0, 0.0), 6.0) / 6.0, a, isnan_(a))",
                     "select(0.0, a / 6.0, b > -3.0 && b < 3.0)")


def hardswish(x: Tensor) -> Tensor:
    return unary_map("hardswish", x, "a * min(max(a + 3.0, 0.0), 6.0) / 6.0",
                     "select(select(a, a * (b / 3.0 + 0.5), b <= 3.0), 0.0, b < -3.0)")


def mish(x: Tensor) -> Tensor:
    return unary_map("mish", x, "a * tanh_(softplus_(a))",
                     "a * (tanh_(softplus_(b)) + b * sigmoid_(b) * "
                     "(1.0 - tanh_(softplus_(b)) * tanh_(softplus_(b))))")


def softsign(x: Tensor) -> Tensor:
    return unary_map("softsign", x, "a / (1.0 + abs(a))", "a / ((1.0 + abs(b)) * (1.0 + abs(b)))")


def logsigmoid(x: Tensor) -> Tensor:
    return unary_map("logsigmoid", x, "min(a, 0.0) - log1p_(exp(-abs(a)))",
                     "a * sigmoid_(-b)")


def tanhshrink(x: Tensor) -> Tensor:
    return unary_map("tanhshrink", x, "a - tanh_(a)", "a * tanh_(b) * tanh_(b)")


def softshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    if lambd < 0:
        raise ValueError(f"softshrink: lambd must be >= 0, got {lambd}")
    return unary_map("softshrink", x,
                     "select(select(0.0, a + l, a < -l), a - l, a > l)",
                     "select(0.0, a, b > l || b < -l)", {"l": float(lambd)})


def hardshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    return unary_map("hardshrink", x, "select(0.0, a, a > l || a < -l || isnan_(a))",
                     "select(0.0, a, b > l || b < -l)", {"l": float(lambd)})


def threshold(x: Tensor, threshold: float, value: float) -> Tensor:
    """x where x > threshold, else value."""
    return unary_map("threshold", x, "select(v, a, a > th || isnan_(a))",
                     "select(0.0, a, b > th)", {"th": float(threshold), "v": float(value)})


__all__ = ["celu", "elu", "hardshrink", "hardsigmoid", "hardswish", "hardtanh", "logsigmoid",
           "mish", "selu", "silu", "softplus", "softshrink", "softsign", "tanhshrink", "threshold",
           "unary_map"]
