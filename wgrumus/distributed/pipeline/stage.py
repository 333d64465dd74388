"""PipelineStage: one piece of the model pinned to one device.

The stage owns the placement: its parameters are moved to its device once, when the stage is
built, and every forward runs there (an activation arriving from another device is copied over
first). The executor only ever calls :meth:`PipelineStage.forward`.
"""
from __future__ import annotations

from typing import Any

from ...runtime import get_device
from ...runtime.errors import DeviceMismatchError

__all__ = ["PipelineStage"]


class PipelineStage:
    """Wrap ``module_or_fn`` (an ``nn.Module``, any object with ``.to(device)`` and
    ``.parameters()``, or a plain callable) so that it lives and runs on ``device``.

    ``device`` is a :class:`~wgrumus.runtime.Device` or an index into ``wr.devices()``.
    """

    def __init__(self, module_or_fn: Any, device):
        if not callable(module_or_fn):
            raise TypeError(
                f"PipelineStage needs a module or a function (something callable), got "
                f"{type(module_or_fn).__name__}")
        self.device = get_device(device)
        self.module = moved_to(module_or_fn, self.device)
        self._check_placement()

    # ------------------------------------------------------------------ parameters
    def parameters(self) -> list:
        """The stage's trainable tensors (empty for a plain function)."""
        return parameters_of(self.module)

    def num_parameters(self) -> int:
        return sum(int(p.numel()) for p in self.parameters())

    def _check_placement(self) -> None:
        for i, p in enumerate(self.parameters()):
            if p.device is not self.device:
                raise DeviceMismatchError(
                    f"PipelineStage: parameter {i} (shape {tuple(p.shape)}) is on device "
                    f"{p.device.index} after {type(self.module).__name__}.to(device "
                    f"{self.device.index}); its .to() must move every parameter it returns "
                    f"from .parameters()")

    # ------------------------------------------------------------------ forward
    def forward(self, x):
        """Run the wrapped module on this stage's device (inputs on other devices are copied)."""
        x = _to_device(x, self.device)
        return self.module(x)

    __call__ = forward

    def __repr__(self) -> str:
        name = getattr(self.module, "__name__", None) or type(self.module).__name__
        return f"PipelineStage({name}, device={self.device.index}, params={self.num_parameters()})"


def moved_to(obj, device):
    """``obj.to(device)`` for anything with a ``to``: nn.Module.to moves in place and returns
    self; a functional wrapper may return a new object, which is then the moved one."""
    to = getattr(obj, "to", None)
    moved = to(device) if callable(to) else None
    return moved if moved is not None and callable(moved) else obj


def parameters_of(obj) -> list:
    """``obj.parameters()`` as a list; empty for an object without (a plain function)."""
    ps = getattr(obj, "parameters", None)
    return list(ps()) if callable(ps) else []


def _to_device(x, device):
    """Tensors (also inside tuples/lists/dicts) moved to ``device``; anything else unchanged."""
    if hasattr(x, "_storage") and hasattr(x, "to"):
        return x if x.device is device else x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to_device(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x

