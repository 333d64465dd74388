"""The one schedule interpreter: walks a stage's action list (compute and SEND/RECV) for the
PipelineExecutor and the 3D ranks alike, through a caller's ``work`` object (``forward(action, k,
x)``, ``send``, ``recv``, optional ``activation_bytes``). Each forward records on a fresh tape with
the received activation as a leaf, so its backward yields exactly the gradient to send upstream.
``BI`` runs the whole backward (the engine computes input and weight gradients in one call) and
``BW`` adds the held weight gradients: ZB-H1's order with 1F1B's work per slot.

Communication is asynchronous where the work offers it (as PyTorch's pipelining issues its P2P
ops): ``work.isend(a, k, value)`` returns a handle the runner waits for only at the end of the
step, so a send never waits for its receiver (MPI's rendezvous sends would otherwise deadlock
1F1B: each stage's second send waits for a receive its peer posts only after its own send), and
``work.irecv(a, k)`` is posted one compute action ahead and waited where the data is needed."""
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
        self.sending: list = []  # (action, handle) of sends in flight, in issue order
        self._isend = getattr(work, "isend", None)
        self._irecv = getattr(work, "irecv", None)

    def run(self, actions, on_action=None, should_stop=None) -> None:
        """Every action in order; ``on_action(a, start, end)`` after each one. Returns once every
        send has completed."""
        steps = {FORWARD: self._forward, BACKWARD_WEIGHT: self._weight_grad,
                 RECV_F: self._recv, RECV_B: self._recv, SEND_F: self._send, SEND_B: self._send}
        actions = list(actions)
        ahead = _receives_ahead(actions) if self._irecv is not None else None
        for i, a in enumerate(actions):
            if should_stop is not None and should_stop():
                return
            t0, self.action = time.perf_counter(), a
            if ahead is not None:  # before computing, post the next compute action's receives
                for r in ahead[i]:
                    self._post(r, self.stage + r.chunk * self.p)
            steps.get(a.kind, self._backward)(a, self.stage + a.chunk * self.p)
            if on_action is not None:
                on_action(a, t0, time.perf_counter())
        self.finish_sends()

    def finish_sends(self) -> None:
        """Wait for every send in flight (in issue order; a failure names its action)."""
        while self.sending:
            a, handle = self.sending[0]
            self.action = a
            handle.wait()
            self.sending.pop(0)

    def _post(self, a: Action, k: int) -> None:
        key = (a.mb, a.chunk, a.kind)
        if key not in self.inbox:
            self.inbox[key] = _Posted(self._irecv(a, k))

    def _recv(self, a: Action, k: int) -> None:
        if self._irecv is not None:
            self._post(a, k)  # waited where the compute action takes it
        else:
            self.inbox[(a.mb, a.chunk, a.kind)] = self.work.recv(a, k)

    def _send(self, a: Action, k: int) -> None:
        value = self.outbox.pop((a.mb, a.chunk, a.kind), None)
        if value is None:
            raise ScheduleExecutionError(f"{a!r} on virtual stage {k}: nothing to send (its "
                                         f"compute action has not run)")
        if self._isend is None:
            self.work.send(a, k, value)
            return
        handle = self._isend(a, k, value)
        if handle is not None:
            self.sending.append((a, handle))

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
            got = self.inbox.pop((a.mb, a.chunk, kind))
        except KeyError:
            raise ScheduleExecutionError(
                f"{a!r} on virtual stage {k} runs before its {kind}{a.mb}; build the action list "
                f"with add_send_recv") from None
        return got.handle.wait() if isinstance(got, _Posted) else got

    def _store(self, k: int) -> GradientStore:
        return self.stores.setdefault(k, GradientStore())

    def gradients(self, actions) -> GradientStore:
        """Run ``actions`` (always cleared after) and merge every virtual stage's gradients."""
        try:
            self.run(actions)
        finally:
            self.clear()
        store = GradientStore()
        for st in self.stores.values():
            store.merge_from(st)
        return store

    def clear(self) -> None:
        """Drop everything held (after a failure: free the tensors at once)."""
        self.held.clear()
        self.inbox.clear()
        self.outbox.clear()
        self.sending.clear()
        install_tape(Tape())


@dataclass
class _Posted:
    """A receive posted ahead: ``handle.wait()`` gives the tensor."""
    handle: object


def _receives_ahead(actions: list) -> list[list]:
    """``ahead[i]``: the receives to post before action ``i`` runs: when ``i`` is a compute
    action, those of the next compute action (they sit between the two), so its data arrives
    while ``i`` computes."""
    ahead: list[list] = [[] for _ in actions]
    computes = [i for i, a in enumerate(actions) if not a.is_comm]
    for i, j in zip(computes, computes[1:]):
        ahead[i] = [a for a in actions[i + 1:j] if a.kind in (RECV_F, RECV_B)]
    return ahead
