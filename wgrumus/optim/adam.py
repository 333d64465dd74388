"""Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay), with
torch.optim's formulas:

    AdamW: p = p * (1 - lr * wd)          Adam: g = g + wd * p
    m = m + (1 - b1) * (g - m);  v = b2 * v + (1 - b2) * g^2
    p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

The bias corrections are computed on the host in float64 and passed as kernel words.
"""
from __future__ import annotations

import math

from ..ops.creation import zeros
from .optimizer import Optimizer, launch


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        b1, b2 = betas
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"{type(self).__name__}: invalid hyperparameters lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=(float(b1), float(b2)), eps=eps,
                                      weight_decay=weight_decay))

    def _update(self, p, g, state, group):
        if "exp_avg" not in state:
            state["step"] = 0
            state["exp_avg"] = zeros(p.shape, device=p.device)
            state["exp_avg_sq"] = zeros(p.shape, device=p.device)
        state["step"] += 1
        t = state["step"]
        b1, b2 = group["betas"]
        lr = float(group["lr"])
        step_size = lr / (1.0 - b1 ** t)
        bc2_sqrt = math.sqrt(1.0 - b2 ** t)
        launch(p, g, [state["exp_avg"], state["exp_avg_sq"]], "adam",
               [lr, float(b1), float(b2), float(group["eps"]), float(group["weight_decay"]),
                int(self._decoupled), step_size, bc2_sqrt])


class AdamW(Adam):
    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)
