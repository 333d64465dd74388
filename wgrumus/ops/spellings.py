"""PyTorch's spellings of ops whose kernels live elsewhere: ``softmax(dim=, dtype=)``,
``div(rounding_mode=)``, ``x.cpu()``; one place, so the kernels keep one signature each."""
from __future__ import annotations

from ..runtime.errors import WgrumusError
from ..tensor import Tensor, int32
from .dims import pick
from .elementwise import _scalar_as_tensor, binary, cast, floor_divide, map_op
from .rounding import trunc
from .shape import _norm_axis
from .softmax import log_softmax as _log_softmax
from .softmax import softmax as _softmax


def _dim(x: Tensor, dim: int) -> int:
    """``dim`` checked (an IndexError when outside x's dims, as in PyTorch)."""
    _norm_axis(dim, x.ndim, "dim")
    return dim


def softmax(x: Tensor, dim=None, dtype=None, *, axis=None, scale: float = 1.0,
            causal: bool = False) -> Tensor:
    """softmax along ``dim`` (default the last); ``dtype`` casts the input first (PyTorch's)."""
    if dtype is not None:
        x = cast(x, dtype)
    return _softmax(x, _dim(x, pick(dim, axis, -1)), scale=scale, causal=causal)


def log_softmax(x: Tensor, dim=None, dtype=None, *, axis=None, scale: float = 1.0,
                causal: bool = False) -> Tensor:
    if dtype is not None:
        x = cast(x, dtype)
    return _log_softmax(x, _dim(x, pick(dim, axis, -1)), scale=scale, causal=causal)


def div(a, b, *, rounding_mode=None) -> Tensor:
    """a / b; ``rounding_mode`` 'trunc' rounds toward zero, 'floor' down (int32 stays int32
    there, as in PyTorch); their gradient is zero."""
    if rounding_mode is None:
        return binary("div", a, b)
    if rounding_mode == "floor":
        return floor_divide(a, b)
    if rounding_mode != "trunc":
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                         f"{rounding_mode!r}")
    ints = all(isinstance(v, int) or isinstance(v, Tensor) and v.dtype == int32 for v in (a, b))
    if ints and any(isinstance(v, Tensor) for v in (a, b)):
        a, b = _scalar_as_tensor(a, b), _scalar_as_tensor(b, a)
        return map_op("select(a / b, 0, b == 0)", [a, b], dtype=int32)
    return trunc(binary("div", a, b))


def cpu(x: Tensor):
    raise WgrumusError("tensors live on WebGPU devices only: read one to the host with "
                       ".numpy() (or .tolist() / .item()), not .cpu()")


__all__ = ["cpu", "div", "log_softmax", "softmax"]
