"""backward: walk the recorded graph from an output in reverse record order."""
from __future__ import annotations

from ..runtime.errors import ShapeError, WgrumusError
from .store import GradientStore
from .tape import current_tape, no_grad


class AutogradError(WgrumusError):
    pass


def backward(loss) -> GradientStore:
    if loss.numel != 1:
        raise ShapeError(f"backward(loss) needs a loss with one element, got shape {loss.shape}; "
                         f"reduce it (e.g. .mean()) or use backward_with_grad(out, grad)")
    from ..ops.creation import full
    return backward_with_grad(loss, full(loss.shape, 1.0, device=loss.device))


def backward_with_grad(out, grad) -> GradientStore:
    """Gradients of all leaves that require grad, seeded with d(out) = ``grad``."""
    if not getattr(out, "requires_grad", False):
        raise AutogradError("backward: the output does not require grad (no input of the ops "
                            "that produced it requires grad, or it was computed under no_grad)")
    if tuple(grad.shape) != tuple(out.shape):
        raise ShapeError(f"backward_with_grad: grad shape {tuple(grad.shape)} != output shape "
                         f"{tuple(out.shape)}")
    if grad.device is not out.device:
        grad = grad.to(out.device)
    store = GradientStore()
    if out._node is None:  # a leaf: its gradient is the seed
        store.accumulate(out, grad)
        return store
    # Every node reachable from the output; record order is a topological order.
    nodes, stack, seen = [], [out._node], set()
    while stack:
        n = stack.pop()
        if n.seq in seen:
            continue
        if n.backward is None:
            raise AutogradError(f"backward through op '{n.name}' a second time: its graph was "
                                f"consumed by an earlier backward (recompute the forward)")
        seen.add(n.seq)
        nodes.append(n)
        stack.extend(p for _, p, _ in n.inputs if p is not None)
    nodes.sort(key=lambda n: n.seq, reverse=True)
    grads = {out.grad_id: grad}
    with no_grad():
        for n in nodes:
            g = grads.pop(n.out_id, None)
            if g is None:  # this branch does not reach the output
                n.backward = None
                continue
            for t, v in n.saved:
                if t._storage.version != v:
                    raise AutogradError(
                        f"a tensor saved by '{n.name}' for backward was modified in place after "
                        f"it was used (version {v} -> {t._storage.version}); clone it before "
                        f"modifying, or modify it before the forward")
            in_grads = n.backward(g)
            n.backward, n.saved = None, ()
            for (gid, parent, leaf), ig in zip(n.inputs, in_grads):
                if gid is None or ig is None:
                    continue
                if parent is None:
                    lt = leaf()
                    if lt is not None:
                        store.accumulate(gid, ig, lt)
                    else:
                        store.accumulate(gid, ig)
                elif gid in grads:
                    grads[gid] = grads[gid] + ig
                else:
                    grads[gid] = ig
    current_tape()._consume(seen)
    return store
