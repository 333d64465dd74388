"""Inverted dropout whose mask is a pure function of (seed, index): backward regenerates it."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import record
from ..tensor import Tensor
from .elementwise import _f32, map_op
from .random import next_seed

DROPOUT_STREAM = 0x0D0D  # RNG stream of dropout masks (rand/randn use streams 0 and 1)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, seed=None) -> Tensor:
    """Inverted dropout; the mask is a pure function of (seed, index), so backward regenerates
    it instead of storing it (``seed=None``: the global generator)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    x = _f32(x)
    if p == 1.0:
        out = map_op("0.0", [x])
        record("dropout", out, [x], lambda g: (map_op("0.0", [g], shape=x.shape),))
        return out
    s = next_seed(seed)
    expr = f"select(0.0, a * scale, uniform_(seed, i, {DROPOUT_STREAM}u) >= p)"
    scalars = {"seed": np.uint32(s), "scale": 1.0 / (1.0 - p), "p": float(p)}
    out = map_op(expr, [x], scalars=scalars)
    record("dropout", out, [x], lambda g: (map_op(expr, [g], shape=x.shape, scalars=scalars),))
    return out
