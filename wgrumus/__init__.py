"""wgrumus: deep learning on WebGPU across every adapter of a host, and across hosts with MPI."""
from __future__ import annotations

from ._deps import check_wgpu

check_wgpu()  # a clear ImportError on an untested wgpu-py, before anything uses it
from . import autograd, composite, ops  # noqa: E402  (composite binds Tensor's methods)
from .autograd import GradientStore, no_grad
from .ops import (arange, argmax, argmin, cat, chunk, empty, exp, floor_divide, full, gather, gelu,
                  get_rng_state, index_select, log, log_softmax, manual_seed, matmul, max, maximum,
                  mean, min, minimum, ones, ones_like, rand, randn, relu, remainder, set_rng_state,
                  sigmoid, softmax, split, sqrt, stack, std, sum, tanh, var, where, zeros,
                  zeros_like)
from .composite import div, flip, fliplr, flipud, frac, repeat_interleave, roll, tile
from .ops.rounding import ceil, fix, floor, round, sign, trunc  # noqa: A004
from .runtime import (AdapterLimitError, CaptureError, Device, DeviceMismatchError, DimError,
                      MultiGpuContext, NoAdapterError, ShapeError, WgrumusError, devices)
from .tensor import Tensor, float16, float32, int32, tensor
from . import amp, data, nn, optim  # noqa: E402  (build on the core above)
from .amp import autocast  # noqa: E402
from .io import load, load_checkpoint, save, save_checkpoint
from .jit import jit
from . import parallel  # noqa: E402  (wr.parallel.DataParallel; builds on everything above)
from . import linalg  # noqa: E402

from .autograd import enable_grad, is_grad_enabled  # noqa: E402
from .autograd.grad_modes import inference_mode, set_grad_enabled  # noqa: E402

# PyTorch's torch.* functions beyond the core above, from the op modules' __all__
_TORCH_FUNCTIONS = {**{n: getattr(m, n) for m in (ops.creators, ops.mathfn, ops.triangular,
                                                   ops.scan, ops.scatter_ops, ops.compaction,
                                                   ops.sorting, composite.constructors,
                                                   composite.contraction, composite.logical,
                                                   composite.more_shapes, composite.reductions,
                                                   composite.sorting)
                       for n in m.__all__ if n != "linalg_norm"},
                    "prod": ops.prod,
                    **{n: getattr(ops, n) for n in (
                        "add", "sub", "mul", "neg", "sin", "cos", "clamp", "reciprocal", "rsqrt",
                        "square", "eq", "ne", "lt", "le", "gt", "ge", "transpose", "permute",
                        "index_select",
                        "reshape", "flatten", "squeeze", "unsqueeze", "unflatten",
                        "selu", "celu")},
                    "prelu": nn.functional.prelu,
                    "any": composite.logical.any_, "all": composite.logical.all_,
                    "abs": ops.abs_, "pow": ops.pow_, "clamp": composite.more_shapes.clamp_tensor,
                    "clip": composite.more_shapes.clamp_tensor, "mm": ops.matmul,
                    "bmm": ops.matmul,
                    "numel": lambda x: x.numel(), "is_tensor": lambda x: isinstance(x, Tensor)}
globals().update(_TORCH_FUNCTIONS)


def from_numpy(arr, device=None) -> Tensor:
    """A tensor with ``arr``'s values on a device (a copy: device memory cannot alias numpy's,
    unlike torch.from_numpy)."""
    return tensor(arr, device=device)


__version__ = "0.1.0"
__all__ = [
    "AdapterLimitError", "CaptureError", "Device", "DeviceMismatchError", "GradientStore",
    "MultiGpuContext", "NoAdapterError", "ShapeError", "Tensor", "WgrumusError", "amp", "arange",
    "argmax", "argmin", "autocast", "autograd", "cat", "chunk", "data", "devices", "distributed",
    "empty", "exp", "float16", "float32", "floor_divide", "full", "gather", "gelu",
    "get_rng_state", "index_select", "int32", "io", "jit", "load", "load_checkpoint", "log",
    "log_softmax", "manual_seed", "matmul", "max", "maximum", "mean", "min", "minimum", "nn",
    "no_grad", "ones", "ones_like", "ops", "optim", "parallel", "rand", "randn", "relu",
    "remainder", "runtime", "save", "save_checkpoint", "set_rng_state", "sigmoid", "softmax",
    "split", "sqrt", "stack", "std", "sum", "tanh", "tensor", "utils", "var", "where", "zeros",
    "zeros_like",
    # PyTorch's functions beyond the core above
    "DimError", "ceil", "div", "fix", "flip", "fliplr", "flipud", "floor", "frac",
    "repeat_interleave", "roll", "round", "sign", "tile", "trunc", "enable_grad",
    "is_grad_enabled", "inference_mode", "set_grad_enabled", "from_numpy", "linalg",
    *_TORCH_FUNCTIONS]
