"""Convolution, pooling and resampling modules with PyTorch's signatures (groups, dilation,
padding='same', ceil_mode, ...): Conv1d / Conv2d, ConvTranspose1d / 2d, MaxPool1d / 2d,
AvgPool1d / 2d, AdaptiveAvgPool1d / 2d, AdaptiveMaxPool2d, Upsample, Unfold, Fold."""
from __future__ import annotations

import math

from ..ops.conv import pair
from . import functional as C
from . import init
from .layers import _empty, _sub
from .module import Module, Parameter


def _tuple(v, n: int, name: str) -> tuple:
    if isinstance(v, str):
        return v
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
    if len(t) != n:
        raise ValueError(f"{name} must be an int or {n} ints, got {v!r}")
    return tuple(int(a) for a in t)


class _ConvNd(Module):
    _dims = 2
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None, seed=None, output_padding=0):
        super().__init__()
        n = self._dims
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{type(self).__name__}: in_channels ({in_channels}) and "
                             f"out_channels ({out_channels}) must be divisible by groups "
                             f"({groups})")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{type(self).__name__}: padding_mode {padding_mode!r}; "
                                      f"pad with F.pad(x, ..., mode) first, then padding=0")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, n, "kernel_size")
        self.stride, self.padding = _tuple(stride, n, "stride"), _tuple(padding, n, "padding")
        self.dilation = _tuple(dilation, n, "dilation")
        self.output_padding = _tuple(output_padding, n, "output_padding")
        shape = ((in_channels, out_channels // groups) if self._transposed else
                 (out_channels, in_channels // groups)) + self.kernel_size
        fan_in = shape[1] * math.prod(self.kernel_size)
        self.weight = Parameter(init.kaiming_uniform_(_empty(shape, device), a=math.sqrt(5),
                                                      seed=_sub(seed, 0)))
        if bias:
            self.bias = Parameter(init.default_bias_(_empty((out_channels,), device), fan_in,
                                                     seed=_sub(seed, 1)))
        else:
            self.register_parameter("bias", None)

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding not in ((0,) * self._dims, "valid"):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._dims:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


class Conv2d(_ConvNd):
    """weight [out, in / groups, kh, kw] ~ kaiming_uniform(a=sqrt(5)); bias
    U(+-1/sqrt(fan_in))."""

    def forward(self, x):
        return C.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class Conv1d(_ConvNd):
    _dims = 1

    def forward(self, x):
        return C.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class ConvTranspose2d(_ConvNd):
    _transposed = True

    def forward(self, x):
        return C.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)


class ConvTranspose1d(_ConvNd):
    _dims = 1
    _transposed = True

    def forward(self, x):
        return C.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else pair(stride, "stride")
        self.padding, self.dilation = pair(padding, "padding"), pair(dilation, "dilation")
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        return C.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None):
        super().__init__()
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else pair(stride, "stride")
        self.padding = pair(padding, "padding")
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        return C.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class MaxPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__()
        self.args = (kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def forward(self, x):
        return C.max_pool1d(x, *self.args)


class AvgPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True):
        super().__init__()
        self.args = (kernel_size, stride, padding, ceil_mode, count_include_pad)

    def forward(self, x):
        return C.avg_pool1d(x, *self.args)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return C.adaptive_avg_pool2d(x, self.output_size)


class AdaptiveAvgPool1d(AdaptiveAvgPool2d):
    def forward(self, x):
        return C.adaptive_avg_pool1d(x, self.output_size)


class AdaptiveMaxPool2d(Module):
    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, x):
        return C.adaptive_max_pool2d(x, self.output_size, self.return_indices)


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute = align_corners, recompute_scale_factor

    def forward(self, x):
        return C.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute)


class Unfold(Module):
    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.args = (kernel_size, dilation, padding, stride)

    def forward(self, x):
        return C.unfold(x, *self.args)


class Fold(Module):
    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.args = (output_size, kernel_size, dilation, padding, stride)

    def forward(self, x):
        return C.fold(x, *self.args)


__all__ = ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "AvgPool1d",
           "AvgPool2d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Fold",
           "MaxPool1d", "MaxPool2d", "Unfold", "Upsample"]
