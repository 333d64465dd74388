"""The other functional losses as modules, with PyTorch's names, arguments and defaults."""
from __future__ import annotations

from . import functional as F
from .module import Module


class _Loss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def extra_repr(self):
        return f"reduction={self.reduction!r}"


class NLLLoss(_Loss):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class BCELoss(_Loss):
    def __init__(self, weight=None, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight = weight

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__(reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.weight,
                                                  reduction=self.reduction,
                                                  pos_weight=self.pos_weight)


class L1Loss(_Loss):
    def forward(self, input, target):
        return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input, target):
        return F.huber_loss(input, target, self.reduction, self.delta)


class KLDivLoss(_Loss):
    def __init__(self, reduction: str = "mean", log_target: bool = False):
        super().__init__(reduction)
        self.log_target = log_target

    def forward(self, input, target):
        return F.kl_div(input, target, self.reduction, self.log_target)


__all__ = ["BCELoss", "BCEWithLogitsLoss", "HuberLoss", "KLDivLoss", "L1Loss", "NLLLoss",
           "SmoothL1Loss"]
