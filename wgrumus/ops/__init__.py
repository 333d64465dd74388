"""What every op is: its shape rule, forward call and backward rule side by side, one module per
family (how each runs on this adapter: wgrumus/kernels/). This module also implements Tensor's
methods (the table ``tensor.METHODS``) and registers them."""
from __future__ import annotations

from ..autograd.engine import tensor_backward
from ..autograd.tape import is_grad_enabled
from ..tensor import register
from .creation import arange, empty, full, ones, ones_like, rand, randn, zeros, zeros_like
from .elementwise import (abs_, add, cast, clamp, clone, contiguous, copy_into, cos, eq, exp,
                          fill_, floor_divide, ge, gelu, gt, le, leaky_relu, log, lt, maximum,
                          minimum, mul, ne, neg, pow_, reciprocal, relu, remainder, rsqrt,
                          sigmoid, sin, sqrt, square, sub, tanh, where)
from .matmul import matmul
from .conv import avg_pool2d, conv2d, im2col, max_pool2d
from .indexing import embedding, gather, getitem, index_select, setitem
from .dropout import dropout
from .layer_norm import layer_norm
from .losses import cross_entropy, mse_loss
from . import (activations, compaction, contraction, convolution, creators, logical, mathfn,
               more_shapes, reductions, scan, sorting, triangular)
from . import scatter as scatter_ops
from .repeat import flip, fliplr, flipud, repeat, repeat_interleave, roll, tile
from .rounding import ceil, fix, floor, frac, round, sign, trunc
from .spellings import cpu, div, log_softmax, softmax
from .random import get_rng_state, manual_seed, set_rng_state
from .reduce import argmax, argmin, max, mean, min, std, sum, var
from .shape import (cat, chunk, detach, expand, flatten, permute, reshape, split, squeeze, stack,
                    to, transpose, unflatten, unsqueeze)


__all__ = [  # the functional forms (the Tensor methods are registered below)
    "abs_", "add", "arange", "argmax", "argmin", "avg_pool2d", "cast", "cat", "chunk", "clamp",
    "clone", "contiguous", "conv2d", "cos", "cross_entropy", "detach", "div", "dropout",
    "embedding", "empty", "eq", "exp", "expand", "fill_", "flatten", "floor_divide", "full",
    "gather", "ge", "gelu", "get_rng_state", "getitem", "gt", "im2col", "index_select",
    "layer_norm", "le", "leaky_relu", "log", "log_softmax", "lt", "manual_seed", "matmul", "max",
    "max_pool2d", "maximum", "mean", "min", "minimum", "mse_loss", "mul", "ne", "neg", "ones",
    "ones_like", "permute", "pow_", "rand", "randn", "reciprocal", "relu", "remainder",
    "reshape", "rsqrt", "set_rng_state", "setitem", "sigmoid", "sin", "softmax", "split",
    "sqrt", "square", "squeeze", "stack", "std", "sub", "sum", "tanh", "to", "transpose",
    "unsqueeze", "var", "where", "zeros", "zeros_like",
    "ceil", "fix", "floor", "frac", "round", "sign", "trunc",
    "flip", "fliplr", "flipud", "repeat", "repeat_interleave", "roll", "tile", "unflatten",
    *creators.__all__, *logical.__all__, *mathfn.__all__, *triangular.__all__,
    *activations.__all__, *reductions.__all__, *scan.__all__, *scatter_ops.__all__,
    *compaction.__all__, *sorting.__all__, *contraction.__all__, *more_shapes.__all__]
# the functional forms of the modules above, by the names in their __all__
for _m in (creators, logical, mathfn, triangular, activations, reductions, scan, scatter_ops,
           compaction, sorting, contraction, more_shapes):
    globals().update({_n: getattr(_m, _n) for _n in _m.__all__})


def _rev(fn):
    return lambda self, other: fn(other, self)


def _inplace(fn):
    def op(self, *args, **kwargs):
        if self.requires_grad and is_grad_enabled():
            raise RuntimeError("in-place update of a tensor that requires grad; wrap it in "
                               "wr.no_grad() (as optimizers do) or use the out-of-place op")
        r = fn(self, *args, **kwargs)
        copy_into(self, r)
        return self
    return op


def _double(self):
    raise TypeError("float64 does not exist on WebGPU; float32 (.float()) is the widest float")


