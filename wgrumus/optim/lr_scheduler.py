"""Learning-rate schedules as closed-form functions of the step count, so a resumed run sets
exactly the rates of an uninterrupted one. Call ``scheduler.step()`` after ``optimizer.step()``."""
from __future__ import annotations

import math

from ..runtime.capture import refuse


class LRScheduler:
    def __init__(self, optimizer, last_epoch: int = -1):
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def factor(self, t: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def lr_at(self, t: int) -> list:
        return [self._lr(base, t) for base in self.base_lrs]

    def _lr(self, base: float, t: int) -> float:
        return base * self.factor(t)

    def _apply(self) -> None:
        """Write the rates for ``last_epoch`` into the optimizer's param groups."""
        for g, lr in zip(self.optimizer.param_groups, self.lr_at(self.last_epoch)):
            g["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def step(self) -> None:
        refuse(f"{type(self).__name__}.step()", "the new rate would be set once, at capture; "
               "call scheduler.step() after each call of the jitted step instead (replays "
               "read the rate from the optimizer's param groups)")
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, sd: dict) -> None:
        self.last_epoch = int(sd["last_epoch"])
        self.base_lrs = [float(v) for v in sd["base_lrs"]]
        self._apply()


def _warm(t: int, warmup_steps: int, start_factor: float) -> float:
    if warmup_steps <= 0 or t >= warmup_steps:
        return 1.0
    return start_factor + (1.0 - start_factor) * t / warmup_steps


class StepLR(LRScheduler):
    """lr = base * gamma ** (t // step_size)."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if step_size <= 0:
            raise ValueError(f"StepLR: step_size must be positive, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def factor(self, t):
        return self.gamma ** (t // self.step_size)


class LinearWarmup(LRScheduler):
    """PyTorch's LinearLR with end_factor 1 over ``warmup_steps``."""

    def __init__(self, optimizer, warmup_steps: int, start_factor: float = 0.0,
                 last_epoch: int = -1):
        self.warmup_steps, self.start_factor = warmup_steps, start_factor
        super().__init__(optimizer, last_epoch)

    def factor(self, t):
        return _warm(t, self.warmup_steps, self.start_factor)


class CosineAnnealingLR(LRScheduler):
    """PyTorch's cosine annealing, optionally after a linear warmup of ``warmup_steps`` (the
    cosine then runs over the remaining steps)."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, warmup_steps: int = 0,
                 warmup_start_factor: float = 0.0, last_epoch: int = -1):
        if T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be positive, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        self.warmup_steps, self.warmup_start_factor = warmup_steps, warmup_start_factor
        super().__init__(optimizer, last_epoch)

    def _lr(self, base, t):
        if self.warmup_steps and t < self.warmup_steps:
            return base * _warm(t, self.warmup_steps, self.warmup_start_factor)
        span = max(self.T_max - self.warmup_steps, 1)
        tc = min(t - self.warmup_steps, span)
        return self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * tc / span)) / 2
