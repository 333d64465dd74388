"""PipelineStage: one piece of the model, moved to its device once, that runs every forward there
(copying activations that arrive from another device)."""
from __future__ import annotations

from typing import Any

from ...runtime import get_device
from ...runtime.errors import DeviceMismatchError


class PipelineStage:
    """``module_or_fn`` (a Module, anything with ``to``/``parameters``, or a callable) living and
    running on ``device`` (a Device or an index into ``wr.devices()``)."""

    def __init__(self, module_or_fn: Any, device):
        if not callable(module_or_fn):
            raise TypeError("PipelineStage needs a module or a function (something callable), got "
                            f"{type(module_or_fn).__name__}")
        self.device = get_device(device)
        self.module = moved_to(module_or_fn, self.device)
        self._check_placement()

    def parameters(self) -> list:
        return parameters_of(self.module)

    def num_parameters(self) -> int:
        return num_parameters(self.module)

    def _check_placement(self) -> None:
        for i, p in enumerate(self.parameters()):
            if p.device is not self.device:
                raise DeviceMismatchError(
                    f"PipelineStage: parameter {i} (shape {tuple(p.shape)}) is on device "
                    f"{p.device.index} after {type(self.module).__name__}.to(device "
                    f"{self.device.index}); its .to() must move every parameter it returns "
                    f"from .parameters()")

    def forward(self, x):
        return self.module(_to_device(x, self.device))

    __call__ = forward

    def __repr__(self) -> str:
        name = getattr(self.module, "__name__", None) or type(self.module).__name__
        return f"PipelineStage({name}, device={self.device.index}, params={self.num_parameters()})"


def moved_to(obj, device):
    """``obj.to(device)`` where it has one (a wrapper's ``to`` may return a new object)."""
    to = getattr(obj, "to", None)
    moved = to(device) if callable(to) else None
    return moved if moved is not None and callable(moved) else obj


def parameters_of(obj) -> list:
    """``obj.parameters()`` as a list; empty for an object without (a plain function)."""
    ps = getattr(obj, "parameters", None)
    return list(ps()) if callable(ps) else []


def num_parameters(obj) -> int:
    return sum(int(p.numel()) for p in parameters_of(obj))


def _to_device(x, device):
    """Tensors (also inside tuples/lists/dicts) moved to ``device``; anything else unchanged."""
    if hasattr(x, "storage") and hasattr(x, "to"):
        return x if x.device is device else x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to_device(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x

