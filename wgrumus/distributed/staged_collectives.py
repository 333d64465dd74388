"""Device collectives through pipelined staging (CommThread, the thread backend, the processes'
shared slots). WebGPU has no peer-to-peer path between adapters, so data goes device -> mapped
staging -> host -> staging -> device in chunks: chunk k+1's download (``inflight`` queued), chunk
k's host step (one ``exchange`` round of the barrier on the mapped memory in place) and chunk
k-1's upload overlap. An asynchronous call's first downloads are issued by its caller
(``EarlyDownload``); float16 sums are added on the device (``_DeviceSum``). A failure unmaps what
the call holds and breaks the barrier."""
from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass

import numpy as np

from .errors import CollectiveError
from .host_reduce import check_op

# Large enough to hide a chunk's two maps, submit and barrier round: on the H100 host 16 MB
# chunks ran a 64 MB all-reduce at 5.5 GB/s, 2 MB at 2.0 (BENCHMARKS.md, 2026-11-24).
CHUNK_BYTES = 16 << 20
# Downloads queued ahead: this many bytes' worth, so small chunks keep the link as busy.
INFLIGHT_BYTES = 48 << 20
INFLIGHT = 3
MAX_INFLIGHT = 12
# Bytes of downloads issued early (EarlyDownload) and not yet taken over, per device: past it a
# call leaves its downloads to the communication thread, so a backlog of queued calls (a large
# model's gradient buckets) does not hold a staged copy of all of them.
EARLY_BYTES = 64 << 20
_early: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device -> such bytes
_early_lock = threading.Lock()
# float16 all-reduces over up to this many ranks are summed on the device (_DeviceSum): each
# rank uploads every rank's chunk, so beyond a few ranks the uploads outgrow the saving.
# WGRUMUS_DEVICE_SUM_RANKS (read at each call; 0: always on the host) overrides it.
DEVICE_SUM_RANKS = 4


@dataclass(frozen=True)
class _Chunk:
    """One round's space (elements), this rank's download into it ((src byte offset, bytes), at
    element item_at) and upload from it ((dst byte offset, bytes), from out_at)."""
    length: int
    down: tuple | None
    item_at: int
    up: tuple | None
    out_at: int


