"""SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD's formulas):

    g = grad + weight_decay * p
    buf = g (first step) or momentum * buf + (1 - dampening) * g
    g = g + momentum * buf (nesterov) or buf
    p = p - lr * g
"""
from __future__ import annotations

from ..ops.creation import zeros
from ..runtime.capture import refuse
from ..runtime.errors import CaptureError
from .optimizer import Optimizer, launch
from .skip import flag_for


class SGD(Optimizer):
    _step_supports_amp_scaling = True

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: lr, momentum and weight_decay must be >= 0 "
                             f"(got {lr}, {momentum}, {weight_decay})")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    def _update(self, p, g, state, group, flags=None):
        mom = group["momentum"]
        states, first = [], 0
        if mom != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                refuse("SGD.step creating its momentum buffer", "a replay would restart the "
                       "momentum at every step; wr.jit's eager warm-up call creates it (keep "
                       "warmup >= 1)")
                buf = state["momentum_buffer"] = zeros(p.shape, device=p.device)
                first = 1
            states = [buf]
        flag = None if flags is None else flag_for(flags, p.device)

        def words():
            return [float(group["lr"]), float(group["momentum"]), float(group["dampening"]),
                    float(group["weight_decay"]), int(bool(group["nesterov"])), first] + (
                        [] if flag is None else [flag.offset])

        def refresh():
            self._check_replay(p, state)
            if (group["momentum"] != 0) != (mom != 0):
                raise CaptureError(f"SGD's momentum changed from {mom} to {group['momentum']} "
                                   "after a wr.jit capture of its step, which has no momentum "
                                   "buffer to replay (or one it would go on updating); call "
                                   ".free() on the jitted function so that it captures again")
            return words()
        launch(p, g, states, "sgd", words, refresh, flag)
