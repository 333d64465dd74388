"""PyTorch's other constructors written by device kernels: eye, linspace, randint, one_hot
(one_hot reads the index range back to check it, or to size the result when num_classes is not
given). The *_like and new_* families, logspace and meshgrid build on these and on creation.py
(wgrumus/composite/constructors.py)."""
from __future__ import annotations

import numpy as np

from ..kernels.map import run_map
from ..tensor import Tensor, as_dtype, as_shape, float32, int32
from .random import next_seed
from .reduce import max as _max
from .reduce import min as _min


def eye(n: int, m=None, device=None, dtype=float32, requires_grad=False) -> Tensor:
    m = n if m is None else m
    t = Tensor.empty(as_shape((n, m), "eye"), device, as_dtype(dtype))
    run_map("select(0, 1, i / u32(M) == i % u32(M))", t, [], {"M": max(int(m), 1)})
    return t.requires_grad_(True) if requires_grad else t


def linspace(start, end, steps: int, device=None, dtype=float32, requires_grad=False) -> Tensor:
    """``steps`` points from start to end, both included (PyTorch's two-sided formula: the
    first half counts up from start, the second down from end)."""
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"linspace: steps must be >= 0, got {steps}")
    t = Tensor.empty((steps,), device, as_dtype(dtype))
    step = (float(end) - float(start)) / (steps - 1) if steps > 1 else 0.0
    run_map("select(e - st * f32(cnt - 1 - i32(i)), s + st * f32(i), i32(i) < cnt / 2)", t, [],
            {"s": float(start), "e": float(end), "st": step, "cnt": steps})
    return t.requires_grad_(True) if requires_grad else t


def randint(low, high=None, size=None, *, device=None, dtype=int32, seed=None) -> Tensor:
    """Uniform integers in [low, high) (``randint(high, size)`` as in PyTorch)."""
    if size is None:
        if high is None or not isinstance(high, (tuple, list)):
            raise TypeError("randint(low=0, high, size): give the size as a tuple")
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    low, high = int(low), int(high)
    if high <= low:
        raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
    t = Tensor.empty(as_shape(tuple(size), "randint"), device, as_dtype(dtype))
    run_map("lo + min(i32(floor(uniform_(seed, i, 0u) * f32(span))), span - 1)", t, [],
            {"seed": np.uint32(next_seed(seed)), "lo": low, "span": high - low})
    return t


def one_hot(idx: Tensor, num_classes: int = -1) -> Tensor:
    """int32 [..., num_classes]: 1 at each index. Reads the index range back (a class
    outside [0, num_classes) raises, as in PyTorch; -1 sizes by the largest index)."""
    if not isinstance(idx, Tensor):
        idx = Tensor.from_numpy(np.asarray(idx).astype(np.int32), dtype=int32)
    if idx.dtype != int32:
        raise TypeError(f"one_hot: indices must be an int32 tensor, got {idx.dtype}")
    lo, hi = (int(_min(idx).item()), int(_max(idx).item())) if idx.numel() else (0, -1)
    if num_classes == -1:
        num_classes = hi + 1
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"one_hot: class values must be in [0, {num_classes}), got "
                         f"{lo if lo < 0 else hi}")
    out = Tensor.empty(idx.shape + (int(num_classes),), idx.device, int32)
    return run_map("select(0, 1, a == i32(i % u32(C)))", out, [idx.reshape(idx.shape + (1,))],
                   {"C": max(int(num_classes), 1)})


__all__ = ["eye", "linspace", "one_hot", "randint"]
