"""Stateless layer functions with PyTorch's names and signatures: ops (wgrumus/ops/) under
their functional names, and the functional forms defined by other ops (this package's modules:
activations, losses, padding, convolutions)."""
from __future__ import annotations

from ...autograd.tape import no_grad
from ...composite.more_shapes import cdist, cosine_similarity, pairwise_distance
from ...composite.reductions import vector_norm as _vector_norm
from ...kernels.map import run_map
from ...ops import convolution as _pool
from ...ops import elementwise as _ew
from ...ops import losses as _losses
from ...ops.softmax import log_softmax as _log_softmax
from ...ops.softmax import softmax as _softmax
from ...ops.activations import (celu, elu, hardshrink, hardsigmoid, hardswish, hardtanh,
                                logsigmoid, mish, selu, silu, softplus, softshrink, softsign,
                                tanhshrink, threshold)
from ...ops.creators import one_hot
from ...ops.dropout import dropout
from ...ops.elementwise import gelu, leaky_relu, relu, sigmoid, tanh
from ...ops.indexing import embedding
from ...ops.layer_norm import layer_norm
from ...ops.reduce import mean as _mean
from ...tensor import Tensor
from . import convolution, losses
from .activations import glu, prelu, relu6
from .padding import pad

__all__ = ["avg_pool2d", "batch_norm", "conv2d", "cross_entropy", "dropout", "embedding", "gelu",
           "layer_norm", "linear", "log_softmax", "max_pool2d", "mse_loss", "relu", "sigmoid",
           "scaled_dot_product_attention", "softmax", "tanh",
           "pad", "celu", "elu", "glu", "hardshrink", "hardsigmoid", "hardswish", "hardtanh",
           "leaky_relu", "logsigmoid", "mish", "one_hot", "prelu", "relu6", "selu", "silu",
           "softplus", "softshrink", "softsign", "tanhshrink", "threshold", "normalize",
           "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "l1_loss",
           "smooth_l1_loss", "huber_loss", "kl_div", "conv1d", "conv_transpose1d",
           "conv_transpose2d", "max_pool1d", "avg_pool1d", "adaptive_avg_pool1d",
           "adaptive_avg_pool2d", "adaptive_max_pool2d", "interpolate", "unfold", "fold",
           "upsample", "cdist", "cosine_similarity", "pairwise_distance", "group_norm",
           "instance_norm"]


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    from ..norm_pad_layers import group_norm as _group_norm
    return _group_norm(x, num_groups, weight, bias, eps)


def instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    from ..norm_pad_layers import instance_norm as _instance_norm
    return _instance_norm(x, running_mean, running_var, weight, bias, use_input_stats,
                          momentum, eps)
l1_loss, smooth_l1_loss = losses.l1_loss, _losses.smooth_l1_loss
huber_loss, kl_div = _losses.huber_loss, _losses.kl_div


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """x / max(||x||_p over dim, eps)."""
    return x / _ew.clamp(_vector_norm(x, p, dim, keepdim=True), min=eps)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           activation: str | None = None, residual: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias in one fused node (ops/linear.py); ``activation`` and ``residual``
    are wgrumus extensions fused into the same kernels."""
    from ...ops.linear import linear as _linear
    return _linear(x, weight, bias, activation, residual)


def softmax(x: Tensor, dim: int = -1, dtype=None) -> Tensor:
    return _softmax(x, dim, dtype)


def log_softmax(x: Tensor, dim: int = -1, dtype=None) -> Tensor:
    return _log_softmax(x, dim, dtype)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None) -> Tensor:
    """PyTorch's signature. ``attn_mask`` is added to the scores (a float mask: 0 keeps, -inf
    drops); a numpy bool array (True keeps) is turned into that. ``dropout_p`` applies as in
    PyTorch's functional form (always, not only in training)."""
    import math

    import numpy as np

    from ..attention import scaled_dot_product_attention as sdpa
    if isinstance(attn_mask, np.ndarray) and attn_mask.dtype == np.bool_:
        from ...tensor import tensor
        attn_mask = tensor(np.where(attn_mask, 0.0, -np.inf).astype(np.float32),
                           device=query.device)
    if scale is not None:  # sdpa scales by 1/sqrt(d): fold the difference into q
        query = query * (float(scale) * math.sqrt(query.shape[-1]))
    return sdpa(query, key, value, attn_mask, dropout_p, dropout_p > 0.0, is_causal)


