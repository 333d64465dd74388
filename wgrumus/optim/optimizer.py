"""Optimizer base: parameter groups, per-parameter state, gradient lookup, state_dict.
Subclasses implement ``_update(p, g, state, group)`` as one fused in-place dispatch."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import no_grad
from ..kernels.linear import dummy_buffer
from ..ops.elementwise import contiguous
from ..runtime.capture import capturing, guard, guard_grad
from ..runtime.errors import CaptureError, ShapeError, WgrumusError
from ..runtime.kernels import Kernel
from ..tensor import Tensor, float32, tensor
from .skip import FLAG_OPTIM, HOST_OPTIM, device_flags


def launch(p: Tensor, g: Tensor, states, entry: str, words, refresh=None, skip=None) -> None:
    """One fused update dispatch over ``p``. words: a callable giving the hyperparameter words;
    refresh: one that also steps the counts (a replay calls it per step); skip: the flag
    tensor (optim/skip.py), bound after the states. Bumps the storage versions."""
    dev = p.device
    bufs = [p.buffer, g.buffer]
    bufs += [s.buffer for s in states] or [dummy_buffer(dev)]
    if skip is not None:
        bufs.append(skip.buffer)
    head = [p.numel(), p.offset, g.offset, states[0].offset if states else 0]
    again = refresh or words
    kernel = Kernel.of("optim", entry, AMP=HOST_OPTIM if skip is None else FLAG_OPTIM)
    dev.dispatch_1d(kernel, bufs, head + words(), p.numel(), refresh=lambda: head + again())
    p.storage.version += 1
    for s in states:
        s.storage.version += 1


class Optimizer:
    defaults: dict = {}
    # step(grads, found_inf=flag) skips on the device (optim/skip.py); else GradScaler reads it
    _step_supports_amp_scaling = False

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups: list = []
        self.state: dict = {}  # Parameter -> dict of state (tensors on the parameter's device)
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict) -> None:
        group = dict(group)
        ps = group["params"]
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        seen = {id(p) for gr in self.param_groups for p in gr["params"]}
        for p in ps:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer params must be tensors, got {type(p).__name__}")
            if p.dtype != float32 or not p.is_contiguous():
                raise WgrumusError("optimizer params must be contiguous float32 tensors")
            if id(p) in seen:
                raise ValueError("a parameter appears in more than one parameter group")
            seen.add(id(p))
        group["params"] = ps
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        group.setdefault("initial_lr", group["lr"])
        self.param_groups.append(group)

    def _guard_capture(self) -> None:
        """Inside a wr.jit capture: its replays update the parameters the groups hold now, those
        that require grad now."""
        if capturing():
            guard(("optimizer", id(self)), f"the parameters of {type(self).__name__}'s groups "
                  "(add_param_group, requires_grad_)", lambda: tuple(
                      tuple((id(p), p.requires_grad) for p in g["params"])
                      for g in self.param_groups))

    @staticmethod
    def _grad(p, grads):
        g = p.grad if grads is None else grads.get(p)
        if grads is None and g is not None:
            guard_grad(p)
        if g is None:
            return None
        if tuple(g.shape) != tuple(p.shape):
            raise ShapeError(f"gradient of shape {tuple(g.shape)} for a parameter of shape "
                             f"{tuple(p.shape)}")
        if g.device is not p.device:
            raise WgrumusError(f"gradient on {g.device} for a parameter on {p.device}; "
                               f"reduce or move gradients to the parameter's device first")
        return contiguous(g) if g.dtype == float32 else contiguous(g.float())

    def step(self, grads=None, found_inf=None) -> None:
        """Update every parameter with a gradient (from ``grads``, a GradientStore, else
        ``p.grad``). ``found_inf``: device flag(s) skipping the step where set (optim/skip.py)."""
        flags = device_flags(found_inf)
        if flags is not None and not self._step_supports_amp_scaling:
            raise WgrumusError(f"{type(self).__name__}.step does not take found_inf; step it "
                               "through GradScaler.step, which reads the flag on the host")
        self._guard_capture()
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    g = self._grad(p, grads)
                    if g is None:
                        continue
                    if flags is None:
                        self._update(p, g, self.state.setdefault(p, {}), group)
                    else:
                        self._update(p, g, self.state.setdefault(p, {}), group, flags)

    def _update(self, p, g, state, group):  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_replay(self, p, state) -> None:
        """Refuse a replay once ``load_state_dict`` replaced the state tensors it captured."""
        if self.state.get(p) is not state:
            raise CaptureError(f"{type(self).__name__}'s state was replaced (load_state_dict) "
                               "after a wr.jit capture of its step, which would go on updating "
                               "the old state; call .free() on the jitted function after "
                               "loading so it captures again")

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def _index(self):
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def state_dict(self) -> dict:
        """PyTorch's layout: parameters referred to by their index over all groups."""
        idx = self._index()
        state = {idx[id(p)]: {k: int(v.item()) if k == "step" and isinstance(v, Tensor) else v
                              for k, v in s.items()}  # device step counts (optim/skip.py)
                 for p, s in self.state.items() if id(p) in idx}
        groups = []
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = [idx[id(p)] for p in g["params"]]
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        groups = sd["param_groups"]
        if len(groups) != len(self.param_groups):
            raise WgrumusError(f"optimizer state has {len(groups)} parameter groups, this "
                               f"optimizer has {len(self.param_groups)}")
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise WgrumusError(f"optimizer state group has {len(theirs['params'])} "
                                   f"parameters, this optimizer's has {len(mine['params'])}")
        params = [p for g in self.param_groups for p in g["params"]]
        new_state = {}
        for k, s in sd["state"].items():
            k = int(k)
            if not 0 <= k < len(params):
                raise WgrumusError(f"optimizer state for parameter {k}, but there are only "
                                   f"{len(params)}")
            p = params[k]
            st = {}
            for name, v in s.items():
                if name == "step" and isinstance(v, (Tensor, np.ndarray)) and (
                        np.asarray(v).size == 1):  # a count saved as a tensor
                    st[name] = int(np.asarray(v).reshape(-1)[0])
                elif isinstance(v, Tensor) or (isinstance(v, np.ndarray) and v.ndim > 0):
                    arr = v.numpy() if isinstance(v, Tensor) else v
                    if tuple(arr.shape) != tuple(p.shape):
                        raise ShapeError(f"optimizer state '{name}' of parameter {k} has shape "
                                         f"{tuple(arr.shape)}, the parameter {tuple(p.shape)}")
                    st[name] = tensor(np.asarray(arr, np.float32), device=p.device)
                else:
                    st[name] = v.item() if isinstance(v, np.generic) or (
                        isinstance(v, np.ndarray)) else v
            new_state[p] = st
        self.state = new_state
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
