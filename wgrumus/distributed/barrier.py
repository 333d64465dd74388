"""CollectiveBarrier: an in-process rendezvous that reduces one array per participant, round after
round. The arrival that fills a round swaps in a fresh round before anyone leaves, so a fast
participant coming straight back never reads the previous round's result (the original design's
defect). A round is reduced once, in rank order (bits independent of arrival order), large ones in
chunks claimed lock-free by the participants and helper threads (numpy releases the GIL). A
missing participant or ``abort`` breaks the barrier for good with a CollectiveError."""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import time
import weakref
from collections import deque

import numpy as np

from .errors import CollectiveError

REDUCE_OPS = ("sum", "mean", "max", "min")
_UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
CHUNK_BYTES = 1 << 20       # a chunk fits in L2 and still amortises the per-chunk bookkeeping
PARALLEL_MIN_BYTES = 1 << 19  # below this one thread is faster than waking the others
SPLIT_MIN_BYTES = 1 << 17     # large rounds are cut into at least one piece per thread, to here
MAX_REDUCE_THREADS = 12  # a 2-rank round at 10 GB/s moves ~40 GB/s of memory; a core ~10 GB/s
# A helper joins a round per this many bytes: waking one costs about what it reduces of a few MB
# (H100 host, BENCHMARKS.md: 4 MB rounds 5.0 GB/s with no helper, 3.4 with ten).
HELPER_BYTES = 4 << 20
# A participant about to block first polls this long (no wake latency on the critical path); off:
# on the 2-core CI machine polling 50 us made 4 KiB rounds 38 -> 50 us (BENCHMARKS.md).
SPIN_S = 0.0
HELPER_IDLE_S = 10.0  # a helper with no round for this long ends (started again when needed)
HELPER_JOIN_S = 5.0  # close() waits this long for each helper to finish its chunk


def _spin(ready) -> bool:
    """Poll ``ready()`` for up to SPIN_S (the GIL is released between polls); its last value."""
    end = time.perf_counter() + SPIN_S
    while not ready():
        if time.perf_counter() >= end:
            return False
        time.sleep(0)
    return True


class _Helpers:
    """A barrier's daemon threads that claim chunks of large rounds, each woken by a release of
    its own lock; no reference to the barrier, so a dropped barrier is collected."""

    def __init__(self, count: int, name: str):
        self.count, self.name = count, name
        self.lock = threading.Lock()
        self.closed = False
        self.threads: list = [None] * count
        self.go = [threading.Lock() for _ in range(count)]
        for g in self.go:
            g.acquire()
        self.jobs = [deque() for _ in range(count)]

    def run(self, k: int, job) -> None:
        """Hand ``job`` (a callable) to helpers 0..k-1, starting those that are not running."""
        with self.lock:
            if self.closed:
                return
            for j in range(k):
                if self.threads[j] is None:
                    t = threading.Thread(target=self._loop, args=(j,), daemon=True,
                                         name=f"{self.name}-{j}")
                    self.threads[j] = t
                    t.start()
                self.jobs[j].append(job)
                with contextlib.suppress(RuntimeError):  # already signalled: it takes every job
                    self.go[j].release()

    def close(self, join: bool = True) -> None:
        """Stop every helper (one mid-chunk finishes it first); ``join``: wait for them."""
        with self.lock:
            self.closed = True
            threads = [t for t in self.threads if t is not None]
            for j in range(self.count):
                self.jobs[j].clear()
                with contextlib.suppress(RuntimeError):
                    self.go[j].release()
        me = threading.current_thread()
        for t in threads if join else ():
            if t is not me:
                t.join(HELPER_JOIN_S)

    def _loop(self, j: int) -> None:
        go, jobs = self.go[j], self.jobs[j]
        while True:
            if not go.acquire(timeout=HELPER_IDLE_S):
                with self.lock:  # idle: end, unless a job came in just now
                    if not go.acquire(blocking=False):
                        self.threads[j] = None
                        return
            if self.closed:
                return
            while jobs:
                try:
                    jobs.popleft()()
                except IndexError:
                    break


