"""GroupNorm / InstanceNorm (F.group_norm, F.instance_norm), the padding modules and
Unflatten, with PyTorch's signatures and defaults."""
from __future__ import annotations

from ..ops.elementwise import rsqrt
from ..ops.reduce import mean
from ..runtime.errors import ShapeError
from .functional.padding import pad
from .layers import affine_parameters
from .module import Module


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    """Normalise each of ``num_groups`` channel groups of [N, C, ...] over its channels and
    positions (biased variance, as PyTorch), then the per-channel affine."""
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise ShapeError(f"group_norm: {num_groups} groups do not divide the channels of "
                         f"input {x.shape}")
    N, C = x.shape[:2]
    g = x.reshape((N, num_groups, -1))
    mu = mean(g, 2, keepdim=True)
    xc = g - mu
    y = (xc * rsqrt(mean(xc * xc, 2, keepdim=True) + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5):
    """Each channel of each sample normalised over its positions (no running statistics)."""
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise NotImplementedError("instance_norm with running statistics is not supported; "
                                  "use track_running_stats=False")
    return group_norm(x, x.shape[1], weight, bias, eps)


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: {num_groups} groups do not divide {num_channels} "
                             f"channels")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        affine_parameters(self, num_channels, device, affine, affine)

    def forward(self, x):
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"


class _InstanceNorm(Module):
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device=None):
        super().__init__()
        if track_running_stats:
            raise NotImplementedError("InstanceNorm with track_running_stats=True is not "
                                      "supported")
        self.num_features, self.eps = num_features, eps
        affine_parameters(self, num_features, device, affine, affine)

    def forward(self, x):
        return instance_norm(x, weight=self.weight, bias=self.bias, eps=self.eps)


class InstanceNorm1d(_InstanceNorm):
    pass


class InstanceNorm2d(_InstanceNorm):
    pass


class _Pad(Module):
    _mode = "constant"
    _n = 2

    def __init__(self, padding, value: float = 0.0):
        super().__init__()
        self.padding = (padding,) * (2 * self._n) if isinstance(padding, int) else tuple(padding)
        self.value = value

    def forward(self, x):
        return pad(x, self.padding, self._mode, self.value)

    def extra_repr(self):
        return f"{self.padding}"


def _pad_class(name, mode, n):
    return type(name, (_Pad,), {"_mode": mode, "_n": n})


ZeroPad1d, ZeroPad2d = _pad_class("ZeroPad1d", "constant", 1), _pad_class("ZeroPad2d",
                                                                          "constant", 2)
ConstantPad1d, ConstantPad2d = _pad_class("ConstantPad1d", "constant", 1), \
    _pad_class("ConstantPad2d", "constant", 2)
ReflectionPad1d, ReflectionPad2d = _pad_class("ReflectionPad1d", "reflect", 1), \
    _pad_class("ReflectionPad2d", "reflect", 2)
ReplicationPad1d, ReplicationPad2d = _pad_class("ReplicationPad1d", "replicate", 1), \
    _pad_class("ReplicationPad2d", "replicate", 2)
CircularPad1d, CircularPad2d = _pad_class("CircularPad1d", "circular", 1), \
    _pad_class("CircularPad2d", "circular", 2)


def _constant_init(self, padding, value: float):
    _Pad.__init__(self, padding, value)


ConstantPad1d.__init__ = ConstantPad2d.__init__ = _constant_init


class Unflatten(Module):
    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim, self.sizes = dim, tuple(unflattened_size)

    def forward(self, x):
        return x.unflatten(self.dim, self.sizes)


__all__ = ["CircularPad1d", "CircularPad2d", "ConstantPad1d", "ConstantPad2d", "GroupNorm",
           "InstanceNorm1d", "InstanceNorm2d", "ReflectionPad1d", "ReflectionPad2d",
           "ReplicationPad1d", "ReplicationPad2d", "Unflatten", "ZeroPad1d", "ZeroPad2d",
           "group_norm", "instance_norm"]
