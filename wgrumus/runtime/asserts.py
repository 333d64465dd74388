"""Device-side asserts: kernels that read indices from device memory (embedding ids, gather /
index_select indices, cross_entropy targets held on the device) cannot raise, so an index out
of range sets a flag in a small buffer of the device (the kernel clamps it and goes on). The
next host read of that device (``item``, ``numpy``, ``synchronize``) copies the flag along with
its data, in the same submit, and raises a DeviceAssertError naming the op and the bad value,
as CUDA's device-side asserts do. Reads are checked only while some kernel that can set the
flag has run since the last check (``arm``); indices checked on the host never arm it.

Flag words (u32): 0 op code (0: no error; the first failing op wins), 1 the bad value (i32
bits), 2 the size it was checked against."""
from __future__ import annotations

import threading

import numpy as np
import wgpu

from .errors import WgrumusError

OPS = {1: "embedding", 2: "index_select", 3: "gather", 4: "cross_entropy target"}
CODES = {name: code for code, name in OPS.items()}
FLAG_BYTES = 16


class DeviceAssertError(WgrumusError, IndexError):
    """An index held on the device was out of range in a kernel that ran before this read."""


class DeviceAsserts:
    def __init__(self, wgpu_device):
        self._dev = wgpu_device
        self._flag = None
        self._armed = 0  # flagging dispatches recorded since the last check
        self._lock = threading.Lock()

    @property
    def buffer(self):
        """The flag buffer, bound by the kernels that check indices."""
        if self._flag is None:
            self._flag = self._dev.create_buffer(
                size=FLAG_BYTES, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                | wgpu.BufferUsage.COPY_DST)
        return self._flag

    def arm(self) -> None:
        """A kernel that may set the flag was recorded: check the next read."""
        with self._lock:
            self._armed += 1

    def record_read(self, encoder):
        """Called while a read is recorded: when armed, also copy the flag (the caller submits
        the batch); returns the pending check, or None."""
        with self._lock:
            armed, self._armed = self._armed, 0
        if not armed:
            return None
        staging = self._dev.create_buffer(
            size=FLAG_BYTES, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        encoder.copy_buffer_to_buffer(self.buffer, 0, staging, 0, FLAG_BYTES)
        encoder.clear_buffer(self.buffer, 0, FLAG_BYTES)
        return _Check(staging)


class _Check:
    def __init__(self, staging):
        self._s = staging
        self._p = None

    def start(self) -> None:
        self._p = self._s.map_async("READ_NOSYNC", 0, FLAG_BYTES)

    def result(self) -> None:
        """Raise DeviceAssertError if the flag was set."""
        self._p.sync_wait()
        words = np.frombuffer(self._s.read_mapped(0, FLAG_BYTES), np.uint32).copy()
        self._s.unmap()
        self._s.destroy()
        if words[0]:
            op = OPS.get(int(words[0]), f"op {int(words[0])}")
            bad = int(words[1].view(np.int32))
            raise DeviceAssertError(
                f"device-side assert: {op} index {bad} is out of range for size "
                f"{int(words[2])} (an index tensor held on the device, read by a kernel "
                f"recorded before this read; the kernel clamped it, so results since then are "
                f"wrong). Fix the indices, or pass them as numpy arrays to have them checked "
                f"on the host")