def check_op(op: str, dtype) -> None:
    """Reject unknown ops, and ``mean`` of integers (it has no exact integer result)."""
    if op not in _UFUNCS:
        raise ValueError(f"unknown reduce op {op!r}; use one of {', '.join(REDUCE_OPS)}")
    if op == "mean" and not np.issubdtype(np.dtype(dtype), np.inexact):
        raise TypeError(f"op='mean' needs a floating dtype, got {np.dtype(dtype)}; "
                        "use op='sum' and divide, or convert to float first")


REDUCE_TILE = 1 << 15  # elements a reduction takes at once: its accumulators stay in L2


def reduce_into(out: np.ndarray, inputs, op: str, divisor: int) -> None:
    """out = op(inputs[0], inputs[1], ...) left to right, then / divisor for mean. ``out`` is
    only written, never read (it may be mapped upload memory, which reads back slowly) and may
    be ``inputs[0]`` itself. More than two inputs, mean and float16 go tile by tile through a
    cached accumulator, so that each tile is reduced over every input while it is in cache (one
    pass over memory, not one per input); float16 is reduced in float32 and rounded once
    (numpy's float16 arithmetic rounds at every step, and is slower than its casts)."""
    ufunc = _UFUNCS[op]
    k = len(inputs)
    mean = op == "mean" and divisor != 1
    wide = out.dtype == np.float16
    if not mean and k <= 2:  # numpy's float16 loops add each pair in float32, rounding once
        if k == 1:
            np.copyto(out, inputs[0])
        else:
            ufunc(inputs[0], inputs[1], out=out)
        return
    if out.ndim != 1:
        out, inputs = out.reshape(-1), [np.reshape(a, -1) for a in inputs]
    n = out.shape[0]
    if n == 0:
        return
    acc_t = np.float32 if wide else out.dtype
    acc = np.empty(min(n, REDUCE_TILE), acc_t)
    wider = np.empty_like(acc) if wide and k > 1 else None
    last = k - 1 if not (wide or mean) else k  # the input whose op writes out itself
    for lo in range(0, n, REDUCE_TILE):
        hi = min(n, lo + REDUCE_TILE)
        o, dst = acc[:hi - lo], out[lo:hi]
        if wide:
            np.copyto(o, inputs[0][lo:hi])
        elif k == 1:
            np.copyto(o, inputs[0][lo:hi])
        for i in range(1, k):
            a = inputs[i][lo:hi]
            if wide:
                w = wider[:hi - lo]
                np.copyto(w, a)  # numpy's float16 -> float32 cast, then a float32 op
                a = w
            first = inputs[0][lo:hi] if i == 1 and not wide else o
            ufunc(first, a, out=dst if i == last else o)
        if mean:
            np.divide(o, divisor, out=o if wide else dst)
        if wide:
            np.copyto(dst, o, casting="same_kind")


class _Round:
    """One generation of the barrier: who arrived, with what, and the result once reduced."""

    def __init__(self, gen: int, world_size: int):
        self.gen = gen
        self.items: list = [None] * world_size
        self.outs: list = [None] * world_size
        self.arrived: list[int] = []
        self.kind = self.op = self.ranked = self.shape = self.dtype = None
        self.full = self.done = False
        self.result = self.out = self.flats = None
        self.copies: list = []
        self.shared = True
        self.claims = self.started = self.ended = None  # split rounds: see _split
        self.nchunks = self.chunk = self.length = self.nbytes = 0
        self.item_at: list = [0] * world_size  # exchange rounds: where items and outs sit
        self.out_at: list = [0] * world_size


