"""Layers with PyTorch's parameter names, shapes and default initialisation."""
from __future__ import annotations

import math

from ..autograd.tape import no_grad
from ..kernels.map import run_map
from ..ops.conv import pair
from ..ops.creation import ones, zeros
from ..runtime import get_device
from ..tensor import Tensor, as_shape, int32
from . import functional as F
from . import init
from .module import Module, Parameter


def _sub(seed, k):
    """k-th derived seed of a layer seed (None keeps the global generator)."""
    return None if seed is None else (int(seed) * 1000003 + k) & 0xFFFFFFFF


def _empty(shape, device):
    return Tensor.empty(shape, get_device(device))


def affine_parameters(module, shape, device, weight: bool = True, bias: bool = True) -> None:
    """A norm layer's ``weight`` (ones) and ``bias`` (zeros) of ``shape``; each one not asked
    for is registered as None, as PyTorch does."""
    dev = get_device(device) if weight or bias else None
    if weight:
        module.weight = Parameter(ones(shape, device=dev))
    else:
        module.register_parameter("weight", None)
    if bias:
        module.bias = Parameter(zeros(shape, device=dev))
    else:
        module.register_parameter("bias", None)


class _Container(Module):
    """Sequential's and ModuleList's list behaviour (a slice is a new one, via ``_of``)."""

    def append(self, m: Module):
        self.add_module(str(len(self._modules)), m)
        return self

    def __getitem__(self, i):
        mods = list(self._modules.values())
        return self._of(mods[i]) if isinstance(i, slice) else mods[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class Sequential(_Container):
    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], dict):
            for k, m in modules[0].items():
                self.add_module(str(k), m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, x):
        mods = list(self._modules.values())
        i = 0
        while i < len(mods):
            m = mods[i]
            act = _fusable(m, mods[i + 1]) if i + 1 < len(mods) else None
            if act is not None:  # Linear then ReLU / GELU: one fused op (same result)
                x = F.linear(x, m.weight, m.bias, act)
                i += 2
                continue
            x = m(x)
            i += 1
        return x

    _of = classmethod(lambda cls, mods: cls(*mods))


def _fusable(m, nxt):
    """The fused activation name when ``m`` is a Linear followed by an exact ReLU or GELU."""
    if type(m) is not Linear:
        return None
    if type(nxt) is ReLU:
        return "relu"
    if type(nxt) is GELU:
        return "gelu" if nxt.approximate == "none" else "gelu_tanh"
    return None


class ModuleList(_Container):
    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    _of = classmethod(lambda cls, mods: cls(mods))

    def extend(self, ms):
        for m in ms:
            self.append(m)
        return self


class Identity(Module):
    def forward(self, x):
        return x


class Linear(Module):
    """y = x @ W.T + b; W [out, in] ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform a=sqrt(5))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 seed=None):
        super().__init__()
        in_features, out_features = as_shape((in_features, out_features),
                                             "nn.Linear(in_features, out_features)")
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(init.kaiming_uniform_(_empty((out_features, in_features), device),
                                                      a=math.sqrt(5), seed=_sub(seed, 0)))
        if bias:
            self.bias = Parameter(init.default_bias_(_empty((out_features,), device), in_features,
                                                     seed=_sub(seed, 1)))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"


class Embedding(Module):
    """Lookup table [num_embeddings, embedding_dim] ~ N(0, 1) like PyTorch."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, seed=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(init.normal_(_empty((num_embeddings, embedding_dim), device),
                                             seed=_sub(seed, 0)))

    def forward(self, idx):
        return F.embedding(idx, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None):
        super().__init__()
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = ns, eps
        dev = get_device(device)
        affine_parameters(self, ns, dev, elementwise_affine, elementwise_affine and bias)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class BatchNorm2d(Module):
    """Batch statistics over (N, H, W) in training; running_mean / running_var (momentum 0.1,
    unbiased variance) and num_batches_tracked are buffers in the state_dict, like PyTorch."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        dev = get_device(device)
        affine_parameters(self, num_features, dev, affine, affine)
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, device=dev))
            self.register_buffer("running_var", ones(num_features, device=dev))
            self.register_buffer("num_batches_tracked", zeros((), device=dev, dtype=int32))
        else:
            self.running_mean = self.running_var = None

    def forward(self, x):
        if x.ndim != 4:
            from ..runtime.errors import ShapeError
            raise ShapeError(f"BatchNorm2d expects [N, C, H, W], got shape {x.shape}")
        use_batch = self.training or not self.track_running_stats
        if self.training and self.track_running_stats:
            with no_grad():
                run_map("a + 1", self.num_batches_tracked, [self.num_batches_tracked])
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=use_batch, momentum=self.momentum, eps=self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Dropout(Module):
    """Zeroes elements with probability p in training (scaled by 1/(1-p)); identity in eval."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class Conv2d(Module):
    """weight [out, in, kh, kw] ~ kaiming_uniform(a=sqrt(5)); bias U(+-1/sqrt(in*kh*kw))."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, device=None, seed=None):
        super().__init__()
        kh, kw = pair(kernel_size, "kernel_size")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.padding = (kh, kw), pair(padding, "padding")
        self.stride = pair(stride, "stride")
        self.weight = Parameter(init.kaiming_uniform_(
            _empty((out_channels, in_channels, kh, kw), device), a=math.sqrt(5),
            seed=_sub(seed, 0)))
        if bias:
            self.bias = Parameter(init.default_bias_(_empty((out_channels,), device),
                                                     in_channels * kh * kw, seed=_sub(seed, 1)))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else pair(stride, "stride")
        self.padding = pair(padding, "padding")

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class AvgPool2d(MaxPool2d):
    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)
