"""Activation checkpointing (PyTorch's ``torch.utils.checkpoint.checkpoint``): run ``fn``
keeping none of its intermediate activations; backward recomputes them from the saved inputs.

The forward runs on a scratch tape: the ops record as usual (that is how we learn which leaves,
e.g. a block's parameters, ``fn`` reaches), then the whole recorded graph is dropped when ``fn``
returns, which frees its saved activations. One node is recorded in its place, from the inputs
and those leaves to the output. Its backward installs another scratch tape, re-runs ``fn`` with
grad enabled on detached copies of the inputs (the random generator rewound, so dropout draws
the same masks), backpropagates the output gradient through that graph only, and hands the
input and leaf gradients to the outer backward. Peak memory is then one checkpointed piece's
activations plus the pieces' inputs, instead of every piece's activations.
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
    """``fn(*args, **kwargs)`` whose activations are recomputed in backward instead of kept.

    ``fn`` must return one Tensor and compute the same function when re-run (it may read
    parameters, which get their gradients as usual). Tensor ``args`` must not be modified in
    place between the forward and the backward. ``use_reentrant`` is accepted for PyTorch
    compatibility and ignored. Without grad (``no_grad``) this is just ``fn(*args)``.

    ``preserve_rng_state`` rewinds the process-wide generator for the recomputation: with
    dropout inside ``fn`` while other threads also draw from it (thread ranks), pass explicit
    seeds instead."""
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
    """Leaf tensors requiring grad (parameters) that the recorded graph under ``root`` reads,
    other than the explicit ``args``, in first-seen order. The walk stops at the args: what
    produced them belongs to the outer graph."""
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
