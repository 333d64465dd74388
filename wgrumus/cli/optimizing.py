"""What `wgrumus train` does around every optimizer step in any layout: the scheduled learning
rate (--lr-schedule, --warmup) and clipping (--clip). The step count lives in the parameter
groups (``lr_step``), so checkpoints keep it and a resumed run sets the same rates."""
from __future__ import annotations

from ..optim import clip_grad_norm_, lr_scheduler

SCHEDULES = ("constant", "cosine")


class TrainOptimizer:
    """``opt`` stepping at the scheduled rate after clipping to ``clip`` over ``group`` (the
    ranks holding the model's other shards)."""

    def __init__(self, opt, schedule: str, warmup: int, total_steps: int, clip=None,
                 group=None, counted_elsewhere=()):
        self.opt = opt  # the schedule's closed form lr_at(t) gives step t's rates
        self.schedule = (lr_scheduler.CosineAnnealingLR(opt, T_max=max(total_steps, 1),
                                                        warmup_steps=warmup)
                         if schedule == "cosine" else
                         lr_scheduler.LinearWarmup(opt, warmup_steps=warmup))
        self.clip, self.group, self.counted_elsewhere = clip, group, list(counted_elsewhere)
        self.begin_step()

    @property
    def param_groups(self):
        return self.opt.param_groups

    @property
    def params(self) -> list:
        return [p for g in self.opt.param_groups for p in g["params"]]

    def begin_step(self) -> int:
        """Set this step's rates; returns the step count for ``end_step``."""
        t = int(self.opt.param_groups[0].get("lr_step", 0))
        for g, lr in zip(self.opt.param_groups, self.schedule.lr_at(t)):
            g["lr"] = lr
        return t

    @property
    def _step_supports_amp_scaling(self) -> bool:
        return getattr(self.opt, "_step_supports_amp_scaling", False)

    def clip_and_step(self, grads=None, found_inf=None) -> None:
        """The device work of a step (what ``wr.jit`` replays); ``found_inf``: GradScaler's."""
        if self.clip is not None:
            clip_grad_norm_(self.params, self.clip, grads=grads, group=self.group,
                            counted_elsewhere=self.counted_elsewhere)
        if found_inf is None:
            self.opt.step(grads)
        else:
            self.opt.step(grads, found_inf=found_inf)

    def end_step(self, t: int) -> None:
        for g in self.opt.param_groups:
            g["lr_step"] = t + 1

    def step(self, grads=None, found_inf=None) -> None:
        t = self.begin_step()
        self.clip_and_step(grads, found_inf)
        self.end_step(t)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.opt.load_state_dict(sd)
        self.begin_step()
