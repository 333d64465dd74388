"""The host reduction engine under every in-process collective: ``reduce_into`` (one pass over
memory for any number of inputs, float16 in float32), the split of a large round into chunks that
several threads reduce at once (numpy releases the GIL), and the helper threads that join them.
CollectiveBarrier runs its rounds on it; the shared-memory transports reduce their slots with
``reduce_into``. Results are reduced in rank order, so their bits do not depend on arrival."""
from __future__ import annotations

import contextlib
import math
import threading
from collections import deque

import numpy as np

REDUCE_OPS = ("sum", "mean", "max", "min")
UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
REDUCE_TILE = 1 << 15  # elements a reduction takes at once: its accumulators stay in L2
CHUNK_BYTES = 1 << 20       # a chunk fits in L2 and still amortises the per-chunk bookkeeping
PARALLEL_MIN_BYTES = 1 << 19  # below this one thread is faster than waking the others
SPLIT_MIN_BYTES = 1 << 17     # large rounds are cut into at least one piece per thread, to here
MAX_REDUCE_THREADS = 12  # a 2-rank round at 10 GB/s moves ~40 GB/s of memory; a core ~10 GB/s
# A helper joins a round per this many bytes: waking one costs about what it reduces of a few MB
# (H100 host, BENCHMARKS.md: 4 MB rounds 5.0 GB/s with no helper, 3.4 with ten).
HELPER_BYTES = 4 << 20
HELPER_IDLE_S = 10.0  # a helper with no round for this long ends (started again when needed)
HELPER_JOIN_S = 5.0  # close() waits this long for each helper to finish its chunk


def check_op(op: str, dtype) -> None:
    """Reject unknown ops, and ``mean`` of integers (it has no exact integer result)."""
    if op not in UFUNCS:
        raise ValueError(f"unknown reduce op {op!r}; use one of {', '.join(REDUCE_OPS)}")
    if op == "mean" and not np.issubdtype(np.dtype(dtype), np.inexact):
        raise TypeError(f"op='mean' needs a floating dtype, got {np.dtype(dtype)}; "
                        "use op='sum' and divide, or convert to float first")


def reduce_into(out: np.ndarray, inputs, op: str, divisor: int) -> None:
    """out = op(inputs[0], inputs[1], ...) left to right, then / divisor for mean. ``out`` is
    only written, never read (it may be mapped upload memory, which reads back slowly) and may
    be ``inputs[0]`` itself. More than two inputs, mean and float16 go tile by tile through a
    cached accumulator, so that each tile is reduced over every input while it is in cache (one
    pass over memory, not one per input); float16 is reduced in float32 and rounded once
    (numpy's float16 arithmetic rounds at every step, and is slower than its casts)."""
    ufunc = UFUNCS[op]
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


def plan_chunks(nbytes: int, chunk_bytes: int, world: int, helpers: int) -> tuple[int, int]:
    """(chunks, helpers to wake) for a round of ``nbytes`` among ``world`` participants: a small
    round is one chunk; a large one at least one per thread, down to SPLIT_MIN_BYTES each."""
    nchunks = max(1, math.ceil(nbytes / chunk_bytes))
    if nbytes >= PARALLEL_MIN_BYTES and world > 1:
        threads = world + helpers
        nchunks = max(nchunks, world, min(threads, nbytes // SPLIT_MIN_BYTES))
    if nchunks == 1:
        return 1, 0
    wanted = nbytes // HELPER_BYTES  # waking a thread costs more than a small share
    return nchunks, max(0, min(helpers, nchunks - world, wanted))


def reduce_span(inputs, lo: int, hi: int, op: str, divisor: int, copies, shared=None) -> None:
    """Elements [lo, hi) of the flat ``inputs`` reduced once (into ``shared`` when given, the
    result everyone reads), then written to each flat array of ``copies`` while cached."""
    parts = [f[lo:hi] for f in inputs]
    if shared is not None:
        src = shared[lo:hi]
    else:
        src = np.empty(hi - lo, inputs[0].dtype)
    reduce_into(src, parts, op, divisor)
    for o in copies:
        np.copyto(o[lo:hi], src)


def exchange_span(lo: int, hi: int, items, item_at, outs, out_at, op: str, divisor: int,
                  dtype) -> None:
    """Elements [lo, hi) of an exchange round's space: with ``op`` every item covers the space
    and is reduced; with ``"copy"`` the items are disjoint pieces (item r at ``item_at[r]``).
    Each output takes its window ``[out_at[r], out_at[r] + size)`` of the result."""
    outs = [(o, at) for o, at in zip(outs, out_at) if o is not None and o.size]
    if op != "copy":
        outs = [(o, at) for o, at in outs if at < hi and at + o.size > lo]
        if not outs:
            return
        tmp = np.empty(hi - lo, dtype)
        reduce_into(tmp, [a[lo:hi] for a in items], op, divisor)
        for o, at in outs:
            a, b = max(lo, at), min(hi, at + o.size)
            np.copyto(o[a - at:b - at], tmp[a - lo:b - lo])
        return
    for item, iat in zip(items, item_at):
        if item is None:
            continue
        ilo, ihi = max(lo, iat), min(hi, iat + item.size)
        for o, at in outs:
            a, b = max(ilo, at), min(ihi, at + o.size)
            if a < b:
                np.copyto(o[a - at:b - at], item[a - iat:b - iat])


class ReduceHelpers:
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
