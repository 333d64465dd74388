"""Activations built on other ops: relu6 (hardtanh), prelu (where), glu (two halves). The map
kernel activations with their own derivative are ops (wgrumus/ops/activations.py)."""
from __future__ import annotations

from ...ops.activations import hardtanh
from ...ops.elementwise import gt, mul, sigmoid, where
from ...ops.shape import _norm_axis, chunk
from ...runtime.errors import ShapeError
from ...tensor import Tensor


def relu6(x: Tensor) -> Tensor:
    return hardtanh(x, 0.0, 6.0)


def prelu(x: Tensor, weight: Tensor) -> Tensor:
    """x where x > 0, else weight * x; ``weight`` has one value or one per channel (dim 1)."""
    if weight.numel() != 1:
        if x.ndim < 2 or weight.numel() != x.shape[1]:
            raise ShapeError(f"prelu: weight of {weight.numel()} values for input {x.shape}: "
                             f"give one value or one per channel (dim 1)")
        weight = weight.reshape((1, -1) + (1,) * (x.ndim - 2))
    return where(gt(x, 0.0), x, mul(weight, x))


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b) for the two halves of ``dim``."""
    d = _norm_axis(dim, x.ndim, "dim")
    if x.shape[d] % 2:
        raise ShapeError(f"glu: dim {dim} has odd size {x.shape[d]}; it must halve")
    a, b = chunk(x, 2, d)
    return mul(a, sigmoid(b))


__all__ = ["glu", "prelu", "relu6"]
