"""clip_grad_norm_ with the norm and the rescale on the devices (no readback stalls the batch).
Sharded layouts clip with the whole model's norm: each rank's partial is all-reduced once over
``group``; a gradient several ranks hold identically is left out of all partials but one
(``counted_elsewhere``)."""
from __future__ import annotations

from ..autograd.store import grads_of, set_grad
from ..autograd.tape import no_grad
from ..ops.elementwise import abs_, map_op
from ..ops.reduce import max as _max
from ..ops.reduce import sum as _sum
from ..ops.shape import reshape, stack
from ..runtime.errors import WgrumusError
from ..tensor import Tensor


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, grads=None,
                    error_if_nonfinite: bool = False, group=None,
                    counted_elsewhere=()) -> Tensor:
    """Rescale the gradients (``p.grad`` or the GradientStore ``grads``) to a total norm of
    at most ``max_norm``; returns the norm before clipping as a device tensor. ``group``: the
    ranks whose shards make up the model (all call this at the same point)."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    pairs = grads_of(params, grads)
    if not pairs and group is None:
        raise WgrumusError("clip_grad_norm_: none of the parameters has a gradient")
    skip = {id(p) for p in counted_elsewhere}
    counted = [g for p, g in pairs if id(p) not in skip]
    norm_type = float(norm_type)
    inf = norm_type == float("inf")
    dev = pairs[0][1].device if pairs else group.device
    with no_grad():
        part = _partial(counted, norm_type, dev)
        if group is not None and group.world_size > 1:
            part = group.all_reduce(part, "max" if inf else "sum")
            if part.device is not dev:
                part = part.to(dev)
        total = part if inf else map_op("pow_(a, 1.0 / p)", [part], scalars={"p": norm_type})
        if error_if_nonfinite and not bool(abs(total.item()) < float("inf")):
            raise WgrumusError(f"clip_grad_norm_: the total gradient norm is {total.item()} "
                               f"(a gradient holds NaN or inf); check the inputs and loss for "
                               f"NaN, lower the learning rate, or pass error_if_nonfinite=False")
        coef = map_op("min(max_norm / (a + 1e-6), 1.0)", [total],
                      scalars={"max_norm": float(max_norm)})
        coefs = {dev: coef}
        # new tensors: autograd may hand one gradient to several leaves (scaled twice in place)
        for p, g in pairs:
            c = coefs.get(g.device)
            if c is None:
                c = coefs[g.device] = coef.to(g.device)
            set_grad(p, map_op("a * b", [g, c]), grads)
    return total


def _partial(gs, norm_type: float, dev) -> Tensor:
    """Sum of |g|^p (max |g| for p = inf) over ``gs``, per device then combined on ``dev``."""
    from ..ops.creation import zeros
    if norm_type == float("inf"):
        parts = [reshape(_max(abs_(g)), (1,)) for g in gs]
    else:
        expr = "a * a" if norm_type == 2.0 else "pow_(abs(a), p)"
        parts = [reshape(_sum(map_op(expr, [g], scalars={"p": norm_type})), (1,)) for g in gs]
    red = _max if norm_type == float("inf") else _sum
    by_dev: dict = {}
    for t in parts:
        by_dev.setdefault(t.device, []).append(t)
    per = [red(stack(ts, 0)) if len(ts) > 1 else reshape(ts[0], ()) for ts in by_dev.values()]
    per = [reshape(t if t.device is dev else t.to(dev), (1,)) for t in per]
    if not per:  # this rank counts nothing (all of its gradients are counted elsewhere)
        return zeros((), device=dev)
    return red(stack(per, 0)) if len(per) > 1 else reshape(per[0], ())
