"""Ops defined by other ops: each calls ops (wgrumus/ops/) and records no autograd node and
launches no kernel of its own (an elementwise expression without a gradient goes through ops'
map_op), so its gradient comes from the parts. PyTorch's tensor-level functions live here;
its functional forms (activations, losses, padding, convolutions) in wgrumus/nn/functional/.
Loading this package binds Tensor's methods (methods.py)."""
from __future__ import annotations

from . import constructors, contraction, logical, more_shapes, reductions, sorting
from . import methods  # noqa: F401  (binds Tensor's methods)
from .repeat import flip, fliplr, flipud, repeat, repeat_interleave, roll, tensor_unfold, tile
from .spellings import cpu, div, frac

__all__ = [  # the functional forms
    "cpu", "div", "frac", "flip", "fliplr", "flipud", "repeat", "repeat_interleave", "roll",
    "tensor_unfold", "tile",
    *constructors.__all__, *contraction.__all__, *logical.__all__, *more_shapes.__all__,
    *reductions.__all__, *sorting.__all__]
# the functional forms of the modules above, by the names in their __all__
for _m in (constructors, contraction, logical, more_shapes, reductions, sorting):
    globals().update({_n: getattr(_m, _n) for _n in _m.__all__})
