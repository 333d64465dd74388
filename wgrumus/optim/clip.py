"""clip_grad_norm_: the total gradient norm and the rescale both stay on the GPU (no readback),
so clipping does not stall the command batch."""
from __future__ import annotations

from ..autograd.tape import no_grad
from ..ops.elementwise import abs_, map_op
from ..ops.reduce import max as _max
from ..ops.reduce import sum as _sum
from ..ops.shape import reshape, stack
from ..runtime.errors import WgrumusError
from ..tensor import Tensor


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, grads=None,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Rescale the gradients (``p.grad``, or those in the GradientStore ``grads``) so
    their total ``norm_type``-norm is at most ``max_norm``; returns the norm before clipping
    (a one-element device tensor: call .item() only when you need the number)."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    pairs = [(p, p.grad if grads is None else grads.get(p)) for p in params]
    pairs = [(p, g) for p, g in pairs if g is not None]
    gs = [g for _, g in pairs]
    if not gs:
        raise WgrumusError("clip_grad_norm_: none of the parameters has a gradient")
    dev = gs[0].device
    if any(g.device is not dev for g in gs):
        raise WgrumusError("clip_grad_norm_: gradients live on different devices; clip each "
                           "device's parameters separately")
    norm_type = float(norm_type)
    with no_grad():
        if norm_type == float("inf"):
            parts = [reshape(_max(abs_(g)), (1,)) for g in gs]
            total = _max(stack(parts, 0)) if len(parts) > 1 else reshape(parts[0], ())
        else:
            expr = "a * a" if norm_type == 2.0 else "pow_(abs(a), pf(48u))"
            parts = [reshape(_sum(map_op(expr, [g], scalars=[norm_type])), (1,)) for g in gs]
            s = _sum(stack(parts, 0)) if len(parts) > 1 else reshape(parts[0], ())
            total = map_op("pow_(a, 1.0 / pf(48u))", [s], scalars=[norm_type])
        if error_if_nonfinite and not bool(abs(total.item()) < float("inf")):
            raise WgrumusError(f"clip_grad_norm_: the total gradient norm is {total.item()} "
                               f"(a gradient holds NaN or inf); check the inputs and loss for "
                               f"NaN, lower the learning rate, or pass error_if_nonfinite=False")
        coef = map_op("min(pf(48u) / (a + 1e-6), 1.0)", [total], scalars=[float(max_norm)])
        # New tensors rather than in-place writes: autograd may hand the same gradient tensor
        # (or views of one) to several leaves, which an in-place scale would scale twice.
        for p, g in pairs:
            scaled = map_op("a * b", [g, coef])
            if grads is None:
                p.grad = scaled
            else:
                grads.remove(p)
                grads.accumulate(p, scaled)
    return total
