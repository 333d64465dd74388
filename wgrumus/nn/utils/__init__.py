"""torch.nn.utils' gradient clipping and parameter flattening, under PyTorch's import path."""
from __future__ import annotations

from ...optim.clip import clip_grad_norm_


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient to [-clip_value, clip_value] in place, on the device."""
    from ...autograd.tape import no_grad
    from ...ops.elementwise import clamp, copy_into
    from ...tensor import Tensor
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    v = float(clip_value)
    with no_grad():
        for p in params:
            if p.grad is not None:
                copy_into(p.grad, clamp(p.grad, -v, v))


def parameters_to_vector(parameters):
    """Every parameter flattened and concatenated (a copy)."""
    from ...ops.shape import cat, reshape
    return cat([reshape(p, (-1,)) for p in parameters], 0)


def vector_to_parameters(vec, parameters) -> None:
    """Copy consecutive slices of ``vec`` into the parameters, in place."""
    from ...autograd.tape import no_grad
    from ...ops.elementwise import copy_into
    k = 0
    with no_grad():
        for p in parameters:
            n = p.numel()
            copy_into(p, vec[k:k + n].reshape(p.shape))
            k += n
    if k != vec.numel():
        from ...runtime.errors import ShapeError
        raise ShapeError(f"vector_to_parameters: {vec.numel()} values for {k} parameter entries")


__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector",
           "vector_to_parameters"]
