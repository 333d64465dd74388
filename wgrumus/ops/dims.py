"""Argument conventions resolved in one place: PyTorch's names (``dim=``, ``keepdim=``) with
numpy's (``axis=``, ``keepdims=``) as aliases, and sizes given as ``f(2, 3)`` or ``f((2, 3))``."""
from __future__ import annotations


def pick(dim, axis, default=None, name: str = "dim", alias: str = "axis"):
    """The value given as ``dim`` or as its alias ``axis`` (not both), else ``default``."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"give {name}= or {alias}= (its numpy alias), not both")
        return axis
    return default if dim is None else dim


def varargs(args) -> tuple:
    """``f(2, 3)`` and ``f((2, 3))`` alike: the one tuple or list given, else the arguments."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


def keep(keepdim, keepdims) -> bool:
    """``keepdim`` (PyTorch) or ``keepdims`` (numpy)."""
    return bool(pick(keepdim or None, keepdims, False, "keepdim", "keepdims"))
