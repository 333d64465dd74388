"""PyTorch's spellings of ops whose kernels live elsewhere: ``div(rounding_mode=)``, ``frac``,
``x.cpu()``; one place, so the kernels keep one signature each."""
from __future__ import annotations

from ..ops.elementwise import _scalar_as_tensor, binary, floor_divide, map_op, sub
from ..ops.rounding import trunc
from ..runtime.errors import WgrumusError
from ..tensor import Tensor, int32


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


def frac(x: Tensor) -> Tensor:
    """x - trunc(x) (PyTorch's frac: the sign of x); gradient one."""
    return sub(x, trunc(x.detach() if x.requires_grad else x))


def cpu(x: Tensor):
    raise WgrumusError("tensors live on WebGPU devices only: read one to the host with "
                       ".numpy() (or .tolist() / .item()), not .cpu()")


__all__ = ["cpu", "div", "frac"]
