"""The tape: recorded ops of one thread, GradIds from one process-wide counter, no_grad.

A ``Node`` is held strongly by its output and weakly by the tape, so a forward dropped without
backward frees itself; the tape's order is the topological order backward walks in reverse.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref

_counter = itertools.count(1)
_counter_lock = threading.Lock()
_seq = itertools.count(1)
_local = threading.local()


def new_grad_id() -> int:
    """Unique across threads: a per-thread count would give two threads' tensors the same id."""
    with _counter_lock:
        return next(_counter)


class Node:
    __slots__ = ("seq", "name", "out_id", "out_shape", "inputs", "backward", "saved",
                 "__weakref__")

    def __init__(self, name, out_id, out_shape, inputs, backward, saved):
        with _counter_lock:
            self.seq = next(_seq)
        self.name = name
        self.out_id = out_id
        self.out_shape = out_shape
        self.inputs = inputs  # per input: (grad_id | None, parent Node | None, leaf weakref | None)
        self.backward = backward  # grad_out -> tuple of input grads (None where not needed)
        self.saved = saved  # [(tensor, storage version at record time)]

    def __repr__(self):
        return f"Node({self.name}, out={self.out_id}, seq={self.seq})"


class Tape:
    """Ops recorded by one thread since the tape was installed."""

    def __init__(self):
        self._entries: list = []  # weakrefs to Node, in record order
        self._prune_at = 4096

    def _record(self, node: Node) -> None:
        self._entries.append(weakref.ref(node))
        if len(self._entries) >= self._prune_at:
            # drop the ops of discarded forwards; amortised O(1), at most ~2x the live ops
            self._entries = [r for r in self._entries if r() is not None]
            self._prune_at = max(4096, 2 * len(self._entries))

    @property
    def nodes(self) -> list:
        return [n for n in (r() for r in self._entries) if n is not None and n.backward is not None]

    def _consume(self, consumed: set) -> None:
        self._entries = [r for r in self._entries
                         if (n := r()) is not None and n.seq not in consumed]

    def __len__(self):
        return len(self.nodes)

    def __repr__(self):
        return f"Tape({len(self)} ops)"


def current_tape() -> Tape:
    t = getattr(_local, "tape", None)
    if t is None:
        t = _local.tape = Tape()
    return t


def install_tape(tape: Tape) -> Tape | None:
    """Make ``tape`` this thread's tape; returns the one it replaces."""
    prev = getattr(_local, "tape", None)
    _local.tape = tape
    return prev


def take_tape() -> Tape:
    """Remove and return this thread's tape (a fresh one is used from now on)."""
    t = current_tape()
    _local.tape = Tape()
    return t


def is_grad_enabled() -> bool:
    return getattr(_local, "no_grad", 0) == 0


@contextlib.contextmanager
def no_grad():
    _local.no_grad = getattr(_local, "no_grad", 0) + 1
    try:
        yield
    finally:
        _local.no_grad -= 1


@contextlib.contextmanager
def enable_grad():
    prev = getattr(_local, "no_grad", 0)
    _local.no_grad = 0
    try:
        yield
    finally:
        _local.no_grad = prev


def needs_grad(*inputs) -> bool:
    return is_grad_enabled() and any(t is not None and getattr(t, "requires_grad", False)
                                     for t in inputs)


def record(name: str, out, inputs, backward, saved=()) -> None:
    """Attach op ``name`` to ``out``: ``backward(grad_out)`` returns one gradient per input."""
    if not needs_grad(*inputs):
        return
    ins = []
    for t in inputs:
        if t is None or not getattr(t, "requires_grad", False):
            ins.append((None, None, None))
        elif t._node is None:
            ins.append((t.grad_id, None, weakref.ref(t)))
        else:
            ins.append((t.grad_id, t._node, None))
    node = Node(name, None, out.shape, ins, backward,
                [(s, s.storage.version) for s in saved])
    out._grad_id = None
    out.requires_grad = True
    out._node = node
    node.out_id = out.grad_id
    current_tape()._record(node)
