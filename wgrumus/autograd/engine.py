"""backward: walk the recorded graph from an output in reverse record order. The engine knows
no op: gradients are added, moved, cloned and seeded through Tensor's methods (ops implement
them)."""
from __future__ import annotations

from ..runtime import capture
from ..runtime.errors import ShapeError, WgrumusError
from ..tensor import Tensor, float32
from .store import GradientStore
from .tape import current_tape, no_grad


class AutogradError(WgrumusError):
    pass


def backward(loss, on_leaf_grad=None) -> GradientStore:
    if loss.numel() != 1:
        raise ShapeError(f"backward(loss) needs a loss with one element, got shape {loss.shape}; "
                         f"reduce it (e.g. .mean()) or use backward_with_grad(out, grad)")
    seed = Tensor.empty(loss.shape, loss.device, float32).fill_(1.0)
    return backward_with_grad(loss, seed, on_leaf_grad=on_leaf_grad)


def backward_with_grad(out, grad, on_leaf_grad=None) -> GradientStore:
    """Gradients of all leaves that require grad, seeded with d(out) = ``grad``.
    ``on_leaf_grad(grad_id, grad)``: called once per leaf as soon as its gradient is final
    (data parallelism starts all-reducing there, overlapping the rest of backward)."""
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
        if on_leaf_grad is not None:
            on_leaf_grad(out.grad_id, store.get(out))
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
    pending = _leaf_uses(nodes) if on_leaf_grad is not None else None
    grads = {out.grad_id: grad}
    with no_grad():
        for n in nodes:
            g = grads.pop(n.out_id, None)
            if g is None:  # this branch does not reach the output
                n.backward = None
                if pending is not None:
                    _leaves_done(n, pending, store, on_leaf_grad)
                continue
            for t, v in n.saved:
                if t.storage.version != v:
                    raise AutogradError(
                        f"a tensor saved by '{n.name}' for backward was modified in place after "
                        f"it was used (version {v} -> {t.storage.version}); clone it before "
                        f"modifying, or modify it before the forward")
            in_grads = n.backward(g)
            n.backward, n.saved = None, ()
            for (gid, parent, leaf), ig in zip(n.inputs, in_grads):
                if gid is None or ig is None:
                    continue
                if parent is None:
                    store.accumulate(gid, ig, leaf())
                elif gid in grads:
                    grads[gid] = grads[gid] + ig
                else:
                    grads[gid] = ig
            if pending is not None:
                _leaves_done(n, pending, store, on_leaf_grad)
    # Cut every consumed node loose from its parents: the graph then dies by reference counting
    # now, instead of surviving (held by the output) into the oldest GC generation, whose full
    # collections cost ~10% of a GPT step's host time. The output's own node stays, consumed.
    for n in nodes:
        n.inputs = ()
    current_tape()._consume(seen)
    return store


def _leaf_uses(nodes) -> dict:
    """grad_id -> how many (node, input) slots of the graph feed that leaf."""
    uses: dict = {}
    for n in nodes:
        for gid, parent, _ in n.inputs:
            if gid is not None and parent is None:
                uses[gid] = uses.get(gid, 0) + 1
    return uses


def _leaves_done(n, pending: dict, store: GradientStore, on_leaf_grad) -> None:
    """Node ``n`` has run: count down its leaf inputs and report the ones now final."""
    for gid, parent, _ in n.inputs:
        if gid is None or parent is not None:
            continue
        pending[gid] -= 1
        if pending[gid] == 0:
            g = store.get(gid)
            if g is not None:
                on_leaf_grad(gid, g)


def tensor_backward(self, grad=None) -> GradientStore:
    """``Tensor.backward``: accumulate d(self) into ``.grad`` of every leaf that requires grad."""
    store = backward(self) if grad is None else backward_with_grad(self, grad)
    seen = set()
    with no_grad():
        for gid, g in store.items():
            leaf = store.leaf(gid)
            if leaf is not None:
                if id(g) in seen:  # one tensor may be the gradient of two leaves (x + y)
                    g = g.clone()
                seen.add(id(g))
                capture.guard(("requires_grad", id(leaf)), "requires_grad of a tensor the "
                              "captured backward reached", lambda t=leaf: t.requires_grad)
                if capture.grad_from_outside(leaf, g.device):
                    leaf.grad = capture.host_op(g.device, _grad_plus(leaf), g)
                else:
                    leaf.grad = g if leaf.grad is None else leaf.grad + g
    return store


def _grad_plus(leaf):
    """``leaf.grad + g`` (``g`` where there is none) as a wr.jit host operation: a replay adds
    to the gradient the leaf holds at that moment, not the one it held at the capture."""
    def add(g):
        with no_grad():
            cur = leaf.grad
            return g.clone() if cur is None else cur + g
    return add
