"""Asynchronous pipeline sends and receives for one rank, over either backend's ProcessGroup (as
PyTorch's pipelining issues its P2P ops): a send starts the device download in the stage's own
stream order (the copy rides in the submission of the work that produced the tensor) and returns
at once; a send lane waits for the bytes and hands them to the peer while the stage computes on.
A receive is posted ahead on a receive lane and waited where the data is needed; the upload runs
on the waiting thread, so a ``wr.jit`` capture sees no foreign device work.

Messages from rank ``r`` travel on a group of their own (``from_rank[r]``, a split of the
pipeline group), so a rank's send lane and receive lane never share a group: a blocking receive
cannot hold back a send its peer waits for. Every wait has the group's timeout; a peer failing
mid-transfer fails the lanes' calls with a CollectiveError that every waiting rank raises."""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from ..device_collectives import movable_slice
from ..errors import CollectiveError


class _Lane:
    """One daemon thread running submitted calls in order (a send or a receive lane)."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._t = threading.Thread(target=self._main, name=name, daemon=True)
        self._t.start()

    def submit(self, fn) -> Future:
        fut: Future = Future()
        self._q.put((fn, fut))
        return fut

    def _main(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                fut.set_exception(e)

    def close(self) -> None:
        self._q.put(None)

    def join(self, timeout: float | None = None) -> None:
        self._t.join(timeout)


class P2PWork:
    """A send or receive in flight: ``wait(timeout=None)`` returns None (send) or the received
    Tensor (receive on a device) / array; failures raise CollectiveError."""

    def __init__(self, p2p: PipelineP2P, fut: Future, what: str, op: str, nbytes: int = 0,
                 finish=None):
        self._p2p, self._fut, self._what, self._finish = p2p, fut, what, finish
        self._op, self._nbytes = op, nbytes
        self._done, self._result = False, None

    def done(self) -> bool:
        return self._done or self._fut.done()

    def wait(self, timeout: float | None = None):
        if self._done:
            return self._result
        limit = self._p2p.timeout + 5.0 if timeout is None else timeout
        t0 = time.perf_counter()
        try:
            out = self._fut.result(limit)
        except FutureTimeout:
            err = CollectiveError(f"rank {self._p2p.rank}: {self._what} did not finish within "
                                  f"{limit:g} s", timed_out=True)
            self._p2p.abort(err)
            raise err from None
        except CollectiveError:
            raise
        except BaseException as e:
            err = CollectiveError(f"rank {self._p2p.rank}: {self._what} failed: "
                                  f"{type(e).__name__}: {e}", rank=self._p2p.rank)
            self._p2p.abort(err)
            raise err from e
        self._result = self._finish(out) if self._finish is not None else out
        self._done = True
        nbytes = self._nbytes if out is None else out.nbytes
        # counted on the pipeline group: calls, bytes and the time this rank waited for them
        self._p2p.group._record(self._op, nbytes, time.perf_counter() - t0)
        self._fut = None  # drop the lane's reference to the payload
        return self._result


class PipelineP2P:
    """Rank ``group.rank``'s asynchronous point-to-point over ``group`` (every rank of the group
    constructs it at the same point: it splits the group). ``isend``/``irecv`` -> P2PWork."""

    def __init__(self, group):
        self.group, self.rank, self.world_size = group, group.rank, group.world_size
        self.timeout = group.timeout
        self.from_rank = [group.split(0, name=f"{group.name}/from{r}")
                          for r in range(group.world_size)]
        name = f"wgrumus-{group.name}-rank{group.rank}"
        self._send, self._recv = _Lane(name + "-send"), _Lane(name + "-recv")

    def isend(self, x, dst: int, tag: int = 0) -> P2PWork:
        """Start sending ``x`` (a Tensor or an array) to ``dst``: a device tensor's download is
        issued now, behind the work that produces it; the rest happens on the send lane."""
        g = self.from_rank[self.rank]
        g._check_rank(dst, "dst")
        if dst == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to itself")
        s = movable_slice(x) if hasattr(x, "device") else None
        if s is not None:
            shape = tuple(x.shape)
            dl = s.device.read_start(s.buffer, s.offset, s.nbytes)

            def go():
                arr = np.frombuffer(dl.result(), dtype=s.dtype).reshape(shape)
                g.isend(arr, dst, tag).wait()
            nbytes = s.nbytes
        else:
            if hasattr(x, "numpy"):
                x = x.numpy()  # (non-contiguous or unaligned: read here, in order)
            arr = np.array(x, copy=True, order="C")
            nbytes = arr.nbytes

            def go():
                g.isend(arr, dst, tag).wait()
        return P2PWork(self, self._send.submit(go), f"send to rank {dst} (tag {tag})", "send",
                       nbytes)

    def irecv(self, src: int, tag: int = 0, device=None) -> P2PWork:
        """Post the receive of what ``src`` sends with ``tag``; ``wait()`` gives it as a Tensor
        on ``device`` (uploaded by the waiting thread) or, without one, as an array."""
        g = self.from_rank[self.group._check_rank(src, "src")]
        if src == self.rank:
            raise ValueError(f"rank {self.rank} cannot receive from itself")

        def finish(arr):
            if device is None:
                return arr
            from ...tensor import tensor
            return tensor(arr, device=device)
        return P2PWork(self, self._recv.submit(lambda: g.recv(src, tag)),
                       f"receive from rank {src} (tag {tag})", "recv", finish=finish)

    def abort(self, err: CollectiveError) -> None:
        """Break the groups: peers waiting on this rank raise now, not at their timeout."""
        for g in (self.group, *self.from_rank):
            g.abort(err)

    def close(self) -> None:
        """Stop the lanes (calls still queued never run)."""
        self._send.close()
        self._recv.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

