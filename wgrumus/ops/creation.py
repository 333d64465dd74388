"""Constructors: filled, ranged and random tensors, all written by device kernels."""
from __future__ import annotations

import numpy as np

from ..kernels.map import run_map
from ..tensor import Tensor, as_dtype, float32, int32
from .dims import varargs
from .elementwise import fill_
from .random import next_seed


def empty(*shape, device=None, dtype=float32) -> Tensor:
    return Tensor.empty(varargs(shape), device, as_dtype(dtype))


def full(shape, value, device=None, dtype=None, requires_grad=False) -> Tensor:
    """``value`` everywhere; without ``dtype``, int32 for a Python int (PyTorch's integer
    tensor), else float32."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if dtype is None:
        integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        dtype = int32 if integral else float32
    t = fill_(Tensor.empty(shape, device, as_dtype(dtype)), value)
    return t.requires_grad_(True) if requires_grad else t


def zeros(*shape, device=None, dtype=float32, requires_grad=False) -> Tensor:
    return full(varargs(shape), 0, device, dtype or float32, requires_grad)


def ones(*shape, device=None, dtype=float32, requires_grad=False) -> Tensor:
    return full(varargs(shape), 1, device, dtype or float32, requires_grad)


def zeros_like(x: Tensor, dtype=None) -> Tensor:
    return full(x.shape, 0, x.device, dtype or x.dtype)


def ones_like(x: Tensor, dtype=None) -> Tensor:
    return full(x.shape, 1, x.device, dtype or x.dtype)


def arange(start, stop=None, step=1, device=None, dtype=None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    n = max(0, -(-(stop - start) // step)) if all(isinstance(v, int) for v in (start, stop, step)) \
        else max(0, int(-(-(stop - start) // step)))
    if dtype is None:
        dtype = int32 if all(isinstance(v, int) for v in (start, stop, step)) else float32
    dtype = as_dtype(dtype)
    t = Tensor.empty((n,), device, dtype)
    if dtype == int32:
        return run_map("start + i32(i) * step", t, [], {"start": int(start), "step": int(step)})
    return run_map("start + f32(i) * step", t, [], {"start": float(start), "step": float(step)})


def rand(*shape, device=None, seed=None, low=0.0, high=1.0, requires_grad=False) -> Tensor:
    """Uniform in (low, high); identical for the same seed on every device."""
    t = uniform_into(Tensor.empty(varargs(shape), device, float32), low, high, seed)
    return t.requires_grad_(True) if requires_grad else t


def randn(*shape, device=None, seed=None, mean=0.0, std=1.0, requires_grad=False) -> Tensor:
    """Normal(mean, std) by Box-Muller on two independent uniform streams."""
    t = normal_into(Tensor.empty(varargs(shape), device, float32), mean, std, seed)
    return t.requires_grad_(True) if requires_grad else t


def uniform_into(t: Tensor, low: float, high: float, seed=None) -> Tensor:
    """Overwrite float32 ``t`` with U(low, high) draws of the seeded generator."""
    return run_map("lo + (hi - lo) * uniform_(seed, i, 0u)", t, [],
                   {"seed": np.uint32(next_seed(seed)), "lo": float(low), "hi": float(high)})


def normal_into(t: Tensor, mean: float, std: float, seed=None) -> Tensor:
    """Overwrite float32 ``t`` with Normal(mean, std) (Box-Muller on two uniform streams)."""
    return run_map("mu + sigma * sqrt(-2.0 * log(uniform_(seed, i, 0u)))"
                   " * cos(6.283185307179586 * uniform_(seed, i, 1u))", t, [],
                   {"seed": np.uint32(next_seed(seed)), "mu": float(mean), "sigma": float(std)})
