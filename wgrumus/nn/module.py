"""Module and Parameter: the PyTorch container model (named parameters, buffers, sub-modules,
state_dict) over wgrumus tensors."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..autograd.tape import no_grad
from ..runtime import get_device
from ..runtime.capture import capturing, guard
from ..runtime.errors import WgrumusError
from ..tensor import Tensor, float32, tensor


class Parameter(Tensor):
    """A trainable leaf sharing the wrapped tensor's storage; its identity (and GradId) is
    stable for the module's life, so optimizers and GradientStores key on it."""
    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True):
        if not isinstance(data, Tensor):
            data = tensor(np.asarray(data, dtype=np.float32))
        if not data.is_contiguous():
            with no_grad():
                data = data.contiguous()
        super().__init__(data.storage, data.shape, data.strides, data.offset, data.dtype,
                         requires_grad=requires_grad and data.dtype == float32)

    def __repr__(self):
        return "Parameter(" + super().__repr__() + ")"


class StateDictError(WgrumusError):
    """load_state_dict found missing, unexpected or wrongly shaped entries."""


def _as_array(v) -> np.ndarray:
    return v.numpy() if isinstance(v, Tensor) else np.asarray(v)


def _assign(dst: Tensor, value, name: str) -> None:
    """Copy ``value`` (Tensor on any device, or array-like) into ``dst`` in place."""
    from ..ops.elementwise import copy_into
    if isinstance(value, Tensor) and value.device is dst.device and value.dtype == dst.dtype:
        with no_grad():
            copy_into(dst, value)
        return
    arr = np.asarray(_as_array(value))
    if arr.dtype != dst.dtype:
        if dst.dtype.kind == "i" and arr.dtype.kind in "iu":
            info = np.iinfo(np.int32)
            if arr.size and (arr.max() > info.max or arr.min() < info.min):
                raise StateDictError(f"{name}: integer values do not fit in int32")
        arr = arr.astype(dst.dtype)
    if not dst.is_contiguous():
        raise WgrumusError(f"{name}: cannot load into a non-contiguous tensor")
    dst.device.write(dst.buffer, np.ascontiguousarray(arr),
                     dst.offset * dst.dtype.itemsize)
    dst.storage.version += 1


class Module:
    """Base of every layer: Parameters, Modules and buffers tracked by name (PyTorch's keys)."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise WgrumusError(f"{type(self).__name__}.__init__ must call super().__init__() "
                               f"before assigning attributes")
        if name in self._buffers and (value is None or (isinstance(value, Tensor)
                                                         and not isinstance(value, Parameter))):
            self._buffers[name] = value  # re-assigning a buffer keeps it a buffer (like torch)
            return
        for d in (self._parameters, self._buffers, self._modules):
            d.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' has no attribute '{name}'")

    def __delattr__(self, name):
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param) -> None:
        if param is None:
            self._parameters.pop(name, None)
            object.__setattr__(self, name, None)
            return
        setattr(self, name, param if isinstance(param, Parameter) else Parameter(param))

    def register_buffer(self, name: str, value: Tensor, persistent: bool = True) -> None:
        """A tensor that is state but not trained (e.g. BatchNorm running statistics)."""
        self.__dict__.pop(name, None)
        self._buffers[name] = value
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module) -> None:
        setattr(self, name, module)

    def named_modules(self, prefix: str = "", memo=None):
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        return ((n, m) for n, m in self._modules.items() if m is not None)

    def children(self):
        return (m for _, m in self.named_children())

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mp, m in mods:
            for n, p in m._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mp}.{n}" if mp else n), p

    def parameters(self, recurse: bool = True):
        return [p for _, p in self.named_parameters(recurse=recurse)]

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mp, m in mods:
            for n, b in m._buffers.items():
                if b is not None:
                    yield (f"{mp}.{n}" if mp else n), b

    def buffers(self, recurse: bool = True):
        return [b for _, b in self.named_buffers(recurse=recurse)]

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def state_dict(self) -> OrderedDict[str, Tensor]:
        """name -> tensor (sharing storage with the module: copy before mutating)."""
        out = OrderedDict()
        for mp, m in self.named_modules():
            for n, p in m._parameters.items():
                if p is not None:
                    out[f"{mp}.{n}" if mp else n] = p.detach()
            for n, b in m._buffers.items():
                if b is not None and n not in m._non_persistent:
                    out[f"{mp}.{n}" if mp else n] = b
        return out

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy values (Tensors or arrays) in place, reporting every problem at once; returns
        (missing, unexpected) like PyTorch."""
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        bad = []
        for k, dst in own.items():
            if k in state_dict:
                shp = tuple(np.shape(state_dict[k]) if not isinstance(state_dict[k], Tensor)
                            else state_dict[k].shape)
                if shp != tuple(dst.shape):
                    bad.append(f"{k}: checkpoint has shape {shp}, module has {tuple(dst.shape)}")
        problems = []
        if bad:
            problems.append("shape mismatch for " + "; ".join(bad))
        if strict and missing:
            problems.append("missing keys (in the module, not in the state dict): "
                            + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys (in the state dict, not in the module): "
                            + ", ".join(unexpected))
        if problems:
            hint = (" Pass strict=False to skip missing/unexpected keys." if not bad else
                    " Build the module with the sizes the checkpoint was saved with.")
            raise StateDictError(f"load_state_dict into {type(self).__name__} failed: "
                                 + " | ".join(problems) + "." + hint)
        for k, dst in own.items():
            if k in state_dict:
                _assign(dst, state_dict[k], k)
        return missing, unexpected

    def train(self, mode: bool = True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def to(self, device):
        """Move parameters and buffers in place (optimizers built before stay valid)."""
        dev = get_device(device)
        with no_grad():
            for m in self.modules():
                for d in (m._parameters, m._buffers):
                    for t in d.values():
                        if t is None or t.device is dev:
                            continue
                        moved = t.to(dev)
                        t.storage, t.strides = moved.storage, moved.strides
                        t.offset = moved.offset
                        if t.grad is not None:
                            t.grad = t.grad.to(dev)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            p.grad = None

    def requires_grad_(self, flag: bool = True):
        for p in self.parameters():
            p.requires_grad_(flag)
        return self

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        if capturing():  # a replay runs the forward of this mode (dropout, batch statistics)
            guard(("training", id(self)), f"{type(self).__name__}.training (train() / eval())",
                  lambda: self.training)
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        lines = [f"({n}): " + repr(m).replace("\n", "\n  ") for n, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"
