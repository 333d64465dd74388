"""Chunk staging for pipelined device <-> host transfers, with completion tracked per request.

``Staging(device)`` keeps MAP_READ and MAP_WRITE buffers per power-of-two size. ``submit`` records
buffer copies into the device's batch (after the work recorded before it), submits, and starts
one map request per staging buffer tied to that submission; ``StagingBuffer.wait`` then waits for
that submission only (runtime/native.py), so several chunks are in flight in both directions at
once. Idle READ buffers are unmapped (ready to be copied into); idle WRITE buffers are mapped or
being mapped (ready to be filled). After a failure ``discard`` finishes every map and unmaps and
drops every buffer, so nothing is left mapped.
"""
from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import wgpu

from .device import staging_size
from .native import MAP_READ, MAP_WRITE, api

MAX_IDLE = 8  # idle buffers kept per (direction, size)


class StagingBuffer:
    """One staging buffer and its latest map request."""
    __slots__ = ("__weakref__", "buffer", "mapped", "mode", "req", "size", "staging")

    def __init__(self, staging, mode: int, size: int):
        usage = (wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST if mode == MAP_READ
                 else wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC)
        self.staging, self.mode, self.size = staging, mode, size
        self.buffer = staging.device.wgpu.create_buffer(size=size, usage=usage)
        self.req = None
        self.mapped = False

    def ready(self) -> bool:
        """Mapped, or its map request completed (without waiting)."""
        return self.mapped or (self.req is not None and self.staging.api.is_done(self.req))

    def wait(self, deadline: float) -> None:
        """Until the pending map completes (TimeoutError past ``deadline``)."""
        if not self.mapped:
            if self.req is None:
                raise RuntimeError("staging buffer has no map request; submit it first")
            self.staging.api.wait(self.staging.device.wgpu, self.req, deadline)
            self.mapped = True
            self.req = None

    def array(self, dtype, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` as a numpy view of the mapped memory; every view must be gone
        before ``unmap``. WRITE buffers are write-combined: fill them, do not read them."""
        if not self.mapped:
            raise RuntimeError("staging buffer is not mapped; wait() for it first")
        return self.staging.api.mapped_array(self.buffer, nbytes, dtype)

    def unmap(self) -> None:
        if self.mapped:
            self.staging.api.unmap(self.buffer)
            self.mapped = False


class Staging:
    """Pipelined staging of one runtime Device (thread-safe)."""

    def __init__(self, device):
        self.device = device
        self.api = api()
        self._lock = threading.Lock()
        self._idle: dict[tuple, list] = {}
        self._made: list = []  # weakrefs to every buffer made (tests check none stays mapped)

    def _new(self, mode: int, size: int) -> StagingBuffer:
        sb = StagingBuffer(self, mode, size)
        with self._lock:
            if len(self._made) > 256:
                self._made = [r for r in self._made if r() is not None]
            self._made.append(weakref.ref(sb))
        return sb

    def reader(self, nbytes: int) -> StagingBuffer:
        """An unmapped READ buffer of at least ``nbytes`` to copy into."""
        size = staging_size(nbytes)
        with self._lock:
            free = self._idle.get((MAP_READ, size))
            if free:
                return free.pop()
        return self._new(MAP_READ, size)

    def writer(self, nbytes: int, deadline: float) -> StagingBuffer:
        """A mapped WRITE buffer of at least ``nbytes`` to fill. The oldest idle one is taken
        when its copy is done, or when two wait (waiting on the older); otherwise a new one."""
        size = staging_size(nbytes)
        sb = None
        with self._lock:
            free = self._idle.get((MAP_WRITE, size))
            if free and (free[0].ready() or len(free) >= 2):
                sb = free.pop(0)
        if sb is None:
            sb = self._new(MAP_WRITE, size)
            sb.req = self.api.map_async(sb.buffer, MAP_WRITE, size)
        sb.wait(deadline)
        return sb

    def submit(self, copies=(), maps=()) -> None:
        """Record ``copies`` ((src, src_offset, dst, dst_offset, nbytes) each) after the device's
        recorded work, submit, and start mapping each StagingBuffer of ``maps`` (in full) once
        that submission is done. WRITE buffers must be unmapped by then."""
        dev = self.device
        with dev.lock:
            for src, so, dst, do, n in copies:
                dev.copy(src, so, dst, do, n)
            dev.flush()
            index = dev.last_submission
            for sb in maps:
                sb.req = self.api.map_async(sb.buffer, sb.mode, sb.size, index)

    def give_back(self, sb: StagingBuffer) -> None:
        """Return a buffer: a READ one unmapped, a WRITE one mapped or with its map requested."""
        with self._lock:
            free = self._idle.setdefault((sb.mode, sb.size), [])
            if len(free) < MAX_IDLE:
                free.append(sb)

    def discard(self, held=(), timeout: float = 10.0) -> None:
        """After a failure: finish the map requests of ``held`` (buffers taken and not given
        back) and of every idle buffer, unmap them all and forget them."""
        deadline = time.monotonic() + timeout
        with self._lock:
            bufs = [sb for free in self._idle.values() for sb in free]
            self._idle.clear()
        for sb in [*held, *bufs]:
            if sb is None:
                continue
            try:
                if sb.req is not None:
                    sb.wait(deadline)
                sb.unmap()
            except Exception:  # noqa: BLE001 - a failed map leaves the buffer unmapped
                sb.req = None

    def mapped_buffers(self) -> int:
        """Staging buffers of this device mapped or with a map request pending (wgpu-native
        does not implement wgpuBufferGetMapState: this counts what our calls left)."""
        live = [r() for r in self._made]
        return sum(sb.mapped or sb.req is not None for sb in live if sb is not None)


_STAGING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STAGING_LOCK = threading.Lock()


def staging_of(device) -> Staging:
    """The device's Staging (made on first use)."""
    with _STAGING_LOCK:
        st = _STAGING.get(device)
        if st is None:
            st = _STAGING[device] = Staging(device)
        return st
