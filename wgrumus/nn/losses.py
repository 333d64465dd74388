"""The functional losses as modules, with PyTorch's names, arguments and defaults."""
from __future__ import annotations

from . import functional as F
from .module import Module


class CrossEntropyLoss(Module):
    """F.cross_entropy as a module (class targets or probabilities, optional class weights)."""

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__()
        self.weight = weight
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                               label_smoothing=self.label_smoothing, reduction=self.reduction)


class MSELoss(Module):
    """F.mse_loss: (input - target)^2, "mean" (default), "sum" or "none"."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)