class CollectiveBarrier:
    """Reusable rendezvous of ``world_size`` participants (threads) with a round counter."""

    def __init__(self, world_size: int, timeout: float = 60.0, chunk_bytes: int = CHUNK_BYTES,
                 helpers: int | None = None):
        """``helpers``: extra reducing threads (default: spare cores up to MAX_REDUCE_THREADS)."""
        if int(world_size) < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.world_size = int(world_size)
        self.timeout = float(timeout)
        self.chunk_bytes = max(4096, int(chunk_bytes))
        if helpers is None:
            helpers = min(MAX_REDUCE_THREADS, os.cpu_count() or 1) - self.world_size
        self.helpers = max(0, min(int(helpers), MAX_REDUCE_THREADS))
        self._cond = threading.Condition()
        self._round = _Round(0, self.world_size)
        self._broken: CollectiveError | None = None
        self._gone: set = set()
        self._helpers = _Helpers(self.helpers, "wgrumus-reduce")
        weakref.finalize(self, self._helpers.close, False)

    @property
    def generation(self) -> int:
        """Number of rounds that have filled so far."""
        return self._round.gen

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def reduce(self, array, op: str = "mean", rank: int | None = None,
               timeout: float | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Join this round with ``array``; return the reduction (a shared read-only array, or
        written into ``out``, which may be ``array``). ``rank`` orders the inputs and names the
        missing ones on a timeout; all or none of a round's participants pass it."""
        arr = np.ascontiguousarray(array)
        check_op(op, arr.dtype)
        if out is not None and not (isinstance(out, np.ndarray) and out.shape == arr.shape and
                                    out.dtype == arr.dtype and out.flags.writeable and
                                    out.flags.c_contiguous):
            raise ValueError(f"out must be a writeable C-contiguous {arr.dtype} array of shape "
                             f"{arr.shape}")
        rnd = self._meet(timeout, "reduce", op, arr, rank, out)
        return out if out is not None else rnd.result

    def exchange(self, length: int, dtype, rank: int, item=None, item_at: int = 0, out=None,
                 out_at: int = 0, op: str | None = None, timeout: float | None = None) -> None:
        """One round over ``length`` elements in which each participant brings part of the input
        and takes ``[out_at, out_at + out.size)`` of the result (the device collectives' step).
        With ``op`` every item covers the space and is reduced; without, the items are disjoint
        pieces that tile it. Outputs are written, never read (mapped staging memory)."""
        if op is not None:
            check_op(op, dtype)
        dtype = np.dtype(dtype)
        for name, a, at in (("item", item, item_at), ("out", out, out_at)):
            if a is not None and not (isinstance(a, np.ndarray) and a.ndim == 1 and
                                      a.dtype == dtype and a.flags.c_contiguous and
                                      0 <= at and at + a.size <= length):
                raise ValueError(f"{name} must be a contiguous 1-D {dtype} array inside the "
                                 f"{length}-element space (at {at}, size "
                                 f"{getattr(a, 'size', '?')})")
        if out is not None and not out.flags.writeable:
            raise ValueError("out must be writeable")
        if op is not None and item is not None and (item_at or item.size != length):
            raise ValueError(f"with op={op!r} every item covers the whole space ({length} "
                             f"elements), got {item.size} at {item_at}")
        self._meet(timeout, "exchange", op or "copy", (item, item_at, out, out_at), rank,
                   shape=(int(length),), dtype=dtype)

    def gather(self, obj, rank: int | None = None, timeout: float | None = None,
               tag: str | None = None) -> list:
        """Every participant's object (shared, not copied); all pass the same ``tag``."""
        return list(self._meet(timeout, "gather", tag, obj, rank).result)

    def wait(self, rank: int | None = None, timeout: float | None = None) -> int:
        """Plain barrier: return once every participant arrived; returns the round number."""
        return self._meet(timeout, "wait", None, None, rank).gen

    def close(self) -> None:
        """End the helper threads (rounds after this run on the participants alone)."""
        self._helpers.close()

    def abort(self, exc: BaseException | None = None) -> None:
        """Break the barrier: every current and future participant raises CollectiveError."""
        if isinstance(exc, CollectiveError):
            err = exc
        else:
            err = CollectiveError(f"CollectiveBarrier aborted: {exc!r}" if exc is not None
                                  else "CollectiveBarrier aborted")
            err.__cause__ = exc
        with self._cond:
            self._break(err)

    def mark_gone(self, rank: int) -> None:
        """Rank ``rank``'s thread ended: fail the rounds that wait on it now, not at the timeout."""
        with self._cond:
            self._gone.add(rank)
            if self._round.arrived:
                self._break(self._gone_error(self._round))
            self._cond.notify_all()

    def _meet(self, timeout, kind, op, item, rank, out=None, **kw) -> _Round:
        """Join the current round, wait until every participant has, help reduce it."""
        t = self.timeout if timeout is None else float(timeout)
        if not t > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        deadline = time.monotonic() + t
        with self._cond:
            rnd = self._join(kind, op, item, rank, out, **kw)
            self._wait_full(rnd, deadline, t)
        if not rnd.done:
            self._help_reduce(rnd, time.monotonic() + t, t)
        return rnd

    def _join(self, kind, op, item, rank, out=None, shape=None, dtype=None) -> _Round:
        self._raise_if_broken()
        rnd = self._round
        ranked = rank is not None
        if ranked and not (isinstance(rank, (int, np.integer)) and 0 <= rank < self.world_size):
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")
        who = f"rank {rank}" if ranked else f"participant #{len(rnd.arrived)}"
        problem = None
        if kind == "reduce":
            shape, dtype = item.shape, item.dtype
        if not rnd.arrived:
            rnd.kind, rnd.op, rnd.ranked = kind, op, ranked
            rnd.shape, rnd.dtype = shape, dtype
        elif rnd.ranked != ranked:
            problem = "some participants passed rank= and others did not"
        elif rnd.kind != kind or rnd.op != op:
            problem = (f"{who} called {kind}({op or ''}) while others called "
                       f"{rnd.kind}({rnd.op or ''})")
        elif kind in ("reduce", "exchange") and (shape != rnd.shape or dtype != rnd.dtype):
            problem = (f"{who} passed shape {shape} dtype {dtype}, others "
                       f"shape {rnd.shape} dtype {rnd.dtype}")
        elif ranked and rank in rnd.arrived:
            problem = f"rank {rank} joined twice"
        if problem is None and self._gone:
            raise self._break(self._gone_error(rnd))
        if problem is not None:
            raise self._break(CollectiveError(f"CollectiveBarrier round {rnd.gen}: {problem}",
                                              rank=rank if ranked else None))
        slot = rank if ranked else len(rnd.arrived)
        if kind == "exchange":
            item, rnd.item_at[slot], out, rnd.out_at[slot] = item
        rnd.items[slot] = item
        rnd.outs[slot] = out
        rnd.arrived.append(slot)
        if len(rnd.arrived) == self.world_size:
            self._fill(rnd)
        return rnd

    def _wait_full(self, rnd: _Round, deadline: float, timeout: float) -> None:
        """Until every participant joined ``rnd`` (called holding the lock)."""
        if not rnd.full and SPIN_S > 0:
            self._cond.release()
            try:
                _spin(lambda: rnd.full or self._broken is not None)
            finally:
                self._cond.acquire()
        while not rnd.full:
            self._raise_if_broken()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._break(self._missing_error(rnd, timeout))
            self._cond.wait(remaining)

    def _fill(self, rnd: _Round) -> None:
        """The round is complete: start the next one, then reduce (or hand out) this one."""
        rnd.full = True
        self._round = _Round(rnd.gen + 1, self.world_size)
        if rnd.kind == "exchange":
            self._fill_exchange(rnd)
            return
        if rnd.kind != "reduce":
            rnd.result, rnd.done = rnd.items, True
            self._cond.notify_all()
            return
        flats = [a.reshape(-1) for a in rnd.items]
        outs = [o.reshape(-1) for o in rnd.outs if o is not None]
        if len(outs) == self.world_size:  # everyone brought an output: reduce into each
            out, rnd.copies, rnd.shared = outs[0], outs, False
        else:
            out, rnd.copies = np.empty(flats[0].size, dtype=rnd.dtype), outs
        rnd.out, rnd.flats = out, flats
        self._split(rnd, out.size, out.nbytes)

    def _split(self, rnd: _Round, length: int, nbytes: int) -> None:
        """Reduce a small round at once; cut a large one into chunks for every thread."""
        rnd.length, rnd.nbytes = length, nbytes
        nchunks = max(1, math.ceil(nbytes / self.chunk_bytes))
        if nbytes >= PARALLEL_MIN_BYTES and self.world_size > 1:
            threads = self.world_size + self.helpers
            nchunks = max(nchunks, self.world_size, min(threads, nbytes // SPLIT_MIN_BYTES))
        if nchunks == 1:
            self._reduce_chunk(rnd, 0, length)
            self._finish(rnd)
        else:
            rnd.nchunks = nchunks
            rnd.chunk = math.ceil(length / nchunks)
            rnd.claims = itertools.count()  # chunk indices handed out (atomic under the GIL)
            rnd.started, rnd.ended = [], []  # chunks being or been reduced; done or given up
            wanted = nbytes // HELPER_BYTES  # waking a thread costs more than a small share
            k = min(self.helpers, nchunks - self.world_size, wanted)
            if k > 0:
                self._helpers.run(k, lambda: self._helper(rnd))
        self._cond.notify_all()

    def _fill_exchange(self, rnd: _Round) -> None:
        length = rnd.shape[0]
        if rnd.op == "copy":  # the pieces must tile the space
            spans = sorted((rnd.item_at[r], a.size) for r, a in enumerate(rnd.items)
                           if a is not None and a.size)
            at = 0
            for lo, n in spans:
                if lo != at:
                    break
                at += n
            if at != length or sum(n for _, n in spans) != length:
                raise self._break(CollectiveError(
                    f"CollectiveBarrier round {rnd.gen}: the pieces (at, size) {spans} do not "
                    f"cover the {length}-element space exactly once"))
        elif length and any(a is None for a in rnd.items):
            raise self._break(CollectiveError(f"CollectiveBarrier round {rnd.gen}: a {rnd.op} "
                                              "exchange needs an item from every participant"))
        rnd.shared = False
        self._split(rnd, length, length * rnd.dtype.itemsize)

    def _helper(self, rnd: _Round) -> None:
        with contextlib.suppress(Exception):  # the barrier is broken; participants report it
            self._help_reduce(rnd, time.monotonic() + self.timeout, self.timeout, wait=False)

    def _reduce_chunk(self, rnd: _Round, lo: int, hi: int) -> None:
        """Reduce elements [lo, hi) once, then write them to the outputs while cached."""
        if rnd.kind == "exchange":
            self._exchange_chunk(rnd, lo, hi)
            return
        inputs = [f[lo:hi] for f in rnd.flats]
        if rnd.shared:
            reduce_into(rnd.out[lo:hi], inputs, rnd.op, self.world_size)
            for o in rnd.copies:
                np.copyto(o[lo:hi], rnd.out[lo:hi])
            return
        tmp = np.empty(hi - lo, rnd.out.dtype)
        reduce_into(tmp, inputs, rnd.op, self.world_size)
        for o in rnd.copies:
            np.copyto(o[lo:hi], tmp)

    def _exchange_chunk(self, rnd: _Round, lo: int, hi: int) -> None:
        outs = [(o, at) for o, at in zip(rnd.outs, rnd.out_at) if o is not None and o.size]
        if rnd.op != "copy":
            outs = [(o, at) for o, at in outs if at < hi and at + o.size > lo]
            if not outs:
                return
            tmp = np.empty(hi - lo, rnd.dtype)
            reduce_into(tmp, [a[lo:hi] for a in rnd.items], rnd.op, self.world_size)
            for o, at in outs:
                a, b = max(lo, at), min(hi, at + o.size)
                np.copyto(o[a - at:b - at], tmp[a - lo:b - lo])
            return
        for item, iat in zip(rnd.items, rnd.item_at):
            if item is None:
                continue
            ilo, ihi = max(lo, iat), min(hi, iat + item.size)
            for o, at in outs:
                a, b = max(ilo, at), min(ihi, at + o.size)
                if a < b:
                    np.copyto(o[a - at:b - at], item[a - iat:b - iat])

    def _help_reduce(self, rnd: _Round, deadline: float, timeout: float,
                     wait: bool = True) -> None:
        """Claim and reduce chunks until none is left, then (``wait``) until all are done; counts
        are lock-free (atomic under the GIL), only the last chunk's thread takes the lock."""
        while rnd.claims is not None and self._broken is None:
            i = next(rnd.claims)
            if i >= rnd.nchunks:
                break
            rnd.started.append(i)  # before the check: _drain then sees this chunk in flight
            if self._broken is not None:
                self._ended(rnd, i)
                break
            lo = i * rnd.chunk
            try:
                self._reduce_chunk(rnd, lo, min(lo + rnd.chunk, rnd.length))
            except BaseException as e:
                self.abort(e)  # first: the round must not count as finished
                self._ended(rnd, i)
                raise
            self._ended(rnd, i)
        if not wait and self._broken is None:
            return
        if not rnd.done:
            _spin(lambda: rnd.done or self._broken is not None)
        with self._cond:
            while not rnd.done:
                if self._broken is not None:
                    if not wait:
                        return
                    self._drain(rnd, deadline)
                    self._raise_if_broken()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._break(CollectiveError(
                        f"CollectiveBarrier round {rnd.gen}: reduction of {rnd.nbytes:,} "
                        f"bytes did not finish within {timeout} s", timed_out=True))
                self._cond.wait(remaining)

    def _ended(self, rnd: _Round, i: int) -> None:
        """Chunk ``i`` is done (or given up): the last one finishes the round."""
        rnd.ended.append(i)
        if len(rnd.ended) == rnd.nchunks or self._broken is not None:
            with self._cond:
                if self._broken is None and not rnd.done:
                    self._finish(rnd)
                self._cond.notify_all()  # the round's waiters, or participants draining it

    def _drain(self, rnd: _Round, deadline: float) -> None:
        """Broken mid-round: wait until no thread writes the outputs, so callers may free them."""
        while rnd.started is not None and len(rnd.started) != len(rnd.ended) and \
                time.monotonic() < deadline:
            self._cond.wait(max(0.0, deadline - time.monotonic()))

    def _finish(self, rnd: _Round) -> None:
        if rnd.shared:
            rnd.out.flags.writeable = False
            rnd.result = rnd.out.reshape(rnd.shape)
        rnd.done = True
        rnd.items = rnd.outs = rnd.flats = rnd.out = rnd.copies = None  # let the arrays go

    def _break(self, err: CollectiveError) -> CollectiveError:
        """Break the barrier with ``err`` (the first one sticks) and end the helpers."""
        if self._broken is None:
            self._broken = err
            self._helpers.close(join=False)
        self._cond.notify_all()
        return err

    def _raise_if_broken(self) -> None:
        b = self._broken
        if b is not None:
            err = CollectiveError(str(b), missing=b.missing, rank=b.rank, timed_out=b.timed_out)
            raise err from (b.__cause__ or b)

    def _missing_error(self, rnd: _Round, timeout: float) -> CollectiveError:
        head = f"CollectiveBarrier round {rnd.gen}: "
        if not rnd.ranked:
            return CollectiveError(
                f"{head}{self.world_size - len(rnd.arrived)} of {self.world_size} participants "
                f"did not arrive within {timeout} s (pass rank= to name them)", timed_out=True)
        missing = sorted(set(range(self.world_size)) - set(rnd.arrived))
        return CollectiveError(
            f"{head}rank(s) {', '.join(map(str, missing))} did not arrive within {timeout} s "
            f"(arrived: {', '.join(map(str, sorted(rnd.arrived)))})", missing=missing,
            timed_out=True)

    def _gone_error(self, rnd: _Round) -> CollectiveError:
        gone = sorted(self._gone - set(rnd.arrived))
        return CollectiveError(
            f"CollectiveBarrier round {rnd.gen}: rank(s) {', '.join(map(str, gone)) or '?'} "
            f"ended and will never arrive", missing=gone)
