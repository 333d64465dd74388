"""Recording what a device executes while a ``wr.jit`` function is captured.

While a capture is open, each device records, in order, the dispatches (pipeline, bind group
layout, buffers, parameter words, workgroup counts), buffer copies and host writes it is asked
to run, besides running them as usual. ``replay.Replay`` turns such a recording into command
buffers without Python per op. Operations whose result a replay cannot reproduce (reading a
value back to the host, drawing a seed from the global generator, a learning-rate scheduler
step, creating parameters or optimizer state) call ``refuse`` and fail with a ``CaptureError``
that names the call.
"""
from __future__ import annotations

import os
import sys
import threading

from .errors import CaptureError

_lock = threading.Lock()
_local = threading.local()  # .open: captures open in this thread (DataParallel replicas capture
# in their own threads at once, each on its own device)

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def refuse(call: str, why: str) -> None:
    """Raise a CaptureError for ``call`` if this thread has a capture open (a no-op
    otherwise)."""
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
    """The ordered device work of one capture on one device.

    ops: ("d", pipeline, layout, dynamic, buffers, words, groups, refresh) dispatches (words: the
    256-byte parameter slot; refresh: None, or a callable giving the slot's parameter list anew
    at every replay, e.g. an optimizer's bias corrections), ("c", src, src_off, dst, dst_off,
    nbytes) copies and ("w", dst, offset, data) host writes."""

    def __init__(self, device):
        self.device = device
        self.ops: list = []

    def dispatch(self, pipe, layout, dynamic, buffers, words: bytes, groups, refresh) -> None:
        self.ops.append(("d", pipe, layout, dynamic, tuple(buffers), words, tuple(groups),
                         refresh))

    def copy(self, src, src_off: int, dst, dst_off: int, nbytes: int) -> None:
        self.ops.append(("c", src, src_off, dst, dst_off, nbytes))

    def write(self, dst, offset: int, data: bytes) -> None:
        self.ops.append(("w", dst, offset, bytes(data)))

    @property
    def dispatches(self) -> int:
        return sum(op[0] == "d" for op in self.ops)

    def buffers(self) -> list:
        """Every device buffer the recording reads or writes (each once)."""
        seen = {}
        for op in self.ops:
            if op[0] == "d":
                for b in op[4]:
                    seen[id(b)] = b
            elif op[0] == "c":
                seen[id(op[1])] = op[1]
                seen[id(op[3])] = op[3]
            else:
                seen[id(op[1])] = op[1]
        return list(seen.values())


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
    return recs


def stop(devices) -> None:
    with _lock:
        for d in devices:
            d.recorder = None
    _local.open -= 1