conv2d, conv1d = convolution.conv2d, convolution.conv1d
conv_transpose1d, conv_transpose2d = convolution.conv_transpose1d, convolution.conv_transpose2d
max_pool1d, max_pool2d = convolution.max_pool1d, _pool.max_pool2d
avg_pool1d, avg_pool2d = convolution.avg_pool1d, _pool.avg_pool2d
adaptive_avg_pool1d = convolution.adaptive_avg_pool1d
adaptive_avg_pool2d = convolution.adaptive_avg_pool2d
adaptive_max_pool2d = convolution.adaptive_max_pool2d
interpolate, unfold, fold = convolution.interpolate, _pool.unfold, _pool.fold


def upsample(x, size=None, scale_factor=None, mode="nearest", align_corners=None):
    return interpolate(x, size, scale_factor, mode, align_corners)


def cross_entropy(logits: Tensor, target, weight=None, size_average=None,
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """PyTorch's signature: int32 class targets ([N], or [N, d...] for [N, C, d...] logits) or
    float class probabilities (the logits' shape); ``weight`` per class."""
    _no_legacy(size_average, reduce)
    return losses.cross_entropy(logits, target, weight, ignore_index, reduction,
                                label_smoothing)


def _no_legacy(size_average, reduce):
    if size_average is not None or reduce is not None:
        raise TypeError("size_average= and reduce= are PyTorch's deprecated spellings; use "
                        "reduction='mean' / 'sum' / 'none'")


def nll_loss(x: Tensor, target, weight=None, size_average=None, ignore_index: int = -100,
             reduce=None, reduction: str = "mean") -> Tensor:
    _no_legacy(size_average, reduce)
    return losses.nll_loss(x, target, weight, ignore_index, reduction)


def binary_cross_entropy(x: Tensor, target, weight=None, size_average=None, reduce=None,
                         reduction: str = "mean") -> Tensor:
    _no_legacy(size_average, reduce)
    return _losses.binary_cross_entropy(x, target, weight, reduction)


def binary_cross_entropy_with_logits(x: Tensor, target, weight=None, size_average=None,
                                     reduce=None, reduction: str = "mean",
                                     pos_weight=None) -> Tensor:
    _no_legacy(size_average, reduce)
    return _losses.binary_cross_entropy_with_logits(x, target, weight, reduction, pos_weight)


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _losses.mse_loss(x, target, reduction=reduction)


def batch_norm(x: Tensor, running_mean, running_var, weight=None, bias=None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """BatchNorm over every axis but 1 (channels). In training the batch statistics are GPU
    reductions and the running stats are updated in place (unbiased variance, like PyTorch)."""
    axes = tuple(a for a in range(x.ndim) if a != 1)
    bshape = tuple(x.shape[1] if a == 1 else 1 for a in range(x.ndim))
    if training:
        mu = _mean(x, axes, keepdims=True)
        xc = x - mu
        var = _mean(xc * xc, axes, keepdims=True)
        if running_mean is not None:
            n = x.numel() // x.shape[1]
            with no_grad():
                run_map("(1.0 - m) * a + m * b", running_mean, [
                    running_mean, mu.detach().reshape(running_mean.shape)], {"m": float(momentum)})
                run_map("(1.0 - m) * a + m * b * unbias", running_var, [
                    running_var, var.detach().reshape(running_var.shape)],
                    {"m": float(momentum), "unbias": n / max(n - 1, 1)})
        y = xc * _ew.rsqrt(var + eps)
    else:
        y = (x - running_mean.reshape(bshape)) * _ew.rsqrt(running_var.reshape(bshape) + eps)
    if weight is not None:
        y = y * weight.reshape(bshape)
    if bias is not None:
        y = y + bias.reshape(bshape)
    return y
