"""Mixed precision as in PyTorch: ``autocast`` runs the matmul-heavy ops (matmul, linear, conv,
attention) in float16 and ``GradScaler`` scales the loss so small gradients survive f16.

Parameters, optimizer state and the autograd graph stay float32 (the master weights): under
autocast those ops cast their float32 inputs to f16 on the way into the kernel (f32
accumulation) and return float32, and their backward runs in f16 the same way, so gradients
reach the parameters in float32. Reductions, softmax statistics, layer norm and losses are
float32 throughout. Needs the adapter feature ``shader-f16``.
"""
from __future__ import annotations

import functools

import numpy as np

from .autograd import no_grad
from .ops.elementwise import contiguous, fill_
from .ops.precision import autocast_as, autocast_dtype, forget_copies
from .runtime import get_device
from .runtime.errors import AdapterLimitError, WgrumusError
from .runtime.kernels import multi_tensor_kernel
from .tensor import Tensor, float16, float32, int32

__all__ = ["GradScaler", "autocast"]

_UNSCALE_BRANCH = "        U{j}[u_({j}u) + e] = unscale_(G{j}[g_({j}u) + e]);"


def unscale_check(grads: list, inv_scale: float) -> tuple:
    """(grads * inv_scale as new tensors, 1-element int32 device flag: nonzero if any held an
    inf or NaN), in ceil(n / K) dispatches; one device each (the grads' device)."""
    dev = grads[0].device
    lim = int(dev.limits.get("max-storage-buffers-per-shader-stage", 8))
    k = max(1, min(20, (lim - 1) // 2))  # 20: the parameter words of one dispatch
    flag = fill_(Tensor.empty((1,), dev, int32), 0)
    out = []
    for c in range(0, len(grads), k):
        chunk = [contiguous(g) for g in grads[c:c + k]]
        us = [Tensor.empty(g.shape, dev, float32) for g in chunk]
        words, bufs, end = [float(inv_scale), flag.offset, 0, 0], [flag._storage.buffer], 0
        for g, u in zip(chunk, us):
            end += g.numel()
            words += [end, g.offset, u.offset]
            bufs += [g._storage.buffer, u._storage.buffer]
        if end:
            dev.dispatch_1d(multi_tensor_kernel("unscale", len(chunk), 2, "G:read U:read_write",
                                                _UNSCALE_BRANCH), bufs, words, end)
        out += us
    return out, flag


class autocast:
    """``with wr.autocast(dtype=wr.float16):`` runs matmul / linear / conv / attention in f16
    inside the block (this thread). Also a decorator. ``device`` (default: the default
    device) is checked for ``shader-f16`` on entry."""

    def __init__(self, dtype=float16, enabled: bool = True, device=None):
        if np.dtype(dtype) != float16:
            raise ValueError(f"autocast supports dtype float16 only, got {np.dtype(dtype)}")
        self.dtype, self.enabled, self.device = float16, bool(enabled), device
        self._ctx = []

    def __enter__(self):
        if self.enabled:
            dev = get_device(self.device)
            if "shader-f16" not in dev.features:
                raise AdapterLimitError(
                    f"autocast(float16) needs the adapter feature shader-f16, which {dev.name} "
                    f"does not have; train in float32 (--precision f32, or no autocast)")
        if self.enabled and autocast_dtype() is None:  # a new forward (ops/precision.py)
            forget_copies()
        ctx = autocast_as(self.dtype if self.enabled else None)
        ctx.__enter__()
        self._ctx.append(ctx)
        return self

    def __exit__(self, *exc):
        return self._ctx.pop().__exit__(*exc)

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*a, **k):
            with autocast(self.dtype, self.enabled, self.device):
                return fn(*a, **k)
        return wrapped


class GradScaler:
    """Dynamic loss scaling (PyTorch's defaults): ``scale(loss)`` multiplies by the scale;
    ``step(opt)`` unscales the gradients (unless ``unscale_`` already did, e.g. before
    clipping) and skips the update when one is inf/NaN; ``update()`` halves the scale after a
    skipped step and doubles it after ``growth_interval`` clean steps in a row.

    Gradients are ``p.grad``, or those of a GradientStore passed as ``grads`` (as to
    ``optimizer.step(grads)``). Unscaling and the inf/NaN check are one multi-tensor kernel
    (shaders/unscale.wgsl); the check reads one number back per step."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        if growth_factor <= 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError("GradScaler: growth_factor must be > 1, backoff_factor in (0, 1), "
                             "growth_interval >= 1")
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.enabled = bool(enabled)
        self._growth_tracker = 0
        self._found_inf: dict = {}  # id(optimizer) -> bool, since the last update()
        self.skipped_steps = 0

    def is_enabled(self) -> bool:
        return self.enabled

    def get_scale(self) -> float:
        return self._scale if self.enabled else 1.0

    def scale(self, outputs):
        """``outputs`` (a tensor, or a list / tuple of them) times the current scale."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if not isinstance(outputs, Tensor):
            raise TypeError(f"GradScaler.scale needs a tensor, got {type(outputs).__name__}")
        return outputs * self._scale

    def unscale_(self, optimizer, grads=None) -> None:
        """Divide this optimizer's gradients by the scale (new tensors, as clip_grad_norm_
        writes) and note whether any is inf/NaN. Once per optimizer between updates."""
        if not self.enabled:
            return
        if id(optimizer) in self._found_inf:
            raise WgrumusError("GradScaler.unscale_ was already called for this optimizer since "
                               "the last update(); call it once per step, before step()")
        pairs = [(p, p.grad if grads is None else grads.get(p))
                 for g in optimizer.param_groups for p in g["params"]]
        pairs = [(p, g) for p, g in pairs if g is not None]
        flags = []
        with no_grad():
            for dev in {id(g.device): g.device for _, g in pairs}.values():
                mine = [(p, g) for p, g in pairs if g.device is dev]
                us, flag = unscale_check([g for _, g in mine], 1.0 / self._scale)
                flags.append(flag)
                for (p, _), u in zip(mine, us):
                    if grads is None:
                        p.grad = u
                    else:
                        grads.remove(p)
                        grads.accumulate(p, u)
        self._found_inf[id(optimizer)] = any(f.item() for f in flags)

    def step(self, optimizer, grads=None):
        """``optimizer.step(grads)`` unless a gradient is inf/NaN (then the step is skipped
        and None returned; parameters and optimizer state stay as they were)."""
        if not self.enabled:
            return optimizer.step(grads)
        if id(optimizer) not in self._found_inf:
            self.unscale_(optimizer, grads)
        if self._found_inf[id(optimizer)]:
            self.skipped_steps += 1
            return None
        return optimizer.step(grads)

    def update(self, new_scale: float | None = None) -> None:
        """Adjust the scale for the next step (or set ``new_scale``)."""
        if not self.enabled:
            return
        found = any(self._found_inf.values())
        self._found_inf = {}
        if new_scale is not None:
            self._scale = float(new_scale)
            self._growth_tracker = 0
        elif found:
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._scale *= self.growth_factor
                self._growth_tracker = 0

    def state_dict(self) -> dict:
        return {"scale": self._scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker} if self.enabled else {}

    def load_state_dict(self, sd: dict) -> None:
        if not sd:
            return
        self._scale = float(sd["scale"])
        self.growth_factor = float(sd["growth_factor"])
        self.backoff_factor = float(sd["backoff_factor"])
        self.growth_interval = int(sd["growth_interval"])
        self._growth_tracker = int(sd["_growth_tracker"])