register({
    "__add__": add, "__radd__": _rev(add), "__sub__": sub, "__rsub__": _rev(sub),
    "__mul__": mul, "__rmul__": _rev(mul), "__truediv__": div, "__rtruediv__": _rev(div),
    "__pow__": pow_, "__rpow__": _rev(pow_), "__matmul__": matmul, "__rmatmul__": _rev(matmul),
    "__floordiv__": floor_divide, "__rfloordiv__": _rev(floor_divide), "__mod__": remainder,
    "__rmod__": _rev(remainder),
    "__neg__": neg, "__abs__": abs_, "__eq__": eq, "__ne__": ne, "__lt__": lt, "__le__": le,
    "__gt__": gt, "__ge__": ge, "__getitem__": getitem, "__setitem__": setitem,
    "__iadd__": _inplace(add), "__isub__": _inplace(sub), "__imul__": _inplace(mul),
    "__itruediv__": _inplace(div),
    "add": add, "sub": sub, "mul": mul, "div": div, "pow": pow_, "matmul": matmul,
    "floor_divide": floor_divide, "remainder": remainder,
    "maximum": maximum, "minimum": minimum,
    "neg": neg, "exp": exp, "log": log, "sqrt": sqrt, "rsqrt": rsqrt, "abs": abs_, "tanh": tanh,
    "sigmoid": sigmoid, "relu": relu, "gelu": gelu, "leaky_relu": leaky_relu, "sin": sin,
    "cos": cos, "square": square, "reciprocal": reciprocal,
    "clamp": more_shapes.clamp_tensor,
    "sum": sum, "mean": mean, "max": max, "min": min, "argmax": argmax, "argmin": argmin,
    "var": var, "std": std,
    "reshape": reshape, "view": reshape, "permute": permute, "transpose": transpose,
    "expand": expand, "unsqueeze": unsqueeze, "squeeze": squeeze, "flatten": flatten,
    "contiguous": contiguous, "clone": clone, "to": to, "detach": detach, "split": split,
    "chunk": chunk, "fill_": fill_, "zero_": lambda self: fill_(self, 0),
    "astype": cast, "float": lambda self: cast(self, "float32"),
    "half": lambda self: cast(self, "float16"), "int": lambda self: cast(self, "int32"),
    "long": lambda self: cast(self, "int32"),  # no int64 on WebGPU: int32 is the widest
    "double": _double, "bool": lambda self: ne(self, 0),  # no bool dtype: a 1.0/0.0 mask
    "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge,
    "softmax": softmax, "log_softmax": log_softmax,
    "T": property(lambda self: permute(self, tuple(reversed(range(self.ndim))))),
    "backward": tensor_backward,
    "gather": gather, "cpu": cpu,
    "floor": floor, "ceil": ceil, "round": round, "trunc": trunc, "fix": fix, "frac": frac,
    "sign": sign,
    "repeat": repeat, "tile": tile, "repeat_interleave": repeat_interleave, "flip": flip,
    "fliplr": fliplr, "flipud": flipud, "roll": roll,
    "__and__": logical.bitwise_and, "__or__": logical.bitwise_or,
    "__xor__": logical.bitwise_xor, "__invert__": logical.bitwise_not,
    "__rand__": _rev(logical.bitwise_and), "__ror__": _rev(logical.bitwise_or),
    "__rxor__": _rev(logical.bitwise_xor),
    **{name: getattr(logical, name) for name in (
        "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or",
        "bitwise_xor", "bitwise_not", "isnan", "isinf", "isfinite", "isposinf", "isneginf",
        "isclose", "allclose", "equal", "nan_to_num", "masked_fill", "masked_fill_")},
    "any": logical.any_, "all": logical.all_,
    **{name: getattr(triangular, name) for name in (
        "tril", "triu", "diagonal", "diag", "diag_embed", "trace")},
    **{name: getattr(mathfn, name) for name in (
        "erf", "erfc", "log2", "log10", "exp2", "expm1", "log1p", "tan", "asin", "acos", "atan",
        "sinh", "cosh", "asinh", "acosh", "atanh", "arcsin", "arccos", "arctan", "arcsinh",
        "arccosh", "arctanh", "deg2rad", "rad2deg", "logit", "sinc", "atan2", "arctan2", "hypot",
        "logaddexp", "xlogy", "lerp")},
    "cumsum": scan.cumsum, "cumprod": scan.cumprod, "unflatten": unflatten,
    "unfold": convolution.tensor_unfold,
    "add_": _inplace(add), "sub_": _inplace(sub), "mul_": _inplace(mul), "div_": _inplace(div),
    "clamp_": _inplace(more_shapes.clamp_tensor), "clip_": _inplace(more_shapes.clamp_tensor),
    "copy_": _inplace(lambda a, b: b),
    "relu_": _inplace(lambda a, _=None: relu(a)), "clip": more_shapes.clamp_tensor,
    "expand_as": lambda self, other: expand(self, other.shape),
    "view_as": lambda self, other: reshape(self, other.shape),
    "reshape_as": lambda self, other: reshape(self, other.shape),
    "type_as": lambda self, other: cast(self, other.dtype),
    "mm": matmul, "bmm": matmul, "index_select": index_select,
    **{name: getattr(more_shapes, name) for name in (
        "narrow", "select", "movedim", "moveaxis", "swapaxes", "swapdims", "take_along_dim",
        "clamp_min", "clamp_max", "diff", "outer", "dot", "inner", "ger")},
    "is_floating_point": lambda self: self.dtype.kind == "f",
    **{name: getattr(scatter_ops, name) for name in scatter_ops.__all__},
    **{name: getattr(compaction, name) for name in compaction.__all__},
    **{name: getattr(sorting, name) for name in sorting.__all__},
    **{name: getattr(reductions, name) for name in (
        "prod", "amax", "amin", "logsumexp", "norm", "count_nonzero", "nansum", "nanmean")},
    **{name: getattr(creators, name) for name in (
        "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor")},
})
