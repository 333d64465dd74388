"""Recording what a device executes while a ``wr.jit`` function is captured (replay.py replays
it). Operations a replay cannot reproduce call ``refuse`` (a ``CaptureError`` naming the call);
communication is recorded as a host operation (``host_op`` / ``host_launch`` / ``host_start``)
run again between the replayed segments.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

import wgpu

from .errors import CaptureError

_lock = threading.Lock()
_local = threading.local()  # .open: captures open in this thread (DataParallel replicas capture
# in their own threads at once, each on its own device)

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def refuse(call: str, why: str) -> None:
    """Raise a CaptureError for ``call`` if this thread has a capture open."""
    if getattr(_local, "open", 0):
        raise CaptureError(f"{call} inside a wr.jit function{_user_frame()}: {why}. A "
                           "captured step replays device work only; move this out of the "
                           "jitted function (or call the function without wr.jit)")


def _user_frame() -> str:
    """' (file:line)' of the innermost caller outside the wgrumus package."""
    f = sys._getframe(2)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_PKG + os.sep):
            return f" (at {f.f_code.co_filename}:{f.f_lineno})"
        f = f.f_back
    return ""


class Recording:
    """The ordered device work of one capture on one device: ``ops`` are tuples tagged "d"
    (dispatch), "c" (copy), "t" (texture copy), "w" (host write), "h" (host_op), "a" / "j"
    (launch / join of a host_launch), with the arguments of the method that appends them."""

    def __init__(self, device):
        self.device = device
        self.ops: list = []
        self.launches = 0

    def dispatch(self, pipe, layout, dynamic, buffers, words: bytes, groups, refresh,
                 written=None) -> None:
        self.ops.append(("d", pipe, layout, dynamic, tuple(buffers), words, tuple(groups),
                         refresh, written))

    def copy(self, src, src_off: int, dst, dst_off: int, nbytes: int) -> None:
        self.ops.append(("c", src, src_off, dst, dst_off, nbytes))

    def texture_copy(self, src, src_off: int, bytes_per_row: int, texture, y: int, width: int,
                     rows: int) -> None:
        self.ops.append(("t", src, src_off, bytes_per_row, texture, y, width, rows))

    def write(self, dst, offset: int, data: bytes) -> None:
        self.ops.append(("w", dst, offset, bytes(data)))

    def host(self, fn, args: tuple, out) -> None:
        self.ops.append(("h", fn, args, out))

    def launch(self, fn, args: tuple) -> int:
        self.ops.append(("a", fn, args, self.launches))
        self.launches += 1
        return self.launches - 1

    def join(self, slot: int, out, timeout) -> None:
        self.ops.append(("j", slot, out, timeout))

    def buffers(self) -> list:
        """Every device buffer the recording reads or writes (each once)."""
        seen = {}
        for op in self.ops:
            if op[0] == "d":
                for b in op[4]:
                    if isinstance(b, wgpu.GPUBuffer):  # not the device's operand textures
                        seen[id(b)] = b
            elif op[0] == "t":
                seen[id(op[1])] = op[1]
            elif op[0] == "c":
                seen[id(op[1])] = op[1]
                seen[id(op[3])] = op[3]
            elif op[0] == "w":
                seen[id(op[1])] = op[1]
            else:  # host operations: their tensor arguments and results
                tensors = (*op[2], op[3]) if op[0] == "h" else op[2] if op[0] == "a" else \
                    (op[2],)
                for t in tensors:
                    if t is not None:
                        seen[id(t.buffer)] = t.buffer
        return list(seen.values())


def capturing() -> bool:
    """True while this thread has a capture open."""
    return getattr(_local, "open", 0) > 0


def guard(key, what: str, read) -> None:
    """Inside a capture in this thread: a replay stays valid only while ``read()`` returns what
    it returns now (==); otherwise the next call raises a CaptureError naming ``what``. One
    guard per ``key``."""
    g = getattr(_local, "guards", None)
    if g is not None and getattr(_local, "open", 0) and key not in g:
        g[key] = (what, read, read())


def note_grad(t) -> None:
    """``t.grad`` is being assigned (Tensor.grad's setter). The first assignment inside a
    capture makes ``t``'s gradient the capture's own: a replay sets ``t.grad`` to what the
    capture left there, whatever it was before the call."""
    g = getattr(_local, "grads", None)
    if g is not None and getattr(_local, "open", 0) and id(t) not in g:
        g[id(t)] = (t, False)


def grad_from_outside(t, device) -> bool:
    """Inside a capture on ``device``: True when backward is about to add to ``t.grad`` and the
    capture has not assigned it yet, so the sum depends on the gradient made before the call
    (the caller then adds through ``host_op``, which a replay runs again with the gradient of
    that moment)."""
    g = getattr(_local, "grads", None)
    if g is None or not recording(device) or id(t) in g:
        return False
    g[id(t)] = (t, True)
    return True


def guard_grad(t) -> None:
    """``t.grad`` is read inside a capture: unless the capture made it, a replay stays valid
    only while ``t.grad`` is the same tensor (its buffer is what the replay reads)."""
    g = getattr(_local, "grads", None)
    if g is None or not getattr(_local, "open", 0) or id(t) in g:
        return
    ref = t.grad
    guard(("grad", id(t)), "the .grad of a parameter read by the jitted function (made "
          "outside it: compute gradients inside the function)",
          lambda: "the captured tensor" if t.grad is ref else "another tensor")


def start(devices) -> list:
    """Open a capture on ``devices`` (their open batches are submitted first)."""
    recs = []
    with _lock:
        for d in devices:
            if d.recorder is not None:
                raise CaptureError(f"{d!r} is already being captured; wr.jit functions cannot "
                                   "call other wr.jit functions or run in two threads at once")
        for d in devices:
            d.flush()
            d.recorder = Recording(d)
            recs.append(d.recorder)
    _local.open = getattr(_local, "open", 0) + 1
    _local.guards, _local.grads = {}, {}
    return recs


def stop(devices) -> tuple:
    """Close the capture: (its guards [(what, read, value)], the tensors whose .grad it
    assigned [(tensor, the grad it left there, whether it added to one made before)])."""
    with _lock:
        for d in devices:
            d.recorder = None
    _local.open -= 1
    guards, grads = _local.guards, _local.grads
    _local.guards = _local.grads = None
    return list(guards.values()), [(t, t.grad, outside) for t, outside in grads.values()]


def recording(device) -> bool:
    """True when this thread has a capture open on ``device``."""
    return getattr(device, "recorder", None) is not None and getattr(_local, "open", 0) > 0


@contextlib.contextmanager
def paused(device=None):
    """Eager work in this thread without refusals (and, on ``device``, without recording)."""
    n, _local.open = getattr(_local, "open", 0), 0
    rec = None
    if device is not None:
        rec, device.recorder = device.recorder, None
    try:
        yield
    finally:
        if device is not None:
            device.recorder = rec
        _local.open = n


def _run_paused(device, call) -> tuple:
    """(recording, ``call()``): run paused, after flushing what the capture ran so far."""
    rec = device.recorder
    device.flush()
    with paused(device):
        out = call()
    if out is not None and (out.device is not device or not out.is_contiguous()):
        raise CaptureError(f"a communication result on {out.device} (contiguous: "
                           f"{out.is_contiguous()}) cannot be replayed into {device}")
    return rec, out


def host_op(device, fn, *args):
    """``fn(*args)``: communication on ``device``'s tensors. Inside a capture it runs eagerly,
    recording paused, and is recorded: each replay runs ``fn`` again on the same argument
    buffers and copies its result into this call's result buffer."""
    if not recording(device):
        return fn(*args)
    rec, out = _run_paused(device, lambda: fn(*args))
    rec.host(fn, tuple(a.detach() for a in args), None if out is None else out.detach())
    return out


def host_launch(device, launch, *args):
    """``launch(*args)``: asynchronous communication returning a handle with ``wait(timeout)``.
    Inside a capture it runs to completion at once, recording paused, and returns a
    ``Launched``; a replay launches here and waits where ``Launched.wait`` was called."""
    if not recording(device):
        return launch(*args)
    rec, out = _run_paused(device, lambda: launch(*args).wait(None))
    slot = rec.launch(launch, tuple(a.detach() for a in args))
    return Launched(rec, slot, None if out is None else out.detach())


def host_start(device, launch, *args):
    """``launch(*args)`` like :func:`host_launch`, but a capture does not wait for it at once:
    the handle stays in flight until ``Launched.wait``, as in a replay. For communication whose
    completion depends on work this rank does later (a pipeline send the peer takes only after
    it got something this rank sends next: waiting at once would deadlock)."""
    if not recording(device):
        return launch(*args)
    rec = device.recorder
    device.flush()
    with paused(device):
        live = launch(*args)
    slot = rec.launch(launch, tuple(a.detach() for a in args))
    return Launched(rec, slot, None, live)


class Launched:
    """The capture's stand-in for a ``host_launch`` handle: its first ``wait`` records the join
    (and, for :func:`host_start`, waits for the handle still in flight, recording paused)."""

    def __init__(self, rec: Recording, slot: int, out, live=None):
        self._rec, self.slot, self._out, self._live = rec, slot, out, live

    def wait(self, timeout: float | None = None):
        rec, self._rec = self._rec, None
        if rec is not None:
            if rec.device.recorder is not rec or not recording(rec.device):
                raise CaptureError("an asynchronous communication started inside a wr.jit "
                                   "function must be waited for inside it, in the capturing "
                                   "thread (a replay waits where the capture did)")
            if self._live is not None:
                live, self._live = self._live, None
                _, out = _run_paused(rec.device, lambda: live.wait(timeout))
                self._out = None if out is None else out.detach()
            rec.join(self.slot, self._out, timeout)
        return self._out
