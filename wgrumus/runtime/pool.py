"""Size-bucketed buffer pool: a dead tensor's buffer is reused by the next tensor of its bucket."""
from __future__ import annotations

import collections
import heapq
import itertools
import threading

import wgpu

from .memory import MemoryGuard

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def bucket_size(nbytes: int, limit: int | None = None) -> int:
    """Round up to 256 B, then to a quarter-power-of-two step so waste stays under 25%; never
    past ``limit`` (the largest bindable buffer), so any size the device accepts stays bindable."""
    n = max(256, (nbytes + 255) & ~255)
    if n <= 4096:
        size = 1 << (n - 1).bit_length()
    else:
        step = (1 << (n - 1).bit_length()) // 8
        size = ((n + step - 1) // step) * step
    if limit is not None and size > limit:
        size = max(limit & ~3, (nbytes + 3) & ~3)
    return size


class BufferPool:
    """Free lists per bucket, heaps handing out the oldest free buffer first, so a repeated
    step gets the same buffers every time and the device's bind-group cache hits (LIFO made
    ~130 of ~190 bind groups of a GPT-mini step new every step). Handed-out buffers stay
    referenced (``_live``) so a Storage dying in a cycle cannot let GC finalize a buffer the
    pool hands out later. Buffers pinned by a ``wr.jit`` capture are never handed out."""

    def __init__(self, wgpu_device, max_cached_bytes: int = 1 << 30, guard=None):
        self._dev = wgpu_device
        self.guard = guard or MemoryGuard("device", False)
        lim = wgpu_device.limits
        self.max_size = min(lim["max-storage-buffer-binding-size"], lim["max-buffer-size"])
        self._free: dict[int, list] = collections.defaultdict(list)  # heaps of (age, buffer)
        self._live: dict[int, tuple] = {}  # id -> (age, buffer)
        self._ages = itertools.count()
        self._lock = threading.RLock()  # re-entrant: GC may release inside acquire
        self.max_cached_bytes = max_cached_bytes
        self.cached_bytes = 0
        self.live_bytes = 0
        self.peak_live_bytes = 0  # high-water mark of live_bytes since reset_peak()
        self.allocated = 0  # buffers ever created (a soak test watches it stay flat)
        self._pins: dict[int, int] = {}  # id -> number of captures holding the buffer
        self._held: dict[int, tuple] = {}  # id -> (age, buffer): released but pinned
        self.held_bytes = 0

    def acquire(self, nbytes: int):
        size = bucket_size(nbytes, self.max_size)
        with self._lock:
            q = self._free[size]
            item = heapq.heappop(q) if q else None
            if item is not None:
                self.cached_bytes -= size
        if item is None:
            buf = self.guard.create(self._dev, size, self.live_bytes + self.cached_bytes,
                                    self.trim, usage=STORAGE_USAGE)
            item = (next(self._ages), buf)
            with self._lock:
                self.allocated += 1
        with self._lock:
            self.live_bytes += size
            self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
            self._live[id(item[1])] = item
        return item[1]

    def release(self, buf) -> None:
        size = buf.size
        with self._lock:
            item = self._live.pop(id(buf), None)
            if item is None:
                return  # not ours, or released twice
            self.live_bytes -= size
            if id(buf) in self._pins:
                self._held[id(buf)] = item
                self.held_bytes += size
                return
            self._cache(item)

    def _cache(self, item) -> None:
        size = item[1].size
        if self.cached_bytes + size > self.max_cached_bytes:
            return  # dropped: wgpu frees it once pending command buffers are done with it
        self.cached_bytes += size
        heapq.heappush(self._free[size], item)

    def pin(self, buffers) -> None:
        """Keep ``buffers`` away from other tensors until ``unpin``: free ones leave the free
        lists now, live ones when they are released."""
        with self._lock:
            free = set()
            for b in buffers:
                self._pins[id(b)] = self._pins.get(id(b), 0) + 1
                free.add(id(b))
            for size, q in self._free.items():
                keep = [it for it in q if id(it[1]) not in free]
                if len(keep) != len(q):
                    for it in q:
                        if id(it[1]) in free:
                            self._held[id(it[1])] = it
                            self.held_bytes += size
                            self.cached_bytes -= size
                    heapq.heapify(keep)
                    self._free[size] = keep

    def unpin(self, buffers) -> None:
        """Drop one pin of each buffer; a released buffer whose last pin goes is free again."""
        with self._lock:
            for b in buffers:
                n = self._pins.get(id(b), 0) - 1
                if n > 0:
                    self._pins[id(b)] = n
                    continue
                self._pins.pop(id(b), None)
                item = self._held.pop(id(b), None)
                if item is not None:
                    self.held_bytes -= item[1].size
                    self._cache(item)

    def trim(self) -> int:
        """Drop every cached buffer (wgpu frees them); returns the bytes dropped."""
        with self._lock:
            self._free.clear()
            dropped, self.cached_bytes = self.cached_bytes, 0
        return dropped

    def reset_peak(self) -> None:
        """Start a new high-water mark from the bytes live now (memory benchmarks)."""
        with self._lock:
            self.peak_live_bytes = self.live_bytes

    def stats(self) -> dict:
        return {"live_bytes": self.live_bytes, "peak_live_bytes": self.peak_live_bytes,
                "cached_bytes": self.cached_bytes, "held_bytes": self.held_bytes,
                "pinned": len(self._pins), "buffers_created": self.allocated}
