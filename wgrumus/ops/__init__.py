"""What every primitive op is: its shape rule, forward call and backward rule side by side, one
module per family (how each runs on this adapter: wgrumus/kernels/). Ops defined by other ops
are the layer above (wgrumus/composite/, and wgrumus/nn/functional/ for PyTorch's functional
forms), which also binds Tensor's methods (the table ``tensor.METHODS``)."""
from __future__ import annotations

from .creation import arange, empty, full, ones, ones_like, rand, randn, zeros, zeros_like
from .elementwise import (abs_, add, cast, clamp, clone, contiguous, cos, div, eq, exp,
                          fill_, floor_divide, ge, gelu, gt, le, leaky_relu, log, lt, maximum,
                          minimum, mul, ne, neg, pow_, reciprocal, relu, remainder, rsqrt,
                          sigmoid, sin, sqrt, square, sub, tanh, where)
from .matmul import matmul
from .conv import avg_pool2d, conv2d, im2col, max_pool2d
from .indexing import embedding, gather, getitem, index_select, setitem
from .dropout import dropout
from .layer_norm import layer_norm
from .losses import cross_entropy, mse_loss
from . import (activations, compaction, creators, mathfn, reductions, scan, sorting,
               triangular)
from . import scatter as scatter_ops
from .rounding import ceil, fix, floor, round, sign, trunc
from .softmax import log_softmax, softmax
from .random import get_rng_state, manual_seed, set_rng_state
from .reduce import argmax, argmin, max, mean, min, std, sum, var
from .shape import (cat, chunk, detach, expand, flatten, permute, reshape, split, squeeze, stack,
                    to, transpose, unflatten, unsqueeze)


__all__ = [  # the functional forms
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
    "ceil", "fix", "floor", "round", "sign", "trunc", "unflatten",
    *creators.__all__, *mathfn.__all__, *triangular.__all__, *activations.__all__,
    *reductions.__all__, *scan.__all__, *scatter_ops.__all__, *compaction.__all__,
    *sorting.__all__]
# the functional forms of the modules above, by the names in their __all__
for _m in (creators, mathfn, triangular, activations, reductions, scan, scatter_ops, compaction,
           sorting):
    globals().update({_n: getattr(_m, _n) for _n in _m.__all__})
