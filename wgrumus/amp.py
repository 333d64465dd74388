"""Mixed precision as in PyTorch: ``autocast`` runs matmul, linear, conv and attention in
float16 (f32 in and out, f32 accumulation, so parameters, optimizer state and gradients stay f32
master copies); ``GradScaler`` scales the loss so small gradients survive f16.
"""
from __future__ import annotations

import functools

import numpy as np

from .autograd import no_grad
from .autograd.store import grads_of, set_grad
from .ops.elementwise import contiguous, fill_
from .ops.precision import autocast_as
from .runtime import get_device
from .runtime.errors import AdapterLimitError, WgrumusError
from .runtime.kernels import Kernel, multi_tensor_kernel
from .tensor import Tensor, float16, float32, int32

__all__ = ["GradScaler", "autocast"]

_UNSCALE_BRANCH = "        U{j}[u_({j}u) + e] = unscale_(G{j}[g_({j}u) + e], inv_scale);"
_STATE_WORDS = 4  # shaders/amp.wgsl: scale (f32 bits), found inf/NaN, growth tracker, skips


def unscale_check(grads: list, scale) -> tuple:
    """(grads / scale as new tensors, int32 device flag: nonzero on inf/NaN) in multi-tensor
    dispatches. ``scale``: a GradScaler's state tensor (its found word set too) or a float."""
    dev = grads[0].device
    state = scale if isinstance(scale, Tensor) else _new_state(dev, 1.0 / float(scale))
    lim = int(dev.limits.get("max-storage-buffers-per-shader-stage", 8))
    k = max(1, min(20, (lim - 2) // 2))  # 20: the parameter words of one dispatch
    flag = fill_(Tensor.empty((1,), dev, int32), 0)
    out = []
    for c in range(0, len(grads), k):
        chunk = [contiguous(g) for g in grads[c:c + k]]
        us = [Tensor.empty(g.shape, dev, float32) for g in chunk]
        words, end = [state.offset, flag.offset, 0, 0], 0
        bufs = [flag.buffer, state.buffer]
        for g, u in zip(chunk, us):
            end += g.numel()
            words += [end, g.offset, u.offset]
            bufs += [g.buffer, u.buffer]
        if end:
            dev.dispatch_1d(multi_tensor_kernel("unscale", len(chunk), 3, "G:read U:read_write",
                                                _UNSCALE_BRANCH), bufs, words, end)
        out += us
    return out, flag


def _new_state(dev, scale: float, tracker: int = 0) -> Tensor:
    """A scaler's device state (shaders/amp.wgsl) with this scale and growth tracker."""
    st = Tensor.empty((_STATE_WORDS,), dev, int32)
    _write_state(st, scale, tracker)
    return st


def _write_state(st: Tensor, scale: float, tracker: int) -> None:
    words = np.array([np.float32(scale).view(np.int32), 0, tracker, 0], np.int32)
    st.device.write(st.buffer, words, st.offset * 4)
    st.storage.version += 1


class autocast:
    """``with wr.autocast(dtype=wr.float16):`` (this thread; also a decorator)."""

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
    """Dynamic loss scaling with PyTorch's defaults and methods (gradients: ``p.grad`` or a
    GradientStore ``grads``). The scale, growth tracker and inf/NaN flags live on the device
    and every decision is made there (unscale kernel, optim/skip.py, shaders/amp.wgsl), so
    ``wr.jit`` captures a step whole; ``get_scale``, ``skipped_steps`` and ``state_dict`` read
    the device (call them outside a jitted step)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        if growth_factor <= 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError("GradScaler: growth_factor must be > 1, backoff_factor in (0, 1), "
                             "growth_interval >= 1")
        self._init_scale, self._init_tracker = float(init_scale), 0
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.enabled = bool(enabled)
        self._state: Tensor | None = None  # created on the first device used
        self._found_inf: dict = {}  # id(optimizer) -> {device: flag}, since the last update()

    def is_enabled(self) -> bool:
        return self.enabled

    def _lazy_state(self, dev) -> Tensor:
        if self._state is None:
            self._state = _new_state(dev, self._init_scale, self._init_tracker)
        return self._state

    def _word(self, i: int) -> int:
        return int(self._state[i:i + 1].item())

    def get_scale(self) -> float:
        """The current scale (read from the device)."""
        if not self.enabled:
            return 1.0
        if self._state is None:
            return self._init_scale
        return float(np.int32(self._word(0)).view(np.float32))

    @property
    def skipped_steps(self) -> int:
        """Updates that found an inf/NaN gradient (read from the device)."""
        return 0 if self._state is None else self._word(3)

    def scale(self, outputs):
        """``outputs`` (a tensor, or a list / tuple of them) times the current scale."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if not isinstance(outputs, Tensor):
            raise TypeError(f"GradScaler.scale needs a tensor, got {type(outputs).__name__}")
        st = self._lazy_state(outputs.device)
        scale = Tensor(st.storage, (), (), st.offset, float32)
        if scale.device is not outputs.device:
            scale = scale.to(outputs.device)
        return outputs * scale

    def unscale_(self, optimizer, grads=None) -> None:
        """Divide this optimizer's gradients by the scale (new tensors) and flag inf/NaN on the
        device; once per optimizer between updates."""
        if not self.enabled:
            return
        if id(optimizer) in self._found_inf:
            raise WgrumusError("GradScaler.unscale_ was already called for this optimizer since "
                               "the last update(); call it once per step, before step()")
        pairs = grads_of([p for g in optimizer.param_groups for p in g["params"]], grads)
        flags = {}
        with no_grad():
            for dev in {id(g.device): g.device for _, g in pairs}.values():
                mine = [(p, g) for p, g in pairs if g.device is dev]
                state = self._lazy_state(dev)
                if state.device is not dev:  # grads on several devices: a copy of the scale
                    state = state.to(dev)
                us, flags[dev] = unscale_check([g for _, g in mine], state)
                for (p, _), u in zip(mine, us):
                    set_grad(p, u, grads)
            if len(flags) > 1 or any(d is not self._state.device for d in flags):
                self._agree(flags)
        self._found_inf[id(optimizer)] = flags

    def _agree(self, flags: dict) -> None:
        """Grads on several devices, or not on the scaler's: OR the flags through the host."""
        found = int(any(f.item() for f in flags.values()))
        for f in flags.values():
            fill_(f, found)
        if found:
            fill_(self._state[1:2], 1)

    def step(self, optimizer, grads=None):
        """``optimizer.step(grads)`` unless a gradient is inf/NaN: on the device for optimizers
        taking ``found_inf`` (this package's), after a host read for others."""
        if not self.enabled:
            return optimizer.step(grads)
        if id(optimizer) not in self._found_inf:
            self.unscale_(optimizer, grads)
        flags = self._found_inf[id(optimizer)]
        if not flags:
            return optimizer.step(grads)
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return optimizer.step(grads, found_inf=flags)
        if any(f.item() for f in flags.values()):
            return None
        return optimizer.step(grads)

    def update(self, new_scale: float | None = None) -> None:
        """Adjust the scale for the next step on the device (or set ``new_scale``)."""
        if not self.enabled:
            return
        self._found_inf = {}
        if self._state is None:  # nothing scaled or stepped yet
            if new_scale is not None:
                self._init_scale, self._init_tracker = float(new_scale), 0
            return

        def words():
            return [self.growth_factor, self.backoff_factor, self.growth_interval,
                    int(new_scale is not None), 0.0 if new_scale is None else float(new_scale)]
        with no_grad():
            self._state.device.dispatch(Kernel.of("amp", "update"), [self._state.buffer],
                                        words(), refresh=words)
        self._state.storage.version += 1

    def state_dict(self) -> dict:
        if not self.enabled:
            return {}
        tracker = self._init_tracker if self._state is None else self._word(2)
        return {"scale": self.get_scale(), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": tracker}

    def load_state_dict(self, sd: dict) -> None:
        if not sd:
            return
        self.growth_factor = float(sd["growth_factor"])
        self.backoff_factor = float(sd["backoff_factor"])
        self.growth_interval = int(sd["growth_interval"])
        self._init_scale, self._init_tracker = float(sd["scale"]), int(sd["_growth_tracker"])
        if self._state is not None:  # in place: wr.jit captures of update() read this buffer
            _write_state(self._state, self._init_scale, self._init_tracker)
