"""The thread backend's transport: ranks are threads sharing a ThreadWorld, each destination a
mailbox of bounded per-source queues matched by tag. A rank whose thread ended or failed wakes
every rank waiting on it."""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

from ..barrier import CollectiveBarrier
from ..errors import CollectiveError
from ..host_reduce import reduce_into
from .wire import _DONE, QUEUE_DEPTH, _Liveness, check_received, mismatch_error, split_bounds


class _Mailbox:
    """Messages for one destination: a bounded deque per source, matched by tag."""

    def __init__(self, size: int):
        self.cond = threading.Condition()
        self.queues = [collections.deque() for _ in range(size)]


class ThreadWorld:
    """What the ranks (threads) of one group share: mailboxes, liveness, subgroups, the barrier of
    the native collectives and a separate one for the ranks' CommThreads (async collectives)."""

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

    def transport(self, rank: int) -> ThreadTransport:
        return ThreadTransport(self, rank)

    def comm_thread(self, rank: int, device):
        """Rank ``rank``'s CommThread on ``device`` (requests run in submission order)."""
        from ..comm import CommThread
        with self._lock:
            c = self._comm_threads.get(rank) or self._comm_threads.setdefault(
                rank, CommThread(device, rank=rank))
        if c.device is not device:
            raise ValueError(f"rank {rank}'s asynchronous collectives run on {c.device!r}; move "
                             f"the tensor there (got one on {device!r})")
        return c

    def close(self, timeout: float | None = None) -> None:
        """Stop the CommThreads of this world and its subgroups, and the barriers' helpers."""
        with self._lock:
            comms = list(self._comm_threads.values())
            children = [w for w, _ in self._children.values()]
        for c in comms:
            c.close(self.timeout if timeout is None else timeout)
        self.barrier.close()
        self.comm_barrier.close()
        for w in children:
            w.close(timeout)

    def child(self, key, members: list[int]) -> ThreadWorld:
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


class ThreadTransport(_Liveness):
    """One rank's endpoint of a ThreadWorld."""

    backend = "threads"
    tag_ub = (1 << 30) - 1

    def __init__(self, world: ThreadWorld, rank: int):
        if not 0 <= rank < world.size:
            raise ValueError(f"rank {rank} outside world of size {world.size}")
        self.world, self.rank, self.size = world, rank, world.size
        self._live = world
        self.stats = dict.fromkeys(("messages_sent", "bytes_sent", "messages_received",
                                    "bytes_received"), 0)

    def isend(self, dst: int, tag: int, arr: np.ndarray, deadline: float, owned: bool = False):
        """Queue ``arr`` for ``dst``, copied unless ``owned`` (the caller never touches it)."""
        w = self.world
        if not owned:
            arr = np.array(arr, copy=True, order="C")
        arr.flags.writeable = False  # the receiver gets this very array: nobody may change it
        box = w._mail[dst]
        with box.cond:
            q = box.queues[self.rank]
            while len(q) >= w.depth:
                self._wait(box.cond, deadline, dst, "sending to", tag,
                           f"rank {dst} did not drain its mailbox")
            q.append((tag, arr))
            box.cond.notify_all()
        self._count("sent", arr.nbytes)
        return _DONE

    def recv(self, src: int, tag: int, deadline: float, dtype=None, shape=None) -> np.ndarray:
        box = self.world._mail[self.rank]
        with box.cond:
            q = box.queues[src]
            while (a := _take_tagged(q, tag)) is None:
                self._wait(box.cond, deadline, src, "receiving from", tag,
                           f"no message from rank {src} (tag {tag})")
            box.cond.notify_all()  # a sender may wait for room
        check_received(a, dtype, shape, src, f"rank {self.rank} receiving tag {tag}")
        self._count("received", a.nbytes)
        return a

    def wait_all(self, reqs, deadline: float) -> None:
        """Thread sends complete when queued."""

    def send_array(self, dst, tag, arr, deadline, owned=False):
        return [self.isend(dst, tag, arr, deadline, owned)]

    def recv_array(self, src, tag, deadline):
        return self.recv(src, tag, deadline)

    def _wait(self, cond, deadline, peer: int, doing: str, tag, what: str) -> None:
        """One wait for ``peer``; raises if the world failed, the peer ended or time is up."""
        w = self.world
        w.raise_if_failed()
        if peer in w.exited:
            raise CollectiveError(f"rank {self.rank} {doing} rank {peer} (tag {tag}): rank "
                                  f"{peer} has ended", missing=[peer], rank=peer)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CollectiveError(f"rank {self.rank}: {what} within {self.world.timeout} s "
                                  f"timeout ({self.world.name})", missing=[peer], timed_out=True)
        cond.wait(remaining)

    def agree(self, seq: int, name: str, detail: str, deadline: float) -> None:
        """Check collective ``seq`` against the first rank's without waiting (a differing rank
        raises, and the group then fails everywhere)."""
        w = self.world
        with w._lock:
            entry = w._calls.setdefault(seq, [(self.rank, name, detail), 0])
            entry[1] += 1
            if entry[1] == self.size:
                del w._calls[seq]
        first = entry[0]
        if first[1:] != (name, detail):
            raise mismatch_error(seq, w.name, (self.rank, name, detail), first)

    def _left(self, deadline):
        return max(deadline - time.monotonic(), 1e-6)

    def native_all_reduce(self, arr, op, deadline):
        # Each rank's private output is filled by whichever thread reduces a chunk.
        out = np.empty_like(arr)
        return self.world.barrier.reduce(arr, op, self.rank, self._left(deadline), out=out)

    def native_reduce(self, arr, op, root, deadline):
        res = self.world.barrier.reduce(arr, op, self.rank, self._left(deadline))
        return np.array(res) if self.rank == root else None

    def _from_all(self, arr, deadline, take):
        """``take(every rank's arr)``, read while the others wait (they own the arrays)."""
        out = take(self.world.barrier.gather(arr, self.rank, self._left(deadline)))
        self.native_barrier(deadline)
        return out

    def native_broadcast(self, arr, root, deadline):
        return self._from_all(arr if self.rank == root else None, deadline,
                              lambda items: np.array(items[root], copy=True))

    def native_all_gather(self, arr, deadline):
        return self._from_all(arr, deadline, lambda items: np.concatenate(items, axis=0))

    def native_reduce_scatter(self, arr, op, deadline):
        b = split_bounds(arr.shape[0], self.size)
        lo, hi = b[self.rank], b[self.rank + 1]
        out = np.empty((hi - lo,) + arr.shape[1:], dtype=arr.dtype)

        def take(items):
            reduce_into(out, [a[lo:hi] for a in items], op, self.size)
            return out
        return self._from_all(arr, deadline, take)

    def native_barrier(self, deadline):
        self.world.barrier.wait(self.rank, self._left(deadline))

    def split(self, key, color, members: list[int]):
        if color is None:
            return None
        return self.world.child(key, members).transport(members.index(self.rank))


def _take_tagged(q, tag):
    """Remove and return the first message with ``tag`` from ``q``, or None."""
    for i, (t, a) in enumerate(q):
        if t == tag:
            del q[i]
            return a
    return None
