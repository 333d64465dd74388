"""CollectiveBarrier: an in-process rendezvous that reduces one array per participant, round after
round. The arrival that fills a round swaps in a fresh round before anyone leaves, so a fast
participant coming straight back never reads the previous round's result (the original design's
defect). A round is reduced once, in rank order (bits independent of arrival order), large ones in
chunks claimed lock-free by the participants and helper threads (the engine: host_reduce.py). A
missing participant or ``abort`` breaks the barrier for good with a CollectiveError."""
from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import weakref

import numpy as np

from .errors import CollectiveError
from .host_reduce import (
    CHUNK_BYTES,
    MAX_REDUCE_THREADS,
    ReduceHelpers,
    check_op,
    exchange_span,
    plan_chunks,
    reduce_span,
)

# A participant about to block first polls this long (no wake latency on the critical path); off:
# on the 2-core CI machine polling 50 us made 4 KiB rounds 38 -> 50 us (BENCHMARKS.md).
SPIN_S = 0.0


def _spin(ready) -> bool:
    """Poll ``ready()`` for up to SPIN_S (the GIL is released between polls); its last value."""
    end = time.perf_counter() + SPIN_S
    while not ready():
        if time.perf_counter() >= end:
            return False
        time.sleep(0)
    return True


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
    gathers = True  # exchange rounds without an op tile the space (staged_collectives)

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
        self._helpers = ReduceHelpers(self.helpers, "wgrumus-reduce")
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
        nchunks, wake = plan_chunks(nbytes, self.chunk_bytes, self.world_size, self.helpers)
        if nchunks == 1:
            self._reduce_chunk(rnd, 0, length)
            self._finish(rnd)
        else:
            rnd.nchunks = nchunks
            rnd.chunk = -(-length // nchunks)
            rnd.claims = itertools.count()  # chunk indices handed out (atomic under the GIL)
            rnd.started, rnd.ended = [], []  # chunks being or been reduced; done or given up
            if wake > 0:
                self._helpers.run(wake, lambda: self._helper(rnd))
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
            exchange_span(lo, hi, rnd.items, rnd.item_at, rnd.outs, rnd.out_at, rnd.op,
                          self.world_size, rnd.dtype)
        else:
            reduce_span(rnd.flats, lo, hi, rnd.op, self.world_size, rnd.copies,
                        rnd.out if rnd.shared else None)

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