def _spans(length: int, chunk_bytes: int | None, dtype) -> list[tuple]:
    """Element ranges of ``chunk_bytes`` (None: CHUNK_BYTES at call time); one empty for none."""
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    chunk = max(256, chunk_bytes // 256 * 256) // np.dtype(dtype).itemsize
    return [(c, min(c + chunk, length)) for c in range(0, length, chunk)] or [(0, 0)]


def inflight_of(chunk_bytes: int, inflight: int | None = None) -> int:
    """Chunk downloads in flight for ``chunk_bytes`` chunks (``inflight``: as given)."""
    if inflight is not None:
        return max(1, int(inflight))
    return max(INFLIGHT, min(MAX_INFLIGHT, INFLIGHT_BYTES // max(1, chunk_bytes)))


def _all_reduce_chunks(src, chunk_bytes) -> list:
    isz = src.dtype.itemsize
    return [_Chunk(c1 - c0, (c0 * isz, (c1 - c0) * isz), 0, (c0 * isz, (c1 - c0) * isz), 0)
            if c1 > c0 else _Chunk(0, None, 0, None, 0)
            for c0, c1 in _spans(src.nbytes // isz, chunk_bytes, src.dtype)]


class EarlyDownload:
    """The first chunks' downloads of an all-reduce of BufferSlice ``src``, recorded by the
    thread that produced the data, in order right after its work: the communication thread
    would submit them only when it gets to the call, behind whatever the device was given
    meanwhile (a weight gradient, the next chunk's matmul), and the host part would wait for
    all of it. ``all_reduce(..., early=)`` takes them over; ``release()`` frees them if it never
    does (a failure first). At most EARLY_BYTES wait per device; past that, none are issued."""

    def __init__(self, src, chunk_bytes: int | None = None, inflight: int | None = None):
        from ..runtime.staging import staging_of  # (wgpu loads only once devices are used)
        self.src = src
        self.chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        chunks = _all_reduce_chunks(src, self.chunk_bytes)
        n = min(len(chunks), inflight_of(chunks[0].length * src.dtype.itemsize, inflight))
        dev = src.device
        with _early_lock:
            held = _early.get(dev, 0)
            while n and held + sum(c.down[1] for c in chunks[:n] if c.down) > EARLY_BYTES:
                n -= 1
            self.nbytes = sum(c.down[1] for c in chunks[:n] if c.down)
            _early[dev] = held + self.nbytes
        self.issued = n
        self._st = st = staging_of(dev)
        self._reads: deque | None = deque()
        copies = []
        try:
            for i, c in enumerate(chunks[:n]):
                if c.down is not None:
                    r = st.reader(c.down[1])
                    self._reads.append((i, r))
                    copies.append((src.buffer, src.offset + c.down[0], r.buffer, 0, c.down[1]))
            if copies:
                st.submit(copies, [r for _, r in self._reads])
        except BaseException:
            self.release()
            raise

    def _done(self) -> deque | None:
        reads, self._reads = self._reads, None
        if reads is not None:
            with _early_lock:
                _early[self.src.device] -= self.nbytes
        return reads

    def take(self) -> deque:
        """The downloads in flight, (chunk index, StagingBuffer) in order; once."""
        reads = self._done()
        if reads is None:
            raise RuntimeError("these early downloads were already taken or released")
        return reads

    def release(self, timeout: float = 10.0) -> None:
        """Unmap and forget what was not taken (nothing, once ``all_reduce`` took it)."""
        reads = self._done()
        if reads:
            self._st.discard([r for _, r in reads], timeout)


def all_reduce(src, barrier, rank: int, op: str = "mean", dst=None,
               chunk_bytes: int | None = None, inflight: int | None = None,
               early: EarlyDownload | None = None) -> None:
    """All-reduce every participant's BufferSlice ``src`` into its ``dst`` (default: in place);
    ``early``: its first downloads, already issued (their chunk size then applies)."""
    dst = src if dst is None else dst
    if dst.device is not src.device or dst.nbytes != src.nbytes or dst.dtype != src.dtype:
        raise ValueError(f"dst ({dst.nbytes} bytes of {dst.dtype} on {dst.device!r}) must match "
                         f"src ({src.nbytes} bytes of {src.dtype} on {src.device!r})")
    check_op(op, src.dtype)
    if early is not None:
        e = early.src
        if (e.device, e.buffer, e.offset, e.nbytes) != (src.device, src.buffer, src.offset,
                                                        src.nbytes):
            raise ValueError("the early downloads were issued for another buffer slice")
        chunk_bytes = early.chunk_bytes
    chunks = _all_reduce_chunks(src, chunk_bytes)
    summed = None
    most = int(os.environ.get("WGRUMUS_DEVICE_SUM_RANKS", DEVICE_SUM_RANKS))
    if src.dtype == np.float16 and op in ("sum", "mean") and getattr(barrier, "gathers", False) \
            and 2 <= barrier.world_size <= most and src.nbytes:
        summed = _DeviceSum(dst, barrier.world_size, op, chunks[0].length)
    _run(barrier, rank, src.dtype, op, chunks, src, dst, inflight, early, summed)


class _Borrowed:
    """The storage of a buffer owned elsewhere (a BufferSlice's), for kernels to write into."""
    __slots__ = ("buffer", "device", "version")

    def __init__(self, device, buffer):
        self.device, self.buffer, self.version = device, buffer, 0


class _DeviceSum:
    """A float16 all-reduce summed on the device, not the host: numpy casts float16 at well under
    memory speed (~0.5 G values/s a core), so each round gathers every rank's chunk (plain
    copies) into one upload, and the device adds them in float32 in rank order (the same bits
    on every rank), rounding once, as the host reduction does."""

    def __init__(self, dst, world: int, op: str, length: int):
        from ..runtime.buffer_view import View, float16
        self.world, self.mean, self.dst = world, op == "mean", dst
        self.parts = View.empty((world * length,), dst.device, float16)
        self._out = _Borrowed(dst.device, dst.buffer)

    def upload(self, w, nbytes: int) -> tuple:
        """The copy of every rank's ``nbytes`` chunk from staging ``w`` into the parts."""
        return (w.buffer, 0, self.parts.buffer, 0, self.world * nbytes)

    def add(self, c: _Chunk) -> None:
        """Record dst's chunk ``c`` = the sum (or mean) of the uploaded parts."""
        from ..kernels.map import run_map
        from ..runtime.buffer_view import View, float16, float32
        n, dev = c.length, self.dst.device
        parts = [View(self.parts.storage, (n,), None, r * n, float16) for r in range(self.world)]
        out = View(self._out, (n,), None, (self.dst.offset + c.up[0]) // 2, float16)
        if self.world > 3:  # a map reads three inputs: the first three summed ahead
            acc = View.empty((n,), dev, float32)
            run_map("f32(a) + f32(b) + f32(c)", acc, parts[:3])
            terms = [acc, parts[3]]
        else:
            terms = parts
        expr = " + ".join(f"f32({x})" for x in "abc"[:len(terms)])
        if self.mean:
            run_map(f"({expr}) / k", out, terms, scalars={"k": float(self.world)})
        else:
            run_map(expr, out, terms)


def reduce_scatter(src, dst, barrier, rank: int, parts, op: str = "sum",
                   chunk_bytes: int | None = None, inflight: int | None = None) -> None:
    """Elements [parts[rank], parts[rank+1]) of the reduced ``src`` into this rank's ``dst``."""
    check_op(op, src.dtype)
    chunks = _scatter_gather("reduce_scatter", dst, src, rank, parts, chunk_bytes)
    _run(barrier, rank, src.dtype, op, [_Chunk(c.length, c.up, c.out_at, c.down, c.item_at)
                                        for c in chunks], src, dst, inflight)


def all_gather(src, dst, barrier, rank: int, parts, chunk_bytes: int | None = None,
               inflight: int | None = None) -> None:
    """Every rank's ``src`` side by side in each rank's ``dst`` (rank r's at parts[r])."""
    chunks = _scatter_gather("all_gather", src, dst, rank, parts, chunk_bytes)
    _run(barrier, rank, src.dtype, None, chunks, src, dst, inflight)


def _scatter_gather(name, part, whole, rank, parts, chunk_bytes) -> list:
    """All-gather's chunks (reduce-scatter's, directions swapped): this rank downloads its
    ``part`` where a chunk holds some, and uploads every chunk into ``whole``."""
    isz = part.dtype.itemsize
    lo, hi = parts[rank], parts[rank + 1]
    if part.nbytes != (hi - lo) * isz or whole.nbytes != parts[-1] * isz:
        raise ValueError(f"{name}: this rank's part holds {part.nbytes} bytes and the whole "
                         f"{whole.nbytes}; parts {list(parts)} need {(hi - lo) * isz} and "
                         f"{parts[-1] * isz}")
    chunks = []
    for c0, c1 in _spans(parts[-1], chunk_bytes, part.dtype):
        a, b = max(c0, lo), min(c1, hi)
        mine = ((a - lo) * isz, (b - a) * isz) if a < b else None
        chunks.append(_Chunk(c1 - c0, mine, a - c0 if mine else 0,
                             (c0 * isz, (c1 - c0) * isz) if c1 > c0 else None, 0))
    return chunks


def broadcast(buf, barrier, rank: int, root: int, chunk_bytes: int | None = None,
              inflight: int | None = None) -> None:
    """Copy the root's ``buf`` into every other rank's ``buf`` (same size and dtype)."""
    isz = buf.dtype.itemsize
    chunks = []
    for c0, c1 in _spans(buf.nbytes // isz, chunk_bytes, buf.dtype):
        span = (c0 * isz, (c1 - c0) * isz) if c1 > c0 else None
        chunks.append(_Chunk(c1 - c0, span if rank == root else None, 0,
                             None if rank == root else span, 0))
    _run(barrier, rank, buf.dtype, None, chunks, buf, buf, inflight)


def early_bytes(device) -> int:
    """Bytes of ``device``'s downloads issued early and not yet taken over or released."""
    with _early_lock:
        return _early.get(device, 0)


def _run(barrier, rank, dtype, op, chunks, src, dst, inflight, early=None,
         summed: _DeviceSum | None = None) -> None:
    """The pipeline over ``chunks``: downloads ``inflight`` ahead, a round and upload each
    (``early``: the first downloads, issued already; ``summed``: the rounds gather every rank's
    chunk and the device sums them)."""
    for c in chunks:
        for part in (c.down, c.up):
            if part is not None and (part[0] % 4 or part[1] % 4):
                raise ValueError(f"a piece at byte {part[0]} of {part[1]} bytes: staged copies "
                                 "move 4-byte aligned multiples of 4 bytes")
    # imported here: wgpu loads only once devices are used
    from ..runtime.staging import staging_of, wait_split
    st = staging_of(src.device)
    ph = getattr(barrier, "phases", None)  # TransferPhases where the barrier keeps them

    def submit(copies, maps):
        t0 = time.perf_counter()
        st.submit(copies, maps)
        if ph is not None:
            ph.add("submit", time.perf_counter() - t0)
    inflight = min(len(chunks), inflight_of(chunks[0].length * np.dtype(dtype).itemsize,
                                            inflight))
    # (chunk index, StagingBuffer): downloads in flight, in order
    reads: deque = early.take() if early is not None else deque()
    w = None
    nxt = early.issued if early is not None else 0  # the next chunk to download

    def refill(copies, maps, upto):
        nonlocal nxt
        while nxt < len(chunks) and len(reads) < upto:
            c = chunks[nxt]
            if c.down is not None:
                r = st.reader(c.down[1])
                reads.append((nxt, r))
                copies.append((src.buffer, src.offset + c.down[0], r.buffer, 0, c.down[1]))
                maps.append(r)
            nxt += 1

    try:
        for depth in range(1, inflight + 1):  # one submit each: maps resolve one by one
            copies, maps = [], []
            refill(copies, maps, depth)
            if copies:
                submit(copies, maps)
        for c in chunks:
            deadline = time.monotonic() + barrier.timeout
            r = None
            if c.down is not None:
                r = reads[0][1]
                if ph is not None:
                    wait_split(st, r, deadline, ph)
                else:
                    r.wait(deadline)
            if c.up is not None:
                t0 = time.perf_counter()
                w = st.writer(c.up[1] * (summed.world if summed else 1), deadline,
                              spare=inflight)
                if ph is not None:
                    ph.add("map", time.perf_counter() - t0)
            _exchange(barrier, rank, c, r, w, dtype, op, summed)
            if r is not None:
                reads.popleft()
                r.unmap()
                st.give_back(r)
            copies, maps = [], []
            if w is not None:
                w.unmap()
                copies.append(summed.upload(w, c.up[1]) if summed else
                              (w.buffer, 0, dst.buffer, dst.offset + c.up[0], c.up[1]))
                maps.append(w)
            refill(copies, maps, inflight)  # chunk k's upload, later chunks' downloads
            if copies:
                submit(copies, maps)
            if w is not None:
                st.give_back(w)
                w = None
                if summed:
                    summed.add(c)  # recorded after the upload, before the next one
    except BaseException as e:
        if not isinstance(e, CollectiveError):
            barrier.abort(e)  # the other ranks must not wait for this one
        st.discard([*(r for _, r in reads), w], barrier.timeout)
        raise


def _exchange(barrier, rank, c: _Chunk, r, w, dtype, op, summed=None) -> None:
    """One barrier round over the mapped chunk; the views die before the buffers unmap.
    ``summed``: a gather, every rank's chunk side by side in rank order in ``w``."""
    item = r.array(dtype, c.down[1]) if r is not None else None
    try:
        if summed:
            out = w.array(dtype, summed.world * c.up[1])
            barrier.exchange(summed.world * c.length, dtype, rank, item, rank * c.length, out,
                             0, None)
        else:
            out = w.array(dtype, c.up[1]) if w is not None else None
            barrier.exchange(c.length, dtype, rank, item, c.item_at, out, c.out_at, op)
    finally:
        item = out = None
