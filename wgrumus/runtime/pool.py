"""Size-bucketed buffer pool: a dead tensor's buffer is reused by the next tensor of its bucket."""
from __future__ import annotations

import collections
import heapq
import itertools
import os
import threading

import wgpu

from .errors import OutOfMemoryError

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


def host_available() -> tuple[int, int] | None:
    """(MemAvailable, MemTotal) of this machine in bytes, or None where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f if ln.strip()}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


def memory_limit() -> int | None:
    """WGRUMUS_MEMORY_LIMIT (bytes; K, M, G, T suffixes): the most bytes of tensors one device
    may hold, for adapters that do not report their free memory (discrete GPUs under wgpu)."""
    v = os.environ.get("WGRUMUS_MEMORY_LIMIT", "").strip().upper().rstrip("B")
    if not v:
        return None
    scale = 1 << (10 * (" KMGT".index(v[-1]))) if v[-1] in "KMGT" else 1
    try:
        return int(float(v.rstrip("KMGT")) * scale)
    except ValueError:
        raise ValueError(f"WGRUMUS_MEMORY_LIMIT={os.environ['WGRUMUS_MEMORY_LIMIT']!r} is not a "
                         f"size; use bytes or e.g. 8G") from None


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class MemoryGuard:
    """Refuses, with an OutOfMemoryError that names the size, what is free and what to do, a
    new buffer that cannot fit, instead of letting wgpu fail with a bare validation error or,
    on CPU adapters (whose "device" memory is host memory), the machine run out of memory.

    ``host_backed``: device memory is host memory; its free bytes are MemAvailable, less a
    reserve for everything else. Memory a CPU adapter has been handed but not yet written is not
    resident yet, so once the bytes created since the last check grow large, ``sync()`` runs the
    pending work first. ``limit`` (WGRUMUS_MEMORY_LIMIT) caps the bytes a pool holds."""

    def __init__(self, name: str, host_backed: bool, sync=None):
        self.name, self.host_backed, self.sync = name, host_backed, sync
        self.limit = memory_limit()
        self._unsynced = 0

    def check(self, size: int, held: int, trim) -> None:
        """Before creating a buffer of ``size`` bytes while the pool holds ``held`` (live +
        cached); ``trim()`` frees the pool's cache and returns how many bytes it dropped."""
        if self.limit is not None and held + size > self.limit:
            held -= trim()
            if held + size > self.limit:
                self.fail(size, f"{_gb(max(self.limit - held, 0))} left of "
                                f"WGRUMUS_MEMORY_LIMIT={_gb(self.limit)}", held)
        if not self.host_backed:
            return
        mem = host_available()
        if mem is None:
            return
        avail, total = mem
        reserve = min(1 << 30, total // 16)  # for the interpreter, numpy copies, other programs
        # (an eighth: each logical device of the adapter keeps its own count)
        if self.sync is not None and self._unsynced + size > (avail - reserve) // 8:
            sync, self.sync, self._unsynced = self.sync, None, 0  # (sync itself allocates)
            try:
                sync()  # written buffers are resident: MemAvailable is then up to date
            finally:
                self.sync = sync
            avail, _ = host_available() or mem
        if size > avail - reserve:
            held -= trim()
            self.fail(size, f"{_gb(max(avail, 0))} of host memory available (CPU adapter: "
                            f"tensors live in host memory; {_gb(reserve)} kept in reserve)", held)
        self._unsynced += size

    def fail(self, size: int, free: str, held: int, cause=None):
        raise OutOfMemoryError(
            f"out of memory on {self.name}: cannot allocate {_gb(size)} ({size:,} bytes); "
            f"{free}; this process's tensors on the device hold {_gb(held)}. Free tensors you no "
            f"longer need (del them), lower the batch size or model size, or use a device with "
            f"more memory") from cause

    def create(self, device, size: int, held: int = 0, trim=lambda: 0, **kw):
        """device.create_buffer(size=size, **kw) behind the checks; wgpu's own out-of-memory
        report (a validation error "Not enough memory left") becomes an OutOfMemoryError."""
        self.check(size, held, trim)
        try:
            return device.create_buffer(size=size, **kw)
        except (wgpu.GPUOutOfMemoryError, wgpu.GPUValidationError) as e:
            if "memory" not in str(e).lower():
                raise
            dropped = trim()
            if dropped:  # the cache gave memory back: one more try
                try:
                    return device.create_buffer(size=size, **kw)
                except (wgpu.GPUOutOfMemoryError, wgpu.GPUValidationError):
                    pass
            mem = host_available() if self.host_backed else None
            free = (f"{_gb(mem[0])} of host memory available" if mem else
                    "the adapter does not report its free memory (WGRUMUS_MEMORY_LIMIT caps "
                    "what wgrumus uses)")
            self.fail(size, f"wgpu: {str(e).strip().splitlines()[-1].strip()}; {free}",
                      held - dropped, e)


class BufferPool:
    """Free lists per bucket, each a heap that hands out the oldest free buffer first.

    Handing out by age, not by release order, makes a repeated computation (a training step) get
    the same buffers at the same points every time, whatever order its tensors died in: the
    device's bind groups, cached by buffers, then hit instead of being rebuilt each step (with a
    LIFO list the assignment drifts from step to step: ~130 of ~190 bind groups of a small
    GPT-mini step were new every step). Release may run in any thread (GC); the lock guards the heaps.

    Every buffer handed out stays referenced by the pool (``_live``) until it is released. That
    keeps a buffer out of the garbage when its Storage dies inside a reference cycle: otherwise
    the collector runs wgpu's finalizer on the buffer too, and the pool would later hand out a
    released buffer (wgpu-native then aborts the process in create_bind_group).
    """

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
        self.allocated = 0  # buffers ever created (a soak test watches it stay flat)

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
            self._live[id(item[1])] = item
        return item[1]

    def release(self, buf) -> None:
        size = buf.size
        with self._lock:
            item = self._live.pop(id(buf), None)
            if item is None:
                return  # not ours, or released twice
            self.live_bytes -= size
            if self.cached_bytes + size > self.max_cached_bytes:
                return  # dropped: wgpu frees it once pending command buffers are done with it
            self.cached_bytes += size
            heapq.heappush(self._free[size], item)

    def trim(self) -> int:
        """Drop every cached buffer (wgpu frees them); returns the bytes dropped."""
        with self._lock:
            self._free.clear()
            dropped, self.cached_bytes = self.cached_bytes, 0
        return dropped

    def stats(self) -> dict:
        return {"live_bytes": self.live_bytes, "cached_bytes": self.cached_bytes,
                "buffers_created": self.allocated}
