"""Device-side asserts: kernels reading indices from device memory cannot raise, so a bad index
is clamped and sets a flag in a small device buffer. The next host read copies the flag after
its data (no extra mapping) and raises a DeviceAssertError naming the op and the value; reads
check only while an armed kernel has run since (``arm``). Flag words (u32): op code (0: none;
the first failure wins), the bad value (i32 bits), the size it was checked against."""
from __future__ import annotations

import threading

import numpy as np
import wgpu

from .errors import WgrumusError

OPS = {1: "embedding", 2: "index_select", 3: "gather", 4: "cross_entropy target", 5: "scatter"}
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

    def take_armed(self) -> bool:
        """Whether the read being recorded must carry the flag (and disarm)."""
        with self._lock:
            armed, self._armed = self._armed, 0
        return bool(armed)

    def record_copy(self, encoder, staging, offset: int) -> None:
        """Copy the flag into the read's staging buffer after its data, then clear it."""
        encoder.copy_buffer_to_buffer(self.buffer, 0, staging, offset, FLAG_BYTES)
        encoder.clear_buffer(self.buffer, 0, FLAG_BYTES)


def raise_if_set(flag_bytes) -> None:
    """Raise DeviceAssertError if the flag words copied along with a read are set."""
    words = np.frombuffer(flag_bytes, np.uint32, 3)
    if words[0]:
        op = OPS.get(int(words[0]), f"op {int(words[0])}")
        bad = int(words[1].view(np.int32))
        raise DeviceAssertError(
            f"device-side assert: {op} index {bad} is out of range for size {int(words[2])} "
            f"(an index tensor held on the device, read by a kernel recorded before this read; "
            f"the kernel clamped it, so results since then are wrong). Fix the indices, or pass "
            f"them as numpy arrays to have them checked on the host")
