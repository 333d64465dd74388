"""PyTorch's argument names (``dim=``, ``keepdim=``) with numpy's (``axis=``, ``keepdims=``)
accepted as aliases, resolved in one place so every op reports a clash the same way."""
from __future__ import annotations


def pick(dim, axis, default=None, name: str = "dim", alias: str = "axis"):
    """The value given as ``dim`` or as its alias ``axis`` (not both), else ``default``."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"give {name}= or {alias}= (its numpy alias), not both")
        return axis
    return default if dim is None else dim


def keep(keepdim, keepdims) -> bool:
    """``keepdim`` (PyTorch) or ``keepdims`` (numpy)."""
    return bool(pick(keepdim or None, keepdims, False, "keepdim", "keepdims"))
