"""Training utilities that sit beside nn/optim: activation checkpointing."""
from .checkpoint import checkpoint

__all__ = ["checkpoint"]
