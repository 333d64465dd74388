"""Point-to-point transports (and each backend's own collectives) under one small interface.

``ThreadTransport``: ranks are threads of this process. Each destination has a mailbox of bounded
per-source queues; a message is a numpy array (copied on send unless the sender hands over an
array it will never touch again), matched by (source, tag). Liveness is known exactly: a rank whose
thread ended or failed wakes every rank waiting on it.

``MPITransport``: ranks are processes under ``mpiexec``. Sends and receives are nonblocking
(Isend/Irecv/Iprobe) and polled against a deadline, because a blocking MPI call cannot time out;
collectives of the "native" strategy use MPI's nonblocking collectives the same way. A failing
rank sends an abort notice on a reserved tag that every waiting rank polls for.

Interface used by ``collectives`` and ``process_group``::

    isend(dst, tag, arr, deadline, owned=False) -> request     (arr unchanged until waited)
    recv(src, tag, deadline, dtype, shape) -> ndarray           (shape[0] may be -1: any rows)
    wait_all(requests, deadline); send_array / recv_array       (shape and dtype travel along)
    native_* collectives; split(key, color, members) -> child transport or None;
    check() / abort(err) / failed                               (liveness)

Received arrays may be shared with other ranks (threads) and are then read-only: an algorithm that
returns one must copy it (``owned_copy``).
"""
from __future__ import annotations

import collections
import hashlib
import threading
import time

import numpy as np

from .barrier import CollectiveBarrier, check_op, reduce_into
from .errors import CollectiveError

QUEUE_DEPTH = 64  # messages per (source, destination) pair before a sender waits
_HEADER_WORDS = 16
_MAGIC = 0x5747_524D  # "WGRM"
_DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8",
           "uint16", "uint32", "uint64", "bool", "complex64", "complex128")


# ---------------------------------------------------------------------------- helpers
def owned_copy(a: np.ndarray) -> np.ndarray:
    """A private writeable copy of a *received* array when it may be shared with other ranks
    (thread transports hand arrays over by reference and mark them read-only)."""
    return a if a.flags.writeable else np.array(a, copy=True)


