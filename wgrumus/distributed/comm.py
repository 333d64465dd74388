"""CommThread: one thread per device that all-reduces device buffers in the background through
the pipelined staging engine, so the compute thread goes on recording work until
``AllReduceHandle.wait()`` (leave the buffer alone until then)."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from ..runtime.buffer_slice import BufferSlice
from . import staged_collectives
from .barrier import CollectiveBarrier
from .errors import CollectiveError
from .host_reduce import check_op


def storage_of(x) -> BufferSlice:
    """The BufferSlice holding ``x`` (a BufferSlice, or a tensor's ``buffer_slice()``)."""
    if isinstance(x, BufferSlice):
        return x
    fn = getattr(x, "buffer_slice", None)
    if fn is None:
        raise TypeError(f"async_allreduce needs a BufferSlice or a contiguous tensor with "
                        f"buffer_slice(); got {type(x).__name__}")
    return fn()


class AllReduceHandle:
    """Completion of one asynchronous all-reduce."""

    def __init__(self, target):
        self.target = target
        self._done = threading.Event()
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None):
        """The all-reduced object once in place, or the comm thread's failure; a timeout raises
        CollectiveError(timed_out=True) while the operation goes on."""
        if not self._done.wait(timeout):
            raise CollectiveError(f"all-reduce not finished within {timeout} s (still running)",
                                  timed_out=True)
        if self._error is not None:
            raise self._error
        return self.target

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()


@dataclass
class _Request:
    storage: BufferSlice
    barrier: CollectiveBarrier
    op: str
    handle: AllReduceHandle
    dst: BufferSlice | None
    early: staged_collectives.EarlyDownload


class CommThread:
    """A communication thread for one device; ``rank``: its participant number in the barriers
    (default the device's index). Requests run in submission order."""

    def __init__(self, device, rank: int | None = None, chunk_bytes: int | None = None,
                 depth: int = 16, inflight: int | None = None):
        self.device = device
        self.rank = int(device.index if rank is None else rank)
        # None: the engine's CHUNK_BYTES (and its downloads in flight) when each request runs
        self.chunk_bytes = None if chunk_bytes is None else max(256, chunk_bytes // 256 * 256)
        self.inflight = inflight
        self._requests: queue.Queue = queue.Queue(maxsize=depth)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"wgrumus-comm{self.rank}")
        self._thread.start()

    def __repr__(self):
        return f"CommThread(rank {self.rank}, {self.device!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def submit(self, storage: BufferSlice, barrier: CollectiveBarrier, op: str = "mean",
               target=None, dst: BufferSlice | None = None) -> AllReduceHandle:
        """Queue an all-reduce of ``storage`` into ``dst`` (default: in place); blocks only when
        ``depth`` requests wait. Its first downloads are issued here, by the calling thread, in
        order after the work it recorded (staged_collectives.EarlyDownload)."""
        if self._closed:
            raise CollectiveError(f"{self!r} is closed; start a new CommThread")
        for s in (storage, dst if dst is not None else storage):
            if s.device is not self.device:
                raise ValueError(f"buffer lives on {s.device!r}, this comm thread serves "
                                 f"{self.device!r}; submit it to that device's CommThread")
        if not 0 <= self.rank < barrier.world_size:
            raise ValueError(f"rank {self.rank} outside the barrier's {barrier.world_size} "
                             "participants; pass CommThread(device, rank=...)")
        check_op(op, storage.dtype)
        handle = AllReduceHandle(storage if target is None else target)
        early = staged_collectives.EarlyDownload(storage, self.chunk_bytes, self.inflight)
        try:
            self._requests.put(_Request(storage, barrier, op, handle, dst, early))
        except BaseException:
            early.release()
            raise
        return handle

    def close(self, timeout: float | None = None) -> None:
        """Finish queued requests, then stop the thread."""
        if not self._closed:
            self._closed = True
            self._requests.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            req = self._requests.get()
            if req is None:
                return
            try:
                self._all_reduce(req)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                if not isinstance(e, CollectiveError):
                    req.barrier.abort(e)  # the other devices must not wait for us
                req.early.release()  # (nothing left once the engine took them over)
                req.handle._finish(e)
            else:
                req.handle._finish()

    def _all_reduce(self, req: _Request) -> None:  # (a jitter point of benchmarks/reliability.py)
        staged_collectives.all_reduce(req.storage, req.barrier, self.rank, req.op, dst=req.dst,
                                      chunk_bytes=self.chunk_bytes, inflight=self.inflight,
                                      early=req.early)


def async_allreduce(comm: CommThread, x, barrier: CollectiveBarrier,
                    op: str = "mean") -> AllReduceHandle:
    """All-reduce ``x`` (a BufferSlice or tensor) in place across the barrier's participants on
    ``comm``'s thread; returns a handle whose ``wait()`` returns ``x`` once done."""
    return comm.submit(storage_of(x), barrier, op, target=x)
