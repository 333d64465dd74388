"""Tensor's methods: the table ``tensor.METHODS`` bound to the ops and compositions that
implement them (here, the lowest layer that sees both), once, as wgrumus loads."""
from __future__ import annotations

from ..autograd.engine import tensor_backward
from ..autograd.tape import is_grad_enabled
from ..ops import mathfn, scan, scatter_ops, triangular
from ..ops.compaction import nonzero
from ..ops.elementwise import (
    abs_,
    add,
    cast,
    clone,
    contiguous,
    copy_into,
    cos,
    eq,
    exp,
    fill_,
    floor_divide,
    ge,
    gelu,
    gt,
    le,
    leaky_relu,
    log,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow_,
    reciprocal,
    relu,
    remainder,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    square,
    sub,
    tanh,
)
from ..ops.indexing import gather, getitem, index_select, setitem
from ..ops.matmul import matmul
from ..ops.reduce import argmax, argmin, max, mean, min, std, sum, var
from ..ops.reductions import prod
from ..ops.rounding import ceil, fix, floor, round, sign, trunc
from ..ops.shape import (
    chunk,
    detach,
    expand,
    flatten,
    permute,
    reshape,
    split,
    squeeze,
    to,
    transpose,
    unflatten,
    unsqueeze,
)
from ..ops.softmax import log_softmax, softmax
from ..ops.sorting import argsort, unique
from ..tensor import register
from . import constructors, logical, more_shapes, reductions, sorting
from .repeat import flip, fliplr, flipud, repeat, repeat_interleave, roll, tensor_unfold, tile
from .spellings import cpu, div, frac


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
        "isclose", "allclose", "equal", "masked_fill", "masked_fill_")},
    "any": logical.any_, "all": logical.all_,
    **{name: getattr(triangular, name) for name in ("tril", "triu", "diagonal", "diag_embed")},
    "diag": more_shapes.diag, "trace": more_shapes.trace,
    **{name: getattr(mathfn, name) for name in (
        "erf", "erfc", "log2", "log10", "exp2", "expm1", "log1p", "tan", "asin", "acos", "atan",
        "sinh", "cosh", "asinh", "acosh", "atanh", "arcsin", "arccos", "arctan", "arcsinh",
        "arccosh", "arctanh", "deg2rad", "rad2deg", "logit", "sinc", "atan2", "arctan2", "hypot",
        "logaddexp", "xlogy", "lerp", "nan_to_num")},
    "cumsum": scan.cumsum, "cumprod": scan.cumprod, "unflatten": unflatten,
    "unfold": tensor_unfold,
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
    "nonzero": nonzero, "argwhere": logical.argwhere, "masked_select": logical.masked_select,
    "argsort": argsort, "unique": unique,
    **{name: getattr(sorting, name) for name in sorting.__all__},
    "prod": prod,
    **{name: getattr(reductions, name) for name in (
        "amax", "amin", "logsumexp", "norm", "count_nonzero", "nansum", "nanmean")},
    **{name: getattr(constructors, name) for name in (
        "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor")},
})
