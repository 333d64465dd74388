"""Autograd: a per-thread tape of recorded ops and reverse-mode gradients on the device."""
from .engine import AutogradError, backward, backward_with_grad
from .store import GradientStore
from .tape import (Tape, current_tape, enable_grad, install_tape, is_grad_enabled, new_grad_id,
                   no_grad, record, take_tape)

__all__ = ["Tape", "GradientStore", "backward", "backward_with_grad", "install_tape", "take_tape",
           "no_grad", "enable_grad", "is_grad_enabled", "current_tape", "new_grad_id", "record",
           "AutogradError"]
