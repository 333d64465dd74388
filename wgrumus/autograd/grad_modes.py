"""PyTorch's other grad-mode switches over the tape's no-grad counter: inference_mode and
set_grad_enabled (a call, a context manager or a decorator, as in PyTorch)."""
from __future__ import annotations

import contextlib
import functools

from . import tape


def inference_mode(mode: bool = True):
    """No graph is recorded inside (wgrumus has no separate inference tensors: no_grad)."""
    return tape.no_grad() if mode else contextlib.nullcontext()


class set_grad_enabled:  # noqa: N801  (PyTorch's name)
    """Turn recording on or off for this thread now; as a context manager, until the block
    ends."""

    def __init__(self, mode: bool):
        self.prev = getattr(tape._local, "no_grad", 0)
        tape._local.no_grad = 0 if mode else max(self.prev, 1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        tape._local.no_grad = self.prev
        return False

    def __call__(self, fn):
        mode = tape._local.no_grad == 0
        tape._local.no_grad = self.prev  # a decorator does not switch at definition

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapped


__all__ = ["inference_mode", "set_grad_enabled"]
