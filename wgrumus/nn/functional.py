"""Stateless layer functions with PyTorch's names and signatures, over ``wgrumus.ops``."""
from __future__ import annotations

from ..autograd.tape import no_grad
from ..kernels.map import run_map
from ..ops import conv, losses
from ..ops import elementwise as _ew
from ..ops.dropout import dropout
from ..ops.elementwise import gelu, relu, sigmoid, tanh
from ..ops.indexing import embedding
from ..ops.layer_norm import layer_norm
from ..ops.reduce import mean as _mean
from ..ops.softmax import log_softmax as _log_softmax
from ..ops.softmax import softmax as _softmax
from ..tensor import Tensor

__all__ = ["avg_pool2d", "batch_norm", "conv2d", "cross_entropy", "dropout", "embedding", "gelu",
           "layer_norm", "linear", "log_softmax", "max_pool2d", "mse_loss", "relu", "sigmoid",
           "softmax", "tanh"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           activation: str | None = None, residual: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias in one fused node (ops/linear.py); ``activation`` and ``residual``
    are wgrumus extensions fused into the same kernels."""
    from ..ops.linear import linear as _linear
    return _linear(x, weight, bias, activation, residual)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return _softmax(x, dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return _log_softmax(x, dim)


def conv2d(x, weight, bias=None, stride=1, padding=0) -> Tensor:
    return conv.conv2d(x, weight, bias, stride=stride, padding=padding)


def max_pool2d(x, kernel_size, stride=None, padding=0) -> Tensor:
    return conv.max_pool2d(x, kernel_size, stride=stride, padding=padding)


def avg_pool2d(x, kernel_size, stride=None, padding=0) -> Tensor:
    return conv.avg_pool2d(x, kernel_size, stride=stride, padding=padding)


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """Logits [N, C] (or [N, C, ...] flattened by the caller) and integer class targets [N]."""
    return losses.cross_entropy(logits, target, ignore_index=ignore_index,
                               label_smoothing=label_smoothing, reduction=reduction)


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return losses.mse_loss(x, target, reduction=reduction)


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
