"""Activation checkpointing (PyTorch's ``torch.utils.checkpoint.checkpoint``).

The forward runs on a scratch tape (to learn which leaves ``fn`` reaches), whose graph is then
dropped, freeing the activations; one node from the inputs and those leaves to the output takes
its place. Its backward re-runs ``fn`` on detached inputs (the generator rewound, so dropout
draws the same masks) and backpropagates through that graph only.
"""
from __future__ import annotations

from ..autograd.engine import backward_with_grad
from ..autograd.tape import (
    Tape,
    enable_grad,
    install_tape,
    is_grad_enabled,
    record,
)
from ..ops.random import get_rng_state, set_rng_state
from ..ops.shape import detach
from ..runtime.errors import WgrumusError
from ..tensor import Tensor, activation_leaf


def checkpoint(fn, *args, preserve_rng_state: bool = True, use_reentrant=None, **kwargs):
    """``fn(*args, **kwargs)`` (one Tensor out, the same function when re-run; args not
    modified in place before backward) with activations recomputed in backward.
    ``use_reentrant``: accepted for PyTorch and ignored. ``preserve_rng_state`` rewinds the
    process-wide generator (thread ranks drawing from it at once: pass explicit seeds)."""
    if not is_grad_enabled():
        return fn(*args, **kwargs)
    rng = get_rng_state() if preserve_rng_state else None
    prev = install_tape(Tape())
    try:
        out = fn(*args, **kwargs)
    finally:
        install_tape(prev)
    if not isinstance(out, Tensor):
        raise WgrumusError(f"checkpoint: fn must return one Tensor, got {type(out).__name__}; "
                           f"checkpoint each output's computation separately")
    if out._node is None or any(out is a for a in args):  # nothing recorded to recompute
        return out
    leaves = _leaves(out._node, args)
    tensors = [a for a in args if isinstance(a, Tensor)]
    result = detach(out)  # the graph dies with ``out`` when this function returns

    def bw(g):
        with enable_grad():
            inner = install_tape(Tape())
            saved_rng = get_rng_state()
            try:
                if rng is not None:
                    set_rng_state(rng)
                # each input's data as a new leaf: the recomputed graph ends there
                fresh = {id(a): activation_leaf(detach(a)) for a in tensors if a.requires_grad}
                again = fn(*[fresh.get(id(a), a) for a in args], **kwargs)
                store = backward_with_grad(again, g)
            finally:
                set_rng_state(saved_rng)
                install_tape(inner)
        grads = [store.get(fresh[id(a)]) if a.requires_grad else None for a in tensors]
        return tuple(grads) + tuple(store.get(p) for p in leaves)

    record("checkpoint", result, tensors + leaves, bw, saved=tensors)
    return result


def _leaves(root, args) -> list:
    """Leaves requiring grad (parameters) the graph under ``root`` reads, stopping at ``args``
    (what produced them belongs to the outer graph)."""
    stop = {a._grad_id for a in args if isinstance(a, Tensor) and a._grad_id is not None}
    found, seen, stack = {}, set(), [root]
    while stack:
        n = stack.pop()
        if n.seq in seen:
            continue
        seen.add(n.seq)
        for gid, parent, leaf in n.inputs:
            if gid in stop:
                continue
            if parent is not None:
                stack.append(parent)
            elif gid is not None and leaf is not None:
                t = leaf()
                if t is not None:
                    found.setdefault(gid, t)
    return list(found.values())