def split_bounds(n: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` near-equal pieces of ``n`` items; the first n % parts pieces get one
    more item (numpy.array_split's rule). Piece i is [b[i], b[i+1])."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def encode_header(a: np.ndarray) -> np.ndarray:
    name = a.dtype.name
    if name not in _DTYPES:
        raise TypeError(f"cannot send dtype {a.dtype}; supported: {', '.join(_DTYPES)}")
    if a.ndim > _HEADER_WORDS - 3:
        raise ValueError(f"cannot send arrays of more than {_HEADER_WORDS - 3} dimensions")
    h = np.zeros(_HEADER_WORDS, dtype=np.int64)
    h[0], h[1], h[2] = _MAGIC, _DTYPES.index(name), a.ndim
    h[3:3 + a.ndim] = a.shape
    return h


def decode_header(h: np.ndarray) -> tuple[np.dtype, tuple]:
    if int(h[0]) != _MAGIC:
        raise CollectiveError("received a corrupt array header: ranks called different "
                              "operations, or used the same tag for different messages")
    ndim = int(h[2])
    return np.dtype(_DTYPES[int(h[1])]), tuple(int(d) for d in h[3:3 + ndim])


def check_received(a: np.ndarray, dtype, shape, src: int, what: str) -> None:
    """Fail clearly when a peer sent something other than what this rank expects."""
    bad = dtype is not None and a.dtype != np.dtype(dtype)
    if shape is not None and not bad:
        bad = len(shape) != a.ndim or any(s >= 0 and s != d for s, d in zip(shape, a.shape))
    if bad:
        want = f"{np.dtype(dtype) if dtype is not None else '?'} {tuple(shape or ())}"
        raise CollectiveError(f"{what}: rank {src} sent {a.dtype} {a.shape}, expected {want} "
                              "(ranks passed different shapes/dtypes or called different "
                              "operations)", rank=src)


_SIG_BYTES = 192  # bytes of a collective's description compared between MPI ranks


def mismatch_error(seq: int, group: str, mine: tuple, first: tuple) -> CollectiveError:
    """Ranks disagree on collective number ``seq``: (rank, name, detail) of the rank that
    noticed and of the rank it is compared with."""
    (r, name, detail), (r0, name0, detail0) = mine, first
    if name != name0:
        what = (f"ranks called different collectives (#{seq} of group {group}): rank {r} "
                f"called {name}({detail}), others {name0}({detail0}) (rank {r0})")
    else:
        what = (f"{name}: ranks disagree (collective #{seq} of group {group}): rank {r} passed "
                f"{detail}, others {detail0} (rank {r0})")
    return CollectiveError(what + "; every rank must call the same collectives in the same "
                           "order, with the same op, root, strategy, dtype and shape", rank=r)


class _Done:
    """A send that already completed (thread transport)."""
    __slots__ = ()


_DONE = _Done()


# ---------------------------------------------------------------------------- threads
class _Mailbox:
    """Messages for one destination: a bounded deque per source, matched by tag."""

    def __init__(self, size: int):
        self.cond = threading.Condition()
        self.queues = [collections.deque() for _ in range(size)]


class ThreadWorld:
    """State shared by the ranks (threads) of one in-process group: mailboxes, the barrier the
    native collectives use, liveness, the subgroups split off it, and for asynchronous device
    collectives one CommThread per rank joined by a barrier of their own (so they never mix
    with the synchronous collectives' rounds; ``close()`` stops those threads)."""

    def __init__(self, size: int, timeout: float = 60.0, depth: int = QUEUE_DEPTH,
                 name: str = "world"):
        if size < 1:
            raise ValueError(f"world size must be >= 1, got {size}")
        self.size, self.timeout, self.depth, self.name = size, float(timeout), depth, name
        self.barrier = CollectiveBarrier(size, timeout)
        self.comm_barrier = CollectiveBarrier(size, timeout)
        self._comm_threads: dict = {}
        self._mail = [_Mailbox(size) for _ in range(size)]
        self._lock = threading.Lock()
        self._children: dict = {}
        self.error: CollectiveError | None = None
        self.exited: set[int] = set()
        self._calls: dict = {}  # collective number -> [first (rank, name, detail), ranks seen]

    def transport(self, rank: int) -> "ThreadTransport":
        return ThreadTransport(self, rank)

    def comm_thread(self, rank: int, device):
        """Rank ``rank``'s CommThread (created on first use, on ``device``). Its requests run in
        submission order, so every rank's asynchronous collectives meet in the same rounds."""
        from .comm import CommThread
        with self._lock:
            c = self._comm_threads.get(rank)
            if c is None:
                c = self._comm_threads[rank] = CommThread(device, rank=rank)
        if c.device is not device:
            raise ValueError(f"all_reduce_async: rank {rank}'s device tensors must live on one "
                             f"device ({c.device!r}), got one on {device!r}; move it there or "
                             f"use all_reduce")
        return c

    def close(self, timeout: float | None = None) -> None:
        """Stop the CommThreads of this world and its subgroups (queued requests finish)."""
        with self._lock:
            comms = list(self._comm_threads.values())
            children = [w for w, _ in self._children.values()]
        for c in comms:
            c.close(self.timeout if timeout is None else timeout)
        for w in children:
            w.close(timeout)

    def child(self, key, members: list[int]) -> "ThreadWorld":
        """The subgroup world for ``members`` (parent ranks); created once, shared by members."""
        with self._lock:
            entry = self._children.get(key)
            if entry is None:
                w = ThreadWorld(len(members), self.timeout, self.depth,
                                f"{self.name}/{'-'.join(map(str, members))}")
                entry = self._children[key] = (w, list(members))
                if self.error is not None:
                    w.abort(self.error)
                for r in self.exited:
                    if r in members:
                        w.mark_exited(members.index(r))
            return entry[0]

    def abort(self, err: CollectiveError) -> None:
        """Fail every rank of this world (and its subgroups) that waits now or later."""
        with self._lock:
            if self.error is None:
                self.error = err
            children = [w for w, _ in self._children.values()]
        self.barrier.abort(err)
        self.comm_barrier.abort(err)
        self._wake()
        for w in children:
            w.abort(err)

    def mark_exited(self, rank: int) -> None:
        """Rank ``rank``'s thread ended: ranks waiting on it fail now instead of at the timeout."""
        with self._lock:
            self.exited.add(rank)
            children = list(self._children.values())
        self.barrier.mark_gone(rank)
        self.comm_barrier.mark_gone(rank)
        self._wake()
        for w, members in children:
            if rank in members:
                w.mark_exited(members.index(rank))

    def _wake(self):
        for box in self._mail:
            with box.cond:
                box.cond.notify_all()

    def raise_if_failed(self) -> None:
        e = self.error
        if e is not None:
            raise CollectiveError(str(e), missing=e.missing, rank=e.rank,
                                  timed_out=e.timed_out) from (e.__cause__ or e)


class ThreadTransport:
    """One rank's endpoint of a ThreadWorld."""

    backend = "threads"
    tag_ub = (1 << 30) - 1

    def __init__(self, world: ThreadWorld, rank: int):
        if not 0 <= rank < world.size:
            raise ValueError(f"rank {rank} outside world of size {world.size}")
        self.world, self.rank, self.size = world, rank, world.size
        self.stats = {"messages_sent": 0, "bytes_sent": 0, "messages_received": 0,
                      "bytes_received": 0}

    # -- point to point
    def isend(self, dst: int, tag: int, arr: np.ndarray, deadline: float, owned: bool = False):
        """Queue ``arr`` for ``dst``. Unless ``owned`` (the caller never touches it again) the
        array is copied, so the caller may reuse its buffer at once, as after an MPI send."""
        w = self.world
        if not owned:
            arr = np.array(arr, copy=True, order="C")
        arr.flags.writeable = False  # the receiver gets this very array: nobody may change it
        box = w._mail[dst]
        with box.cond:
            q = box.queues[self.rank]
            while len(q) >= w.depth:
                self._check_peer(dst, "sending to", tag)
                self._wait(box.cond, deadline, f"rank {dst} did not drain its mailbox", dst)
            q.append((tag, arr))
            box.cond.notify_all()
        self.stats["messages_sent"] += 1
        self.stats["bytes_sent"] += arr.nbytes
        return _DONE

    def recv(self, src: int, tag: int, deadline: float, dtype=None, shape=None) -> np.ndarray:
        box = self.world._mail[self.rank]
        with box.cond:
            q = box.queues[src]
            while (a := _take_tagged(q, tag)) is None:
                self._check_peer(src, "receiving from", tag)
                self._wait(box.cond, deadline, f"no message from rank {src} (tag {tag})", src)
            box.cond.notify_all()  # a sender may wait for room
        check_received(a, dtype, shape, src, f"rank {self.rank} receiving tag {tag}")
        self.stats["messages_received"] += 1
        self.stats["bytes_received"] += a.nbytes
        return a

    def wait_all(self, reqs, deadline: float) -> None:
        """Thread sends complete when queued."""

    def send_array(self, dst, tag, arr, deadline, owned=False):
        return [self.isend(dst, tag, arr, deadline, owned)]

    def recv_array(self, src, tag, deadline):
        return self.recv(src, tag, deadline)

    def _check_peer(self, peer: int, doing: str, tag) -> None:
        w = self.world
        w.raise_if_failed()
        if peer in w.exited:
            raise CollectiveError(f"rank {self.rank} {doing} rank {peer} (tag {tag}): rank "
                                  f"{peer} has ended", missing=[peer], rank=peer)

    def _wait(self, cond, deadline, what, peer):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CollectiveError(f"rank {self.rank}: {what} within {self.world.timeout} s "
                                  f"timeout ({self.world.name})", missing=[peer], timed_out=True)
        cond.wait(remaining)

    def agree(self, seq: int, name: str, detail: str, deadline: float) -> None:
        """Check this rank's collective number ``seq`` against the first rank's without
        waiting: the rank that differs raises (and the group then fails everywhere)."""
        w = self.world
        with w._lock:
            entry = w._calls.setdefault(seq, [(self.rank, name, detail), 0])
            entry[1] += 1
            if entry[1] == self.size:
                del w._calls[seq]
        first = entry[0]
        if first[1:] != (name, detail):
            raise mismatch_error(seq, w.name, (self.rank, name, detail), first)

    # -- native collectives: the world's shared-memory barrier
    def _left(self, deadline):
        return max(deadline - time.monotonic(), 1e-6)

    def native_all_reduce(self, arr, op, deadline):
        # Each rank's private output is filled by whichever thread reduces a chunk.
        out = np.empty_like(arr)
        return self.world.barrier.reduce(arr, op, self.rank, self._left(deadline), out=out)

    def native_reduce(self, arr, op, root, deadline):
        res = self.world.barrier.reduce(arr, op, self.rank, self._left(deadline))
        return np.array(res) if self.rank == root else None

    def native_broadcast(self, arr, root, deadline):
        items = self.world.barrier.gather(arr if self.rank == root else None, self.rank,
                                          self._left(deadline))
        out = np.array(items[root], copy=True)
        self.world.barrier.wait(self.rank, self._left(deadline))  # root's buffer read by all
        return out

    def native_all_gather(self, arr, deadline):
        items = self.world.barrier.gather(arr, self.rank, self._left(deadline))
        _check_gather_items(items)
        out = np.concatenate(items, axis=0)
        self.world.barrier.wait(self.rank, self._left(deadline))
        return out

    def native_reduce_scatter(self, arr, op, deadline):
        items = self.world.barrier.gather(arr, self.rank, self._left(deadline))
        for r, a in enumerate(items):
            if a.shape != arr.shape or a.dtype != arr.dtype:
                raise CollectiveError(f"reduce_scatter: rank {r} passed {a.dtype} {a.shape}, "
                                      f"rank {self.rank} {arr.dtype} {arr.shape}; all ranks "
                                      f"must pass the same dtype and shape")
        b = split_bounds(arr.shape[0], self.size)
        lo, hi = b[self.rank], b[self.rank + 1]
        out = np.empty((hi - lo,) + arr.shape[1:], dtype=arr.dtype)
        reduce_into(out, [a[lo:hi] for a in items], op, self.size)
        self.world.barrier.wait(self.rank, self._left(deadline))
        return out

    def native_barrier(self, deadline):
        self.world.barrier.wait(self.rank, self._left(deadline))

    # -- lifecycle
    def split(self, key, color, members: list[int]):
        if color is None:
            return None
        return self.world.child(key, members).transport(members.index(self.rank))

    def check(self) -> None:
        """Raise CollectiveError if the world failed."""
        self.world.raise_if_failed()

    def abort(self, err: CollectiveError) -> None:
        self.world.abort(err)

    @property
    def failed(self) -> CollectiveError | None:
        return self.world.error


def _take_tagged(q, tag):
    """Remove and return the first message with ``tag`` from the queue ``q`` (messages with
    other tags stay, in order), or None when there is none yet."""
    for i, (t, a) in enumerate(q):
        if t == tag:
            del q[i]
            return a
    return None


def _check_gather_items(items) -> None:
    first = items[0]
    for r, a in enumerate(items):
        if a.dtype != first.dtype or a.shape[1:] != first.shape[1:]:
            raise CollectiveError(f"all_gather: rank {r} passed {a.dtype} {a.shape}, rank 0 "
                                  f"{first.dtype} {first.shape}; all ranks need the same dtype "
                                  "and the same shape after dim 0")


# ---------------------------------------------------------------------------- MPI
class _MPIState:
    """Process-wide MPI facts: the world communicator, its abort tag, and whether a peer aborted.
    Shared by the world transport and every subgroup split off it."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm
        self.abort_tag = int(comm.Get_attr(MPI.TAG_UB))
        self.error: CollectiveError | None = None
        self._sent_aborts: list = []

    def check_abort(self) -> None:
        if self.error is None:
            st = self.MPI.Status()
            if self.comm.Iprobe(self.MPI.ANY_SOURCE, self.abort_tag, st):
                n = st.Get_count(self.MPI.BYTE)
                buf = bytearray(n)
                self.comm.Recv([buf, self.MPI.BYTE], st.Get_source(), self.abort_tag)
                src = st.Get_source()
                self.error = CollectiveError(f"rank {src} aborted: {buf.decode(errors='replace')}",
                                             rank=src)
        if self.error is not None:
            e = self.error
            raise CollectiveError(str(e), missing=e.missing, rank=e.rank,
                                  timed_out=e.timed_out) from e

    def abort(self, err: BaseException) -> None:
        """Tell every other rank (best effort: small eager messages) that this rank failed.

        Not sent when this rank merely timed out: the others wait on the same missing rank and
        time out too, and notices that two exiting ranks never receive made MPICH kill
        uninvolved ranks at MPI_Finalize."""
        if self.error is not None and self.error.rank != self.comm.rank:
            return  # we are failing because of someone else's abort: they already told everyone
        if isinstance(err, CollectiveError) and err.timed_out:
            if self.error is None:
                self.error = CollectiveError(str(err), missing=err.missing, timed_out=True)
            return
        if self._sent_aborts:
            return
        root = err.__cause__ if isinstance(err, CollectiveError) and err.__cause__ else err
        msg = f"{type(root).__name__}: {root}".encode()[:4000]
        me = self.comm.rank
        for r in range(self.comm.size):
            if r != me:
                self._sent_aborts.append(
                    (msg, self.comm.Isend([msg, self.MPI.BYTE], r, self.abort_tag)))
        if self.error is None:
            self.error = CollectiveError(f"rank {me} aborted: {msg.decode()}", rank=me)
        deadline = time.monotonic() + 1.0
        reqs = [q for _, q in self._sent_aborts]
        while not self.MPI.Request.Testall(reqs) and time.monotonic() < deadline:
            time.sleep(1e-4)


class MPITransport:
    """One process's endpoint of an MPI communicator (the world, or a split of it)."""

    backend = "mpi"

    def __init__(self, comm, timeout: float = 60.0, state: _MPIState | None = None):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = float(timeout)
        self.state = state or _MPIState(comm)
        self.tag_ub = self.state.abort_tag - 1
        self.stats = {"messages_sent": 0, "bytes_sent": 0, "messages_received": 0,
                      "bytes_received": 0}

    # -- polling: the only way to give an MPI wait a deadline
    def _poll(self, test, deadline: float, what: str, peer=None):
        # A timed-out request stays pending: cancelling a receive made MPICH kill the process at
        # MPI_Finalize, and the group is broken from here on anyway.
        spins = 0
        while not test():
            spins += 1
            if spins % 16 == 0:
                self.state.check_abort()
            if time.monotonic() >= deadline:
                raise CollectiveError(f"rank {self.rank}: {what} within {self.timeout} s timeout",
                                      missing=[peer] if peer is not None else None,
                                      timed_out=True)
            # Spin briefly (MPI progresses only inside Test), then back off so oversubscribed
            # ranks and other Python threads get the CPU.
            time.sleep(0 if spins < 200 else min(1e-3, (spins - 199) * 2e-5))

    def _bytes(self, arr):
        return [arr, self.MPI.BYTE]

    # -- point to point
    def isend(self, dst, tag, arr, deadline, owned=False):
        arr = np.ascontiguousarray(arr)
        req = self.comm.Isend(self._bytes(arr), dst, tag)
        self.stats["messages_sent"] += 1
        self.stats["bytes_sent"] += arr.nbytes
        return (req, arr)  # keep the buffer alive until the request completes

    def wait_all(self, reqs, deadline):
        reqs = [r for r in reqs if r is not _DONE]
        if reqs:
            mreqs = [r[0] for r in reqs]
            self._poll(lambda: self.MPI.Request.Testall(mreqs), deadline,
                       "send did not complete (receiver not receiving)")

    def recv(self, src, tag, deadline, dtype=None, shape=None):
        """The message from ``src`` with ``tag``: of exactly ``shape`` when it is known,
        otherwise sized from the message (rows of ``shape[1:]``, or flat bytes)."""
        if shape is not None and dtype is not None and all(s >= 0 for s in shape):
            buf = self._recv_known(src, tag, deadline, np.empty(shape, dtype=dtype))
        else:
            buf = self._recv_probed(src, tag, deadline, dtype, shape)
        self.stats["messages_received"] += 1
        self.stats["bytes_received"] += buf.nbytes
        return buf

    def _recv_known(self, src, tag, deadline, buf):
        MPI = self.MPI
        st = MPI.Status()
        req = self.comm.Irecv(self._bytes(buf), src, tag)
        try:
            self._poll(lambda: req.Test(st), deadline,
                       f"no message from rank {src} (tag {tag})", src)
        except MPI.Exception as e:
            raise CollectiveError(f"rank {self.rank} receiving tag {tag} from rank {src}: "
                                  f"{e} (ranks passed different shapes?)", rank=src) from e
        got = st.Get_count(MPI.BYTE)
        if got != buf.nbytes:
            raise CollectiveError(f"rank {self.rank}: rank {src} sent {got} bytes on tag "
                                  f"{tag}, expected {buf.nbytes} (ranks passed different "
                                  "shapes or dtypes?)", rank=src)
        return buf

    def _recv_probed(self, src, tag, deadline, dtype, shape):
        # Iprobe then Irecv of the same (source, tag): safe because one thread at a time
        # drives a group. (MPICH killed peers at exit after timed-out Improbe loops.)
        MPI = self.MPI
        st = MPI.Status()
        self._poll(lambda: self.comm.Iprobe(src, tag, st), deadline,
                   f"no message from rank {src} (tag {tag})", src)
        n = st.Get_count(MPI.BYTE)
        dt = np.dtype(dtype if dtype is not None else np.uint8)
        tail = tuple(shape[1:]) if shape is not None else ()
        row = dt.itemsize * int(np.prod(tail, dtype=np.int64))
        if row == 0 or n % row:
            raise CollectiveError(f"rank {self.rank}: {n} bytes from rank {src} on tag {tag} "
                                  f"are not whole rows of {dt} {tail}", rank=src)
        buf = np.empty((n // row,) + tail, dtype=dt) if shape is not None else \
            np.empty(n // dt.itemsize, dtype=dt)
        req = self.comm.Irecv(self._bytes(buf), src, tag)
        self._poll(lambda: req.Test(), deadline, f"receiving from rank {src}", src)
        return buf

    def send_array(self, dst, tag, arr, deadline, owned=False):
        arr = np.asarray(arr, order="C")  # 0-d stays 0-d
        return [self.isend(dst, tag, encode_header(arr), deadline),
                self.isend(dst, tag, arr, deadline)]

    def recv_array(self, src, tag, deadline):
        dtype, shape = decode_header(self.recv(src, tag, deadline, np.int64, (_HEADER_WORDS,)))
        return self.recv(src, tag, deadline, dtype, shape)

    def agree(self, seq: int, name: str, detail: str, deadline: float) -> None:
        """Every rank learns every rank's collective number ``seq`` (one small all-gather) and
        all raise on a difference, before any data moves."""
        raw = f"{name}|{detail}".encode()
        if len(raw) > _SIG_BYTES:  # keep the start readable, and any difference visible
            raw = raw[:_SIG_BYTES - 17] + b"#" + hashlib.sha1(raw).hexdigest()[:16].encode()
        mine = np.zeros(_SIG_BYTES, np.uint8)
        mine[:len(raw)] = np.frombuffer(raw, np.uint8)
        sigs = np.empty((self.size, _SIG_BYTES), np.uint8)
        B = self.MPI.BYTE
        self._run(lambda: self.comm.Iallgather([mine, B], [sigs, B]), deadline,
                  "Iallgather (collective check)")
        differ = np.flatnonzero((sigs != sigs[0]).any(axis=1))
        if differ.size:
            r = int(differ[0])
            a, b = (bytes(sigs[i]).rstrip(b"\0").decode(errors="replace").split("|", 1)
                    for i in (0, r))
            raise mismatch_error(seq, "world" if self.comm is self.state.comm else "subgroup",
                                 (r, *b), (0, *a))

    # -- native collectives: MPI's own, nonblocking and polled
    def _mpi_type(self, dtype):
        # Predefined types only: MPI defines reductions on those, not on derived duplicates.
        t = self.MPI._typedict.get(np.dtype(dtype).char)
        if t is None:
            raise TypeError(f"MPI has no predefined datatype for {dtype}; use strategy 'ring'")
        return t

    def _op(self, op):
        MPI = self.MPI
        return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]

    def _run(self, start, deadline, what):
        try:
            req = start()
            self._poll(req.Test, deadline,
                       f"MPI {what} did not complete (a rank did not arrive)")
        except self.MPI.Exception as e:
            raise CollectiveError(f"rank {self.rank}: MPI {what} failed: {e}") from e

    def native_all_reduce(self, arr, op, deadline):
        check_op(op, arr.dtype)
        t = self._mpi_type(arr.dtype)
        out = np.empty_like(arr)
        self._run(lambda: self.comm.Iallreduce([arr, t], [out, t], self._op(op)), deadline,
                  "Iallreduce")
        if op == "mean":
            np.divide(out, self.size, out=out)
        return out

    def native_reduce(self, arr, op, root, deadline):
        check_op(op, arr.dtype)
        t = self._mpi_type(arr.dtype)
        out = np.empty_like(arr) if self.rank == root else None
        self._run(lambda: self.comm.Ireduce([arr, t], [out, t] if out is not None else None,
                                            self._op(op), root), deadline, "Ireduce")
        if out is not None and op == "mean":
            np.divide(out, self.size, out=out)
        return out

    def native_broadcast(self, arr, root, deadline):
        h = encode_header(arr) if self.rank == root else np.empty(_HEADER_WORDS, np.int64)
        self._run(lambda: self.comm.Ibcast([h, self.MPI.INT64_T], root), deadline, "Ibcast")
        dtype, shape = decode_header(h)
        out = np.array(arr, copy=True) if self.rank == root else np.empty(shape, dtype)
        self._run(lambda: self.comm.Ibcast(self._bytes(out), root), deadline, "Ibcast")
        return out

    def native_all_gather(self, arr, deadline):
        tail = arr.shape[1:]
        row = int(np.prod(tail, dtype=np.int64))
        meta = np.array([arr.shape[0], row, arr.dtype.itemsize], dtype=np.int64)
        metas = np.empty((self.size, 3), dtype=np.int64)
        self._run(lambda: self.comm.Iallgather([meta, self.MPI.INT64_T],
                                               [metas, self.MPI.INT64_T]), deadline, "Iallgather")
        if (metas[:, 1:] != meta[1:]).any():
            raise CollectiveError("all_gather: ranks passed different dtypes or shapes after "
                                  f"dim 0 (rows, row size, itemsize per rank: {metas.tolist()})")
        counts = metas[:, 0] * row * arr.dtype.itemsize
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out = np.empty((int(metas[:, 0].sum()),) + tail, dtype=arr.dtype)
        B = self.MPI.BYTE
        self._run(lambda: self.comm.Iallgatherv(self._bytes(arr), [out, (counts, displs), B]),
                  deadline, "Iallgatherv")
        return out

    def native_reduce_scatter(self, arr, op, deadline):
        check_op(op, arr.dtype)
        t = self._mpi_type(arr.dtype)
        row = int(np.prod(arr.shape[1:], dtype=np.int64))
        b = split_bounds(arr.shape[0], self.size)
        counts = [(b[i + 1] - b[i]) * row for i in range(self.size)]
        out = np.empty((b[self.rank + 1] - b[self.rank],) + arr.shape[1:], dtype=arr.dtype)
        self._run(lambda: self.comm.Ireduce_scatter([arr, t], [out, t], counts, self._op(op)),
                  deadline, "Ireduce_scatter")
        if op == "mean":
            np.divide(out, self.size, out=out)
        return out

    def native_barrier(self, deadline):
        self._run(self.comm.Ibarrier, deadline, "Ibarrier")

    # -- lifecycle
    def split(self, key, color, members):
        MPI = self.MPI
        # Every member just took part in the all-gather that chose the colors, so this blocking
        # call cannot wait on a dead rank.
        sub = self.comm.Split(MPI.UNDEFINED if color is None else int(color),
                              members.index(self.rank) if color is not None else 0)
        if sub == MPI.COMM_NULL:
            return None
        return MPITransport(sub, self.timeout, self.state)

    def check(self) -> None:
        """Raise CollectiveError if a peer sent an abort notice."""
        self.state.check_abort()

    def abort(self, err: BaseException) -> None:
        self.state.abort(err)

    @property
    def failed(self) -> CollectiveError | None:
        return self.state.error
