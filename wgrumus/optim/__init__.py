"""Optimizers with fused WGSL updates (one dispatch per parameter), gradient clipping on the
GPU, and learning-rate schedules."""
from . import lr_scheduler
from .adam import Adam, AdamW
from .clip import clip_grad_norm_
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm_", "lr_scheduler"]
