"""PyTorch's constructors built on the device-written ones: logspace, the *_like and new_*
families, meshgrid."""
from __future__ import annotations

from ..ops.creation import empty, full, normal_into, uniform_into
from ..ops.creators import linspace, randint
from ..ops.dims import varargs
from ..ops.elementwise import cast, pow_
from ..ops.shape import expand, reshape
from ..runtime.errors import ShapeError
from ..tensor import Tensor, as_dtype, float32, tensor


def logspace(start, end, steps: int, base: float = 10.0, device=None, dtype=float32) -> Tensor:
    return cast(pow_(float(base), linspace(start, end, steps, device)), as_dtype(dtype))


def empty_like(x: Tensor, dtype=None, device=None) -> Tensor:
    return empty(x.shape, device=device or x.device, dtype=dtype or x.dtype)


def full_like(x: Tensor, fill_value, dtype=None, device=None) -> Tensor:
    return full(x.shape, fill_value, device or x.device, dtype or x.dtype)


def rand_like(x: Tensor, dtype=None, device=None, seed=None) -> Tensor:
    t = uniform_into(Tensor.empty(x.shape, device or x.device, float32), 0.0, 1.0, seed)
    return t if (dtype or x.dtype) == float32 else t.astype(dtype or x.dtype)


def randn_like(x: Tensor, dtype=None, device=None, seed=None) -> Tensor:
    t = normal_into(Tensor.empty(x.shape, device or x.device, float32), 0.0, 1.0, seed)
    return t if (dtype or x.dtype) == float32 else t.astype(dtype or x.dtype)


def randint_like(x: Tensor, low, high=None, dtype=None, device=None, seed=None) -> Tensor:
    return randint(low, high, x.shape, device=device or x.device, dtype=dtype or x.dtype,
                   seed=seed)


def new_full(x: Tensor, size, fill_value, dtype=None, device=None) -> Tensor:
    return full(tuple(size), fill_value, device or x.device, dtype or x.dtype)


def new_zeros(x: Tensor, *size, dtype=None, device=None) -> Tensor:
    return full(varargs(size), 0, device or x.device, dtype or x.dtype)


def new_ones(x: Tensor, *size, dtype=None, device=None) -> Tensor:
    return full(varargs(size), 1, device or x.device, dtype or x.dtype)


def new_empty(x: Tensor, *size, dtype=None, device=None) -> Tensor:
    return empty(varargs(size), device=device or x.device, dtype=dtype or x.dtype)


def new_tensor(x: Tensor, data, dtype=None, device=None) -> Tensor:
    return tensor(data, device=device or x.device, dtype=dtype or x.dtype)


def meshgrid(*tensors, indexing: str = "ij") -> list:
    """Broadcast views of 1-D tensors ('ij': matrix indexing, 'xy': the first two swapped)."""
    ts = list(varargs(tensors))
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if any(t.ndim > 1 for t in ts):
        raise ShapeError("meshgrid takes 0-D or 1-D tensors")
    sizes = [t.numel() for t in ts]
    if indexing == "xy" and len(ts) >= 2:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for k, t in enumerate(ts):
        pos = k if indexing == "ij" or len(ts) < 2 else {0: 1, 1: 0}.get(k, k)
        shape = [1] * len(ts)
        shape[pos] = t.numel()
        out.append(expand(reshape(t, tuple(shape)), tuple(sizes)))
    return out


__all__ = ["empty_like", "full_like", "logspace", "meshgrid", "new_empty", "new_full",
           "new_ones", "new_tensor", "new_zeros", "rand_like", "randint_like", "randn_like"]
