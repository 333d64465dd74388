"""The collectives of the processes backend, in rounds on two alternating slot sets per rank
(mixed into ShmTransport): a round is write, barrier, read; an all-reduce round is copy in,
barrier, each rank reduces its slice into rank 0's slot, barrier, copy out. Every round uses the
other set than the last, and a barrier separates any two rounds, so no rank overwrites a slot a
slower rank still reads. Barriers are per-rank counters that only grow."""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from ..host_reduce import reduce_into
from .shm_segment import META_BYTES
from .wire import _HEADER_WORDS, decode_header, encode_header, mismatch_error, split_bounds

# copies and reductions from this size are split over threads: waking the copy threads costs
# hundreds of us on a many-core host, so only large pieces gain (one H200 host, 16 cores, two
# processes: a 4 MB device all-reduce took 2.3 ms unsplit against 3.4 split, 16 MB in two 8 MB
# chunks 8.1 ms split against 8.8; BENCHMARKS.md)
PAR_MIN = 8 << 20
PIECE_MIN = 1 << 16  # elements: the least one copy thread takes
# ranks up to which each reduces the whole chunk from every slot into its own output: for 2
# ranks that moves fewer bytes than reduce-scatter into a slot and copy out (2 reads and 1 write
# per element, not 1.5 + 0.5 + 2) and saves a barrier; beyond, the reads grow with the ranks.
# Not float16: its reduction is bound by numpy's casts, not memory, so a slice each is faster.
# WGRUMUS_SHM_DIRECT_RANKS (read at each call) overrides it (benchmarks/collectives.py --direct)
DIRECT_RANKS = 2
_ARRAY_HDR = _HEADER_WORDS * 8


