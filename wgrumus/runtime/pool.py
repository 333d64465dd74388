"""Size-bucketed buffer pool: a dead tensor's buffer is reused by the next tensor of its bucket."""
from __future__ import annotations

import collections
import threading

import wgpu

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def bucket_size(nbytes: int) -> int:
    """Round up to 256 B, then to a quarter-power-of-two step so waste stays under 25%."""
    n = max(256, (nbytes + 255) & ~255)
    if n <= 4096:
        return 1 << (n - 1).bit_length()
    top = 1 << (n - 1).bit_length()
    step = top // 8
    return ((n + step - 1) // step) * step


class BufferPool:
    """Free lists per bucket; deque append/pop are atomic, so release may run in any thread (GC)."""

    def __init__(self, wgpu_device, max_cached_bytes: int = 1 << 30):
        self._dev = wgpu_device
        self._free: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._lock = threading.RLock()  # re-entrant: GC may release inside acquire
        self.max_cached_bytes = max_cached_bytes
        self.cached_bytes = 0
        self.live_bytes = 0
        self.allocated = 0  # buffers ever created (a soak test watches it stay flat)

    def acquire(self, nbytes: int):
        size = bucket_size(nbytes)
        q = self._free[size]
        try:
            buf = q.pop()
            with self._lock:
                self.cached_bytes -= size
        except IndexError:
            buf = self._dev.create_buffer(size=size, usage=STORAGE_USAGE)
            with self._lock:
                self.allocated += 1
        with self._lock:
            self.live_bytes += size
        return buf

    def release(self, buf) -> None:
        size = buf.size
        with self._lock:
            self.live_bytes -= size
            if self.cached_bytes + size > self.max_cached_bytes:
                return  # dropped: wgpu frees it once pending command buffers are done with it
            self.cached_bytes += size
        self._free[size].append(buf)

    def trim(self) -> None:
        with self._lock:
            self._free.clear()
            self.cached_bytes = 0

    def stats(self) -> dict:
        return {"live_bytes": self.live_bytes, "cached_bytes": self.cached_bytes,
                "buffers_created": self.allocated}
