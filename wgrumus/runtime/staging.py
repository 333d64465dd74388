"""Device <-> host staging: the Device's transfers (``HostTransfers``) and the chunk staging of
pipelined transfers (``Staging``: map requests tied to one submission, so chunks are in flight in
both directions at once). Both pool buffers per power-of-two size: idle READ buffers unmapped,
idle WRITE buffers mapped or being mapped (ready to fill).
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import wgpu

from .asserts import FLAG_BYTES, raise_if_set
from .capture import refuse
from .native import MAP_READ, MAP_WRITE, api

MAPPED_WRITE_MIN = 1 << 16  # uploads from this size go through mapped staging buffers
READ_CHUNK = 64 << 20  # downloads into a given array are split so copy-out overlaps the DMA
READ_INFLIGHT = 2  # chunks of such a download in flight at once
ZERO_COPY_MIN = 1 << 20  # fresh arrays from this size are views of their staging buffer
WRITE_CHUNK = 1 << 30  # uploads above twice this are split (bounds one staging buffer)
COPY_THREADS = min(16, os.cpu_count() or 1)  # threads of one large host copy
# host copies from this size are split over threads (one H200 host, 16 threads: 4 MB took
# 816 us split against 386 on one thread, 16 MB 1.2 ms against 1.55; BENCHMARKS.md)
PAR_COPY_MIN = 16 << 20
STAGING_CACHE = 1 << 30  # bytes of idle staging buffers kept per device and direction
MAP_TIMEOUT_S = 600.0  # the longest a device read or upload buffer waits for the GPU

MAX_IDLE = 16  # idle buffers kept per (direction, size) by Staging (>= MAX_INFLIGHT)


class HostTransfers:
    """Device's host <-> device methods (a mixin of runtime.device.Device)."""

    def _init_staging(self) -> None:
        self._idle_read: dict[int, list] = {}  # MAP_READ buffers, idle, by size
        self._idle_write: dict[int, list] = {}  # MAP_WRITE buffers, (buffer, map promise), by size
        self._upload_used: list = []  # MAP_WRITE buffers copied from in the open batch
        self._idle_bytes = [0, 0]  # idle bytes cached: [read, write]

    def write(self, buf, data: np.ndarray, offset: int = 0) -> None:
        """Host -> device. Large data goes through mapped staging buffers, its copy recorded in
        the open batch (in order, no flush); small data through queue.write_buffer, which runs
        before the open batch, so that batch is submitted first."""
        data = np.ascontiguousarray(data)
        nbytes = data.nbytes
        if nbytes == 0:
            return
        raw = data.reshape(-1).view(np.uint8)
        if nbytes >= MAPPED_WRITE_MIN and nbytes % 4 == 0 and offset % 4 == 0:
            # in chunks, each submitted at once: filling the next overlaps the previous DMA
            step = WRITE_CHUNK if nbytes > 2 * WRITE_CHUNK else nbytes
            for lo in range(0, nbytes, step):
                self._write_mapped(buf, raw[lo:lo + step], offset + lo)
            return
        with self.lock:
            self.flush_locked()
            if nbytes % 4:
                pad = np.zeros(((nbytes + 3) // 4) * 4, dtype=np.uint8)
                pad[:nbytes] = raw
                raw = pad
            if self.recorder is not None:
                self.recorder.write(buf, offset, raw)
            sub = self.submitter
            if sub is not None and sub.busy():  # behind the queued replays, not before them
                sub.put(self.queue.write_buffer, buf, offset, raw.copy())
                return
            self.queue.write_buffer(buf, offset, raw)

    def _write_mapped(self, buf, raw: np.ndarray, offset: int) -> None:
        up = self.write_start(raw.nbytes)
        try:
            par_copy(up.view(np.uint8), raw)
        except BaseException:
            up.cancel()
            raise
        up.commit(buf, offset)

    def write_start(self, nbytes: int) -> Upload:
        """Host -> device in two steps: fill ``.view(dtype)`` (write-only), then ``.commit``."""
        if nbytes <= 0 or nbytes % 4:
            raise ValueError(f"write_start: {nbytes} bytes; staged uploads move a positive "
                             "multiple of 4 bytes (pad the data, or use write())")
        return Upload(self, self._write_buffer(nbytes), nbytes)

    def _commit_upload(self, st, buf, offset: int, nbytes: int) -> None:
        with self.lock:
            self._close_pass().copy_buffer_to_buffer(st, 0, buf, offset, nbytes)
            self._upload_used.append(st)
            # from 1 MiB submit at once, so the staging buffer returns to the pool
            if nbytes >= (1 << 20) or len(self._upload_used) >= 64:
                self.flush_locked()

    def _write_buffer(self, nbytes: int):
        """A MAP_WRITE staging buffer of at least nbytes, mapped and ready to fill."""
        size = staging_size(nbytes)
        with self.lock:
            # two rotate per size: the older one's copy is done by now
            free = self._idle_write.get(size)
            item = free.pop(0) if free and len(free) >= 2 else None
            if item is not None:
                self._idle_bytes[1] -= size
        if item is None:
            return self.memory.create(self.wgpu, size, mapped_at_creation=True,
                                      usage=wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC)
        st, req = item
        self.wait_map(req)
        return st

    def wait_map(self, req, deadline: float | None = None) -> None:
        """Until the map request ``req`` on this device resolves, blocking or polling as
        ``blocking_waits`` says (TimeoutError past ``deadline``, by default MAP_TIMEOUT_S from
        now)."""
        if deadline is None:
            deadline = time.monotonic() + MAP_TIMEOUT_S
        api().wait(self.wgpu, req, deadline, self.blocking_waits)

    def _return_upload(self, st, req) -> None:
        if self._idle_bytes[1] + st.size > STAGING_CACHE:
            return  # dropped: wgpu frees it once the pending copy is done
        self._idle_bytes[1] += st.size
        self._idle_write.setdefault(st.size, []).append((st, req))

    def _read_buffer(self, size: int):
        size = staging_size(size)
        with self.lock:
            free = self._idle_read.setdefault(size, [])
            if free:
                self._idle_bytes[0] -= size
                return free.pop()
        return self.memory.create(self.wgpu, size,
                                  usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def read_start(self, buf, offset: int, nbytes: int) -> Download:
        """Device -> host, asynchronous: ``.result()`` of the Download (any thread) waits."""
        if self.recorder is not None:
            refuse("reading a tensor back to the host (.item(), .numpy(), float(), bool(), "
                   "print, or a device synchronize)",
                   "its value is taken once at capture and would be stale in every replay, as "
                   "would Python control flow on it")
        start = offset & ~3
        end = (offset + nbytes + 3) & ~3
        size = max(end - start, 4)
        with self.lock:
            check = self.asserts.take_armed()  # the device-side assert flag rides along
            mapped = (size + 7) // 8 * 8 + FLAG_BYTES if check else size  # (8-aligned ranges)
            staging = self._read_buffer(mapped)
            enc = self._close_pass()
            enc.copy_buffer_to_buffer(buf, start, staging, 0, size)
            if check:
                self.asserts.record_copy(enc, staging, mapped - FLAG_BYTES)
            self.flush_locked()
            req = api().map_async(staging, MAP_READ, mapped, self.last_submission)
        return Download(self, staging, req, mapped, offset - start, nbytes, size, check)

    def read(self, buf, offset: int, nbytes: int) -> bytes:
        if nbytes == 0:
            return b""
        return self.read_start(buf, offset, nbytes).result()

    def read_array(self, buf, offset: int, count: int, dtype, out: np.ndarray | None = None):
        """Device -> host. Without `out`, a large result is a view of the mapped staging buffer
        (no host copy); into `out`, large reads go in chunks so copy-out overlaps the DMA."""
        dtype = np.dtype(dtype)
        if out is None and count * dtype.itemsize >= ZERO_COPY_MIN:
            return self.read_start(buf, offset, count * dtype.itemsize).mapped_array(dtype)
        if out is None:
            out = np.empty(count, dtype)
        elif out.dtype != dtype or out.size != count or not out.flags.c_contiguous:
            raise ValueError(f"read_array: out must be a contiguous {dtype} array of {count} "
                             f"elements, got {out.dtype} {out.shape}")
        if count == 0:
            return out
        flat = out.reshape(-1).view(np.uint8)
        nbytes = flat.nbytes
        step = READ_CHUNK if nbytes > 2 * READ_CHUNK else nbytes
        pending, nxt = [], 0
        while pending or nxt < nbytes:
            while nxt < nbytes and len(pending) < READ_INFLIGHT:
                pending.append((nxt, self.read_start(buf, offset + nxt, min(step, nbytes - nxt))))
                nxt += step
            lo, d = pending.pop(0)
            d.into(flat[lo:lo + d.nbytes])
        return out

    def _return_staging(self, staging) -> None:
        with self.lock:
            if self._idle_bytes[0] + staging.size > STAGING_CACHE:
                return
            self._idle_bytes[0] += staging.size
            self._idle_read.setdefault(staging.size, []).append(staging)


class Download:
    """A device -> host copy in flight; take its bytes once (from any thread)."""

    def __init__(self, device, staging, req, mapped, skip, nbytes, size, check=False):
        self._d, self._s, self._req, self._mapped = device, staging, req, mapped
        self._skip, self.nbytes, self._size = skip, nbytes, size
        self._check = check  # the device-side assert flag follows the data (runtime/asserts.py)
        self._flag_at = (size + 7) // 8 * 8

    def _wait(self) -> np.ndarray:
        """The mapped bytes, once the copy is done (raises its device-side assert, unmapped)."""
        self._d.wait_map(self._req)
        raw = api().mapped_array(self._s, self._mapped)
        if self._check:
            flag = raw[self._flag_at:self._flag_at + FLAG_BYTES].copy()
            try:
                raise_if_set(flag)
            except Exception:
                del raw
                self._release()
                raise
        return raw

    def _release(self) -> None:
        api().unmap(self._s)
        self._d._return_staging(self._s)

    def _take(self, convert):
        raw = self._wait()
        try:
            out = convert(raw[self._skip:self._skip + self.nbytes])
        finally:
            del raw
            self._release()
        return out

    def result(self) -> bytes:
        return self._take(lambda v: v.tobytes())

    def mapped_array(self, dtype) -> np.ndarray:
        """A writable array over the mapped staging memory, unmapped when its views die."""
        raw = self._wait()
        return np.asarray(_MappedHost(self._d, self._s, raw, self._skip, self.nbytes, dtype))

    def into(self, out: np.ndarray) -> None:
        """Copy the bytes into a contiguous uint8 array of exactly nbytes."""
        self._take(lambda v: par_copy(out, v))


class Upload:
    """A mapped MAP_WRITE staging buffer being filled; ``commit`` or ``cancel`` it once."""

    def __init__(self, device, staging, nbytes: int):
        self._d, self._s, self.nbytes = device, staging, nbytes
        self._mv = api().mapped_array(staging, nbytes)

    def view(self, dtype) -> np.ndarray:
        return self._mv.view(dtype)

    def _unmap(self) -> None:
        if self._mv is None:
            raise RuntimeError("this upload was already committed or cancelled")
        self._mv = None
        api().unmap(self._s)

    def commit(self, buf, offset: int = 0) -> None:
        """Record the copy of the filled bytes into ``buf`` at ``offset``; views die here."""
        if self._d.recorder is not None and self._mv is not None:
            self._d.recorder.write(buf, offset, self._mv[:self.nbytes])
        self._unmap()
        self._d._commit_upload(self._s, buf, offset, self.nbytes)

    def cancel(self) -> None:
        """Give the staging buffer up without copying (after a failure)."""
        self._unmap()


class _MappedHost:
    """Owns a mapped staging range; numpy views collapse their base to it (it lives as they do)."""

    def __init__(self, device, staging, raw: np.ndarray, skip: int, nbytes: int, dtype):
        self._d, self._s = device, staging
        self._mv = raw
        ptr = raw.ctypes.data + skip
        dtype = np.dtype(dtype)
        self.__array_interface__ = {"shape": (nbytes // dtype.itemsize,), "typestr": dtype.str,
                                    "data": (ptr, False), "version": 3}

    def __del__(self):
        try:
            self._mv = None
            api().unmap(self._s)
            self._d._return_staging(self._s)
        except Exception:  # interpreter shutdown: the device may be gone already
            pass


_COPY_POOL: list = []


def par_ranges(fn, n: int, piece: int = 1 << 20) -> None:
    """fn(lo, hi) over [0, n) split over threads (numpy releases the GIL: one core copied
    ~9 GB/s, eight ~29 GB/s on the H100 host); errors propagate."""
    nt = min(COPY_THREADS, n // piece)
    if nt < 2:
        fn(0, n)
        return
    if not _COPY_POOL or _COPY_POOL[0]._max_workers < COPY_THREADS:
        _COPY_POOL[:] = [ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="wgrumus-copy")]
    step = (-(-n // nt) + 1023) & ~1023
    futs = [_COPY_POOL[0].submit(fn, i, min(i + step, n)) for i in range(step, n, step)]
    try:
        fn(0, min(step, n))
    finally:
        wait(futs)  # no piece runs on once this returns or raises (the arrays may be unmapped)
    for f in futs:
        f.result()


def par_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src for flat uint8 arrays; large copies are split over threads."""
    if src.nbytes < PAR_COPY_MIN:
        np.copyto(dst, src)
        return
    par_ranges(lambda a, b: np.copyto(dst[a:b], src[a:b]), src.nbytes, 1)


def staging_size(nbytes: int) -> int:
    """Staging buffers come in power-of-two sizes (>= 256 B) so they are reused."""
    return max(256, 1 << (max(nbytes, 1) - 1).bit_length())


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
            self.staging.device.wait_map(self.req, deadline)
            self.mapped = True
            self.req = None

    def array(self, dtype, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` as a view of the mapped memory (write-only for WRITE buffers)."""
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

    def writer(self, nbytes: int, deadline: float, spare: int = 1) -> StagingBuffer:
        """A mapped WRITE buffer of at least ``nbytes``: the oldest idle one when its copy is
        done or more than ``spare`` wait, else a new one (a pipeline ``k`` chunks deep passes
        ``spare=k`` so filling never waits on later downloads)."""
        size = staging_size(nbytes)
        sb = None
        with self._lock:
            free = self._idle.get((MAP_WRITE, size))
            stale = bool(free) and not free[0].ready() and len(free) <= spare
        if stale:
            self.api.poll(self.device.wgpu)  # fire the callbacks of what is done (no wait)
        with self._lock:
            free = self._idle.get((MAP_WRITE, size))
            if free and (free[0].ready() or len(free) > spare):
                sb = free.pop(0)
        if sb is None:
            sb = self._new(MAP_WRITE, size)
            sb.req = self.api.map_async(sb.buffer, MAP_WRITE, size)
        sb.wait(deadline)
        return sb

    def submit(self, copies=(), maps=()) -> None:
        """Record ``copies`` after the device's work, submit, and map each of ``maps`` once
        that submission is done (WRITE buffers unmapped by then)."""
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
        """After a failure: finish the maps of ``held`` and of every idle buffer, unmap them
        all and forget them (nothing stays mapped)."""
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

    def mapped_buffers(self, mode: int | None = None) -> int:
        """Buffers (of ``mode``) mapped or with a map pending, by our own count (wgpu-native
        lacks wgpuBufferGetMapState)."""
        live = [r() for r in self._made]
        return sum(sb.mapped or sb.req is not None for sb in live
                   if sb is not None and mode in (None, sb.mode))

    def idle_buffers(self, mode: int) -> int:
        """Buffers of ``mode`` waiting in this Staging's pool."""
        with self._lock:
            return sum(len(free) for (m, _), free in self._idle.items() if m == mode)


class TransferPhases:
    """Seconds and counts per phase of staged transfers, to see where a small transfer's time
    goes: ``submit`` (record the copy, flush, request the map), ``fence`` (until the GPU copy is
    done), ``map`` (from then until the buffer is mapped), ``copy`` (host memory to or from the
    mapped buffer), ``peer`` (waiting for the other rank's data)."""

    KEYS = ("submit", "fence", "map", "copy", "peer")

    def __init__(self):
        self.seconds = dict.fromkeys(self.KEYS, 0.0)
        self.calls = dict.fromkeys(self.KEYS, 0)

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] += seconds
        self.calls[key] += 1

    def snapshot(self) -> dict:
        return {k: (self.seconds[k], self.calls[k]) for k in self.KEYS}


def wait_split(st: Staging, sb: StagingBuffer, deadline: float, phases: TransferPhases) -> None:
    """``sb.wait`` with its time split into the fence (a blocking wait for the submission that
    the map follows, where the native API gives its index) and the map itself."""
    if sb.mapped:
        return
    t0 = time.perf_counter()
    req = sb.req
    if getattr(st.api, "native", False) and req is not None and req.index is not None \
            and st.device.blocking_waits and not st.api.is_done(req):
        st.api.wait_index(st.device.wgpu, req.index)
    t1 = time.perf_counter()
    sb.wait(deadline)
    phases.add("fence", t1 - t0)
    phases.add("map", time.perf_counter() - t1)


_STAGING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STAGING_LOCK = threading.Lock()


def staging_of(device) -> Staging:
    """The device's Staging (made on first use)."""
    with _STAGING_LOCK:
        st = _STAGING.get(device)
        if st is None:
            st = _STAGING[device] = Staging(device)
        return st