class SlotRounds:
    """Barrier, collective check and native collectives of a ShmTransport."""

    def _barrier(self, deadline: float, what: str = "barrier") -> None:
        self._barriers += 1
        n = self._barriers
        arrive = self.seg.arrive
        arrive[self.rank] = n
        late = list(range(self.size))

        def ready():
            while late and int(arrive[late[-1]]) >= n:
                late.pop()
            if late and any(self._sends):
                with self._lock:
                    self._progress_sends()
            return not late
        self._wait(ready, deadline, f"rank(s) did not arrive at the {what}", lambda: list(late))

    def native_barrier(self, deadline):
        self._barrier(deadline)

    def _round(self) -> int:
        k = self._rounds
        self._rounds += 1
        return k % 2

    def agree(self, seq: int, name: str, detail: str, deadline: float) -> None:
        """Compare collective ``seq`` on every rank (one round) before data moves."""
        if self.size == 1:
            return
        raw = f"{name}|{detail}".encode()
        if len(raw) > META_BYTES - 8:
            raw = raw[:META_BYTES - 25] + b"#" + hashlib.sha1(raw).hexdigest()[:16].encode()
        par = self._round()
        m = self.seg.meta(par, self.rank)
        m[:] = 0
        m[:len(raw)] = np.frombuffer(raw, np.uint8)
        self._barrier(deadline, "collective check")
        first = bytes(self.seg.meta(par, 0))
        for r in range(1, self.size):
            other = bytes(self.seg.meta(par, r))
            if other != first:
                a, b = (x.rstrip(b"\0").decode(errors="replace").split("|", 1)
                        for x in (first, other))
                raise mismatch_error(seq, self.seg.name, (r, *b), (0, *a))

    def _piece(self, n: int) -> int:
        """Elements per copy thread: this process's share of the cores (the ranks copy at once,
        and more threads than cores only take turns)."""
        share = max(1, (os.cpu_count() or 1) // self.size)
        return max(PIECE_MIN, -(-n // share))

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._par(lambda a, b: np.copyto(dst[a:b], src[a:b]), src.size, src.itemsize)

    def reduce_chunk(self, src: np.ndarray, out: np.ndarray | None, op: str,
                     deadline: float, phases=None) -> None:
        """One all-reduce round: ``out`` (None: only the reduction) gets op over every rank's
        ``src`` (at most a slot's bytes); ``phases``: the barriers' time counted as ``peer``,
        the rest as ``copy``. Up to DIRECT_RANKS ranks (float16: never), each reduces every
        rank's slot straight into its ``out`` (one barrier, no copy out of a shared slot); else
        each reduces its slice into rank 0's slot, and all copy the result out after a second
        barrier."""
        t0 = time.perf_counter()
        n = src.size
        s = self._round()
        views = [self.seg.slot(r, s)[:src.nbytes].view(src.dtype) for r in range(self.size)]
        self._copy(views[self.rank], src)
        t1 = time.perf_counter()
        self._barrier(deadline, "all-reduce")
        t2 = time.perf_counter()
        direct = int(os.environ.get("WGRUMUS_SHM_DIRECT_RANKS", DIRECT_RANKS))
        if out is not None and self.size <= direct and src.dtype != np.float16:
            self._par(lambda a, c: reduce_into(out[a:c], [v[a:c] for v in views], op,
                                               self.size), n, src.itemsize)
            if phases is not None:
                phases.add("copy", (t1 - t0) + (time.perf_counter() - t2))
                phases.add("peer", t2 - t1)
            return
        b = split_bounds(n, self.size)
        lo, hi = b[self.rank], b[self.rank + 1]
        dst = views[0]
        self._par(lambda a, c: reduce_into(dst[lo + a:lo + c], [v[lo + a:lo + c] for v in views],
                                           op, self.size), hi - lo, src.itemsize)
        t3 = time.perf_counter()
        self._barrier(deadline, "all-reduce")
        t4 = time.perf_counter()
        if out is not None:
            self._copy(out, dst)
        if phases is not None:
            phases.add("copy", (t1 - t0) + (t3 - t2) + (time.perf_counter() - t4))
            phases.add("peer", (t2 - t1) + (t4 - t3))

    def gather_chunk(self, src: np.ndarray, out: np.ndarray, deadline: float,
                     phases=None) -> None:
        """One gather round: ``out`` gets every rank's ``src`` (the same size on each) side by
        side in rank order; ``phases`` as for ``reduce_chunk``."""
        t0 = time.perf_counter()
        n = src.size
        s = self._round()
        self._copy(self.seg.slot(self.rank, s)[:src.nbytes].view(src.dtype), src)
        t1 = time.perf_counter()
        self._barrier(deadline, "gather")
        t2 = time.perf_counter()
        for r in range(self.size):
            self._copy(out[r * n:(r + 1) * n], self.seg.slot(r, s)[:src.nbytes].view(src.dtype))
        if phases is not None:
            phases.add("copy", (t1 - t0) + (time.perf_counter() - t2))
            phases.add("peer", t2 - t1)

    def _par(self, fn, n: int, itemsize: int) -> None:
        """fn(lo, hi) over [0, n), split over this rank's share of the cores when large."""
        if n <= 0:
            return
        if n * itemsize >= PAR_MIN:
            from ...runtime.staging import par_ranges
            par_ranges(fn, n, self._piece(n))
        else:
            fn(0, n)

    def _per_chunk(self, dtype) -> int:
        return max(1, self.seg.layout.slot // np.dtype(dtype).itemsize)

    def native_all_reduce(self, arr, op, deadline):
        src = np.ascontiguousarray(arr).reshape(-1)
        out = np.empty_like(src)
        if self.size == 1:
            reduce_into(out, [src], op, 1)
            return out.reshape(np.shape(arr))
        per = self._per_chunk(src.dtype)
        for lo in range(0, src.size, per):
            hi = min(lo + per, src.size)
            self.reduce_chunk(src[lo:hi], out[lo:hi], op, deadline)
        return out.reshape(np.shape(arr))

    def native_reduce(self, arr, op, root, deadline):
        out = self.native_all_reduce(arr, op, deadline)
        return out if self.rank == root else None

    def native_reduce_scatter(self, arr, op, deadline):
        out = self.native_all_reduce(arr, op, deadline)
        b = split_bounds(arr.shape[0], self.size)
        return np.ascontiguousarray(out[b[self.rank]:b[self.rank + 1]])

    def _headers(self, arr, deadline) -> list:
        """Every rank's (dtype, shape) of ``arr`` (None where a rank passed None)."""
        par = self._round()
        m = self.seg.meta(par, self.rank)
        m[:] = 0
        if arr is not None:
            m[:_ARRAY_HDR] = encode_header(arr).view(np.uint8)
        self._barrier(deadline, "header exchange")
        out = []
        for r in range(self.size):
            h = self.seg.meta(par, r)[:_ARRAY_HDR].view(np.int64)
            out.append(decode_header(h) if int(h[0]) else None)
        return out

    def native_broadcast(self, arr, root, deadline):
        mine = np.ascontiguousarray(arr) if self.rank == root else None
        dtype, shape = self._headers(mine, deadline)[root]
        out = np.array(mine, copy=True) if mine is not None else np.empty(shape, dtype)
        flat = out.reshape(-1).view(np.uint8)
        step = self.seg.layout.slot
        for lo in range(0, flat.size, step):
            hi = min(lo + step, flat.size)
            s = self._round()
            slot = self.seg.slot(root, s)
            if self.rank == root:
                self._copy(slot[:hi - lo], flat[lo:hi])
            self._barrier(deadline, "broadcast")
            if self.rank != root:
                self._copy(flat[lo:hi], slot[:hi - lo])
        return out

    def native_all_gather(self, arr, deadline):
        arr = np.ascontiguousarray(arr)
        heads = self._headers(arr, deadline)
        sizes = [int(np.prod(sh, dtype=np.int64)) * dt.itemsize for dt, sh in heads]
        out = np.empty((sum(sh[0] for _, sh in heads),) + arr.shape[1:], arr.dtype)
        flat, mine = out.reshape(-1).view(np.uint8), arr.reshape(-1).view(np.uint8)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        step = self.seg.layout.slot
        for lo in range(0, max(sizes), step):
            s = self._round()
            if lo < mine.size:
                hi = min(lo + step, mine.size)
                self._copy(self.seg.slot(self.rank, s)[:hi - lo], mine[lo:hi])
            self._barrier(deadline, "all-gather")
            for r, n in enumerate(sizes):
                if lo < n:
                    hi = min(lo + step, n)
                    self._copy(flat[starts[r] + lo:starts[r] + hi],
                               self.seg.slot(r, s)[:hi - lo])
        return out

    # ----- device tensors -----
    def native_shared(self, nbytes: int) -> bool:
        """All-reduces of every size go through the shared slots."""
        return True

    def device_chunk_bytes(self) -> int:
        """Bytes per chunk of a device all-reduce: a slot, or WGRUMUS_SHM_CHUNK where smaller
        (smaller chunks overlap download, host step and upload within one message;
        benchmarks/collectives.py --chunks)."""
        slot = self.seg.layout.slot
        return min(slot, int(os.environ.get("WGRUMUS_SHM_CHUNK", "0")) or slot)

    def device_all_reduce(self, src, dst, op, deadline, early=None) -> bool:
        """All-reduce BufferSlice ``src`` into ``dst``: chunks downloaded to mapped staging are
        reduced from there through the slots and uploaded, overlapping the next download
        (``early``: the first downloads, issued already by the caller)."""
        from ..staged_collectives import all_reduce
        all_reduce(src, _SlotExchange(self), self.rank, op, dst=dst,
                   chunk_bytes=self.device_chunk_bytes(), early=early)
        return True


class _SlotExchange:
    """The pipelined staging engine's barrier, over a transport's slots (one round a chunk):
    all-reduce rounds, and gathers (float16 sums on the device)."""
    gathers = True

    def __init__(self, t):
        from .shm_device import _phases
        self.t = t
        self.phases = _phases(t)

    @property
    def timeout(self) -> float:
        return self.t.timeout

    @property
    def world_size(self) -> int:
        return self.t.size

    def abort(self, err) -> None:
        """(A local failure: the process group publishes it.)"""

    def exchange(self, length, dtype, rank, item, item_at, out, out_at, op) -> None:
        deadline = time.monotonic() + self.t.timeout
        if op is None:  # a gather: each item at rank x its size, out the whole space
            self.t.gather_chunk(item, out, deadline, self.phases)
        else:
            self.t.reduce_chunk(item, out, op, deadline, self.phases)

