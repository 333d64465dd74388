"""PyTorch's activation modules and the containers and norms a PyTorch model reaches for
beyond layers.py: ModuleDict, BatchNorm1d."""
from __future__ import annotations

from ..ops.elementwise import leaky_relu
from ..runtime.errors import ShapeError
from . import functional as A
from .layers import BatchNorm2d
from .module import Module, Parameter


def _simple(name: str, fn, doc: str):
    def forward(self, x):
        return fn(x)
    return type(name, (Module,), {"forward": forward, "__doc__": doc})


SiLU = _simple("SiLU", A.silu, "x * sigmoid(x)")
Mish = _simple("Mish", A.mish, "x * tanh(softplus(x))")
SELU = _simple("SELU", A.selu, "scale * elu(x, alpha) with the self-normalising constants")
Hardswish = _simple("Hardswish", A.hardswish, "x * relu6(x + 3) / 6")
Hardsigmoid = _simple("Hardsigmoid", A.hardsigmoid, "relu6(x + 3) / 6")
ReLU6 = _simple("ReLU6", A.relu6, "clamp(x, 0, 6)")
Softsign = _simple("Softsign", A.softsign, "x / (1 + |x|)")
LogSigmoid = _simple("LogSigmoid", A.logsigmoid, "log(sigmoid(x))")
Tanhshrink = _simple("Tanhshrink", A.tanhshrink, "x - tanh(x)")


class _WithArgs(Module):
    """An activation with keyword settings, shown by repr."""
    _fn = None
    _args: tuple = ()

    def __init__(self, *args, **kwargs):
        super().__init__()
        names = self._args
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} arguments")
        vals = dict(zip(names, args))
        vals.update(kwargs)
        unknown = set(vals) - set(names) - {"inplace"}
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown arguments {sorted(unknown)}")
        vals.pop("inplace", None)
        self.kwargs = vals

    def forward(self, x):
        return type(self)._fn(x, **self.kwargs)

    def extra_repr(self):
        return ", ".join(f"{k}={v}" for k, v in self.kwargs.items())


def _with_args(name, fn, args):
    return type(name, (_WithArgs,), {"_fn": staticmethod(fn), "_args": args})


LeakyReLU = _with_args("LeakyReLU", leaky_relu, ("negative_slope",))
ELU = _with_args("ELU", A.elu, ("alpha",))
CELU = _with_args("CELU", A.celu, ("alpha",))
Softplus = _with_args("Softplus", A.softplus, ("beta", "threshold"))
Hardtanh = _with_args("Hardtanh", A.hardtanh, ("min_val", "max_val"))
Softshrink = _with_args("Softshrink", A.softshrink, ("lambd",))
Hardshrink = _with_args("Hardshrink", A.hardshrink, ("lambd",))
Threshold = _with_args("Threshold", A.threshold, ("threshold", "value"))
GLU = _with_args("GLU", A.glu, ("dim",))
Softmax = _with_args("Softmax", A.softmax, ("dim",))
LogSoftmax = _with_args("LogSoftmax", A.log_softmax, ("dim",))


class PReLU(Module):
    """x where x > 0, else a learned slope (one, or one per channel) times x."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None):
        super().__init__()
        from ..ops.creation import full
        self.weight = Parameter(full((num_parameters,), float(init), device, "float32"))

    def forward(self, x):
        return A.prelu(x, self.weight)


class ModuleDict(Module):
    """Sub-modules by name, registered in insertion order (their parameters are the model's)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules) -> None:
        for k, m in (modules.items() if hasattr(modules, "items") else modules):
            self[k] = m

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def clear(self) -> None:
        self._modules.clear()


class BatchNorm1d(BatchNorm2d):
    """BatchNorm over [N, C] or [N, C, L] (statistics over every dim but C)."""

    def forward(self, x):
        if x.ndim not in (2, 3):
            raise ShapeError(f"BatchNorm1d expects [N, C] or [N, C, L], got shape {x.shape}")
        y = super().forward(x.reshape(x.shape + (1,) * (4 - x.ndim)))
        return y.reshape(x.shape)


__all__ = ["CELU", "ELU", "GLU", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh",
           "LeakyReLU", "LogSigmoid", "LogSoftmax", "Mish", "ModuleDict", "PReLU", "ReLU6",
           "SELU", "SiLU", "Softmax", "Softplus", "Softshrink", "Softsign", "Tanhshrink",
           "Threshold", "BatchNorm1d"]
