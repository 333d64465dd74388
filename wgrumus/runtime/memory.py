"""Out-of-memory guard: a buffer that cannot be had is refused with an error that names the
size, what is free and what to do."""
from __future__ import annotations

import os

import wgpu

from .errors import OutOfMemoryError


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


def _limit_text(limit: int) -> str:
    """The limit as the user wrote it (K/M/G are binary there), with its size in bytes."""
    raw = os.environ.get("WGRUMUS_MEMORY_LIMIT", "").strip()
    return f"{raw} ({_gb(limit)})" if raw else _gb(limit)


def _gb(n: int) -> str:
    from rich.filesize import decimal
    return decimal(n)


class MemoryGuard:
    """Refuses a buffer that cannot fit with an OutOfMemoryError naming the size, what is free
    and what to do (instead of a bare wgpu error, or a CPU adapter exhausting the host).
    ``host_backed``: free bytes are MemAvailable less a reserve (pending work is ``sync``ed
    first, since unwritten memory is not resident yet); ``limit``: WGRUMUS_MEMORY_LIMIT."""

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
                                f"WGRUMUS_MEMORY_LIMIT={_limit_text(self.limit)}", held)
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
