"""The one schedule interpreter: walks a stage's action list (compute and SEND/RECV) for the
PipelineExecutor and the 3D ranks alike, through a caller's ``work`` object (``forward(action, k,
x)``, ``send``, ``recv``, optional ``activation_bytes``). Each forward records on a fresh tape with
the received activation as a leaf, so its backward yields exactly the gradient to send upstream.
``BI`` runs the whole backward (the engine computes input and weight gradients in one call) and
``BW`` adds the held weight gradients: ZB-H1's order with 1F1B's work per slot."""
from __future__ import annotations

import time
from dataclasses import dataclass

from ...autograd import (
    GradientStore,
    Tape,
    backward,
    backward_with_grad,
    install_tape,
    no_grad,
    take_tape,
)
from ...tensor import activation_leaf
from .actions import BACKWARD, BACKWARD_WEIGHT, FORWARD, RECV_B, RECV_F, SEND_B, SEND_F, Action


class ScheduleExecutionError(RuntimeError):
    """A hand-made action list that does not fit together (``validate`` rejects these)."""


@dataclass
class _MicroBatch:
    """What one chunk keeps of one micro-batch between its forward and its backward."""
    x: object       # the received activation (leaf requiring grad) or None on virtual stage 0
    out: object     # the chunk's output, or the scaled loss on the last virtual stage
    tape: Tape
    nbytes: int
    weight_grads: GradientStore | None = None  # held between BI and BW


class StageRunner:
    """Runs one pipeline stage's actions; ``stores[k]`` collects virtual stage k's gradients."""

    def __init__(self, work, num_stages: int, num_virtual_stages: int, stage: int):
        self.work, self.p, self.last, self.stage = work, num_stages, num_virtual_stages - 1, stage
        self.held: dict = {}     # (mb, chunk) -> _MicroBatch
        self.inbox: dict = {}    # (mb, chunk, kind) -> received tensor
        self.outbox: dict = {}   # (mb, chunk, kind) -> tensor to send
        self.stores: dict = {}
        self.live_bytes = 0
        self.action = None  # the action running now (for error reports)

    def run(self, actions, on_action=None, should_stop=None) -> None:
        """Every action in order; ``on_action(a, start, end)`` after each one."""
        steps = {FORWARD: self._forward, BACKWARD_WEIGHT: self._weight_grad,
                 RECV_F: self._recv, RECV_B: self._recv, SEND_F: self._send, SEND_B: self._send}
        for a in actions:
            if should_stop is not None and should_stop():
                return
            t0, self.action = time.perf_counter(), a
            steps.get(a.kind, self._backward)(a, self.stage + a.chunk * self.p)
            if on_action is not None:
                on_action(a, t0, time.perf_counter())

    def _recv(self, a: Action, k: int) -> None:
        self.inbox[(a.mb, a.chunk, a.kind)] = self.work.recv(a, k)

    def _send(self, a: Action, k: int) -> None:
        value = self.outbox.pop((a.mb, a.chunk, a.kind), None)
        if value is None:
            raise ScheduleExecutionError(f"{a!r} on virtual stage {k}: nothing to send (its "
                                         f"compute action has not run)")
        self.work.send(a, k, value)

    def _forward(self, a: Action, k: int) -> None:
        x = None
        if k > 0:
            x = self._take(a, RECV_F, k).detach()
            if x.dtype.kind == "f" and x.dtype.itemsize == 4:
                activation_leaf(x)
        install_tape(Tape())
        try:
            out = self.work.forward(a, k, x)
        finally:
            tape = take_tape()
        size = getattr(self.work, "activation_bytes", None)
        nbytes = size(tape, x, out, k) if size is not None else 0
        self.held[(a.mb, a.chunk)] = _MicroBatch(x, out, tape, nbytes)
        self.live_bytes += nbytes
        if k < self.last:
            with no_grad():
                self.outbox[(a.mb, a.chunk, SEND_F)] = out.detach()

    def _backward(self, a: Action, k: int) -> None:
        mb = self.held.get((a.mb, a.chunk))
        if mb is None or mb.out is None:
            raise ScheduleExecutionError(f"{a!r} on virtual stage {k} has no matching forward")
        grad = None if k == self.last else self._take(a, RECV_B, k)
        if getattr(mb.out, "requires_grad", False):
            install_tape(mb.tape)
            try:
                store = backward(mb.out) if grad is None else backward_with_grad(mb.out, grad)
            finally:
                take_tape()
        else:  # nothing on this chunk (nor before it) requires grad
            store = GradientStore()
        if k > 0:
            with no_grad():
                gx = store.remove(mb.x) if mb.x.requires_grad else None
                if gx is None:
                    from ...ops import zeros
                    gx = zeros(mb.x.shape, device=mb.x.device)
            self.outbox[(a.mb, a.chunk, SEND_B)] = gx
        self.live_bytes -= mb.nbytes  # the backward consumed the graph: its saved tensors go
        mb.x = mb.out = mb.tape = None
        if a.kind == BACKWARD:
            self._store(k).merge_from(store)
            del self.held[(a.mb, a.chunk)]
        else:
            mb.weight_grads = store

    def _weight_grad(self, a: Action, k: int) -> None:
        mb = self.held.pop((a.mb, a.chunk), None)
        if mb is None or mb.weight_grads is None:
            raise ScheduleExecutionError(f"{a!r} on virtual stage {k} before its BI")
        self._store(k).merge_from(mb.weight_grads)

    def _take(self, a: Action, kind: str, k: int):
        try:
            return self.inbox.pop((a.mb, a.chunk, kind))
        except KeyError:
            raise ScheduleExecutionError(
                f"{a!r} on virtual stage {k} runs before its {kind}{a.mb}; build the action list "
                f"with add_send_recv") from None

    def _store(self, k: int) -> GradientStore:
        return self.stores.setdefault(k, GradientStore())

    def clear(self) -> None:
        """Drop everything held (after a failure: free the tensors at once)."""
        self.held.clear()
        self.inbox.clear()
        self.outbox.clear()
        install_tape(Tape())
