"""Initialisers (PyTorch's definitions), written in place by device kernels.

Random ones draw from the seeded counter-based generator (``wr.manual_seed`` or ``seed=``), so
the same seed gives bit-identical weights on every device and every parallel layout."""
from __future__ import annotations

import math

from ..autograd.tape import no_grad
from ..ops.creation import normal_into, uniform_into
from ..ops.elementwise import fill_
from ..tensor import Tensor


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0, seed=None) -> Tensor:
    with no_grad():
        return uniform_into(t, a, b, seed)


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0, seed=None) -> Tensor:
    with no_grad():
        return normal_into(t, mean, std, seed)


def constant_(t: Tensor, value: float) -> Tensor:
    with no_grad():
        return fill_(t, float(value))


def zeros_(t: Tensor) -> Tensor:
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    return constant_(t, 1.0)


def calculate_fan_in_and_fan_out(t: Tensor):
    if t.ndim < 2:
        raise ValueError(f"fan in/out needs a tensor with at least 2 dimensions, got {t.shape}")
    rf = math.prod(t.shape[2:])
    return t.shape[1] * rf, t.shape[0] * rf


def calculate_gain(nonlinearity: str, param=None) -> float:
    if nonlinearity in ("linear", "conv2d", "sigmoid", "identity"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def kaiming_uniform_(t: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", seed=None) -> Tensor:
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    fan = fan_in if mode == "fan_in" else fan_out
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan) if fan else 0.0
    return uniform_(t, -bound, bound, seed)


def xavier_uniform_(t: Tensor, gain: float = 1.0, seed=None) -> Tensor:
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound, seed)


def default_bias_(b: Tensor, fan_in: int, seed=None) -> Tensor:
    """PyTorch's Linear/Conv bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return uniform_(b, -bound, bound, seed)
