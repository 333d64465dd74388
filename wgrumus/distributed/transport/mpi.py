"""The MPI backend's transport: every call is nonblocking and polled against a deadline (a
blocking MPI call cannot time out); large all-reduces within one host go through shared memory
(node_shm.py). A failing rank sends an abort notice on a reserved tag that waiting ranks poll."""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from ..errors import CollectiveError
from . import node_shm
from .wire import (
    _DONE,
    _HEADER_WORDS,
    _SIG_BYTES,
    _Liveness,
    decode_header,
    encode_header,
    mismatch_error,
    split_bounds,
)


class _MPIState:
    """Process-wide MPI facts (world communicator, abort tag, a peer's abort), shared by every
    transport split off the world."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm
        self.abort_tag = int(comm.Get_attr(MPI.TAG_UB))
        self.error: CollectiveError | None = None
        self._sent_aborts: list = []

    def raise_if_failed(self) -> None:
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
        """Tell every other rank (best effort) that this rank failed; not on a mere timeout (the
        others time out too, and notices never received made MPICH kill ranks at Finalize)."""
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


class MPITransport(_Liveness):
    """One process's endpoint of an MPI communicator (the world, or a split of it)."""

    backend = "mpi"

    def __init__(self, comm, timeout: float = 60.0, state: _MPIState | None = None):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = float(timeout)
        self.state = self._live = state or _MPIState(comm)
        self.tag_ub = self.state.abort_tag - 1
        # All ranks on this host, WGRUMUS_MPI_SHARED not 0 and room in /dev/shm everywhere: large
        # native all-reduces use a shared window. Collective: every rank takes these steps.
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank = node.Get_rank()  # rank among this host's processes
        wanted = (os.environ.get("WGRUMUS_MPI_SHARED", "1") != "0"
                  and node.Get_size() == self.size and node_shm.fits(self.size))
        self._node_comm = node if comm.allreduce(int(wanted), op=MPI.MIN) else None
        if self._node_comm is None:
            node.Free()
        self._node_ar = None  # NodeAllReduce, False (none), or None (not made yet)
        self.stats = dict.fromkeys(("messages_sent", "bytes_sent", "messages_received",
                                    "bytes_received"), 0)

    def _poll(self, test, deadline: float, what: str, peer=None):
        # A timed-out request stays pending: cancelling a receive made MPICH kill the process at
        # MPI_Finalize, and the group is broken from here on anyway.
        spins = 0
        while not test():
            spins += 1
            if spins % 16 == 0:
                self.state.raise_if_failed()
            if time.monotonic() >= deadline:
                raise CollectiveError(f"rank {self.rank}: {what} within {self.timeout} s timeout",
                                      missing=[peer] if peer is not None else None,
                                      timed_out=True)
            # Spin briefly (MPI progresses only inside Test), then back off so oversubscribed
            # ranks and other Python threads get the CPU.
            time.sleep(0 if spins < 200 else min(1e-3, (spins - 199) * 2e-5))

    def _bytes(self, arr):
        return [arr, self.MPI.BYTE]

    def isend(self, dst, tag, arr, deadline, owned=False):
        arr = np.ascontiguousarray(arr)
        req = self.comm.Isend(self._bytes(arr), dst, tag)
        self._count("sent", arr.nbytes)
        return (req, arr)  # keep the buffer alive until the request completes

    def wait_all(self, reqs, deadline):
        reqs = [r for r in reqs if r is not _DONE]
        if reqs:
            mreqs = [r[0] for r in reqs]
            self._poll(lambda: self.MPI.Request.Testall(mreqs), deadline,
                       "send did not complete (receiver not receiving)")

    def recv(self, src, tag, deadline, dtype=None, shape=None):
        """The message from ``src`` with ``tag``, of ``shape`` or sized from the message."""
        if shape is not None and dtype is not None and all(s >= 0 for s in shape):
            buf = self._recv_known(src, tag, deadline, np.empty(shape, dtype=dtype))
        else:
            buf = self._recv_probed(src, tag, deadline, dtype, shape)
        self._count("received", buf.nbytes)
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
        """All ranks compare their collective ``seq`` (one small all-gather) before data moves."""
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

    def _mpi_type(self, dtype):
        # Predefined types only: MPI defines reductions on those, not on derived duplicates.
        t = self.MPI._typedict.get(np.dtype(dtype).char)
        if t is None:
            raise TypeError(f"MPI has no predefined datatype for {dtype}; use strategy 'ring'")
        return t

    def _op(self, op):
        MPI = self.MPI
        return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]

    def _run(self, start, deadline, what, out=None, op=None):
        """Poll the request ``start()`` returns; then ``out`` (divided by size for a mean)."""
        try:
            req = start()
            self._poll(req.Test, deadline, f"MPI {what} did not complete (a rank did not arrive)")
        except self.MPI.Exception as e:
            raise CollectiveError(f"rank {self.rank}: MPI {what} failed: {e}") from e
        if out is not None and op == "mean":
            np.divide(out, self.size, out=out)
        return out

    def native_all_reduce(self, arr, op, deadline):
        if self.native_shared(arr.nbytes) and (node := self._node(deadline)) is not None:
            return node.all_reduce(arr, op, deadline)
        t = self._mpi_type(arr.dtype)
        out = np.empty_like(arr)
        return self._run(lambda: self.comm.Iallreduce([arr, t], [out, t], self._op(op)),
                         deadline, "Iallreduce", out, op)

    def native_shared(self, nbytes: int) -> bool:
        """A native all-reduce of ``nbytes`` goes through the host's shared memory (faster)."""
        return self._node_comm is not None and nbytes >= node_shm.MIN_BYTES

    def device_chunk_bytes(self) -> int | None:
        """Bytes per chunk of a device all-reduce through the shared window; None before that
        window exists (it is made by the first such all-reduce, a collective call)."""
        return node_shm.CHUNK if self._node_ar else None

    def device_all_reduce(self, src, dst, op, deadline, early=None) -> bool:
        """All-reduce BufferSlice ``src`` into ``dst`` via the shared window; False without
        (``early``: the first downloads, issued already by the caller)."""
        node = self._node(deadline)
        if node is None:
            return False
        from ..staged_collectives import all_reduce
        all_reduce(src, node, node.rank, op, dst=dst, chunk_bytes=node_shm.CHUNK, early=early)
        return True

    def _node(self, deadline):
        """The shared-memory all-reduce (made at first use), or None where there is none."""
        if self._node_ar is None:
            self._node_ar = False
            if self._node_comm is not None:
                try:
                    self._node_ar = node_shm.NodeAllReduce(self, self._node_comm, deadline)
                except self.MPI.Exception:
                    self._node_comm = None
        return self._node_ar or None

    def native_reduce(self, arr, op, root, deadline):
        t = self._mpi_type(arr.dtype)
        out = np.empty_like(arr) if self.rank == root else None
        return self._run(lambda: self.comm.Ireduce([arr, t], [out, t] if out is not None else
                                                   None, self._op(op), root),
                         deadline, "Ireduce", out, op)

    def native_broadcast(self, arr, root, deadline):
        h = encode_header(arr) if self.rank == root else np.empty(_HEADER_WORDS, np.int64)
        self._run(lambda: self.comm.Ibcast([h, self.MPI.INT64_T], root), deadline, "Ibcast")
        dtype, shape = decode_header(h)
        out = np.array(arr, copy=True) if self.rank == root else np.empty(shape, dtype)
        return self._run(lambda: self.comm.Ibcast(self._bytes(out), root), deadline, "Ibcast", out)

    def native_all_gather(self, arr, deadline):
        tail = arr.shape[1:]
        mine, rows = np.array([arr.shape[0]], np.int64), np.empty(self.size, np.int64)
        self._run(lambda: self.comm.Iallgather([mine, self.MPI.INT64_T],
                                               [rows, self.MPI.INT64_T]), deadline, "Iallgather")
        counts = rows * int(np.prod(tail, dtype=np.int64)) * arr.dtype.itemsize
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out = np.empty((int(rows.sum()),) + tail, dtype=arr.dtype)
        return self._run(lambda: self.comm.Iallgatherv(
            self._bytes(arr), [out, (counts, displs), self.MPI.BYTE]), deadline, "Iallgatherv", out)

    def native_reduce_scatter(self, arr, op, deadline):
        t = self._mpi_type(arr.dtype)
        row = int(np.prod(arr.shape[1:], dtype=np.int64))
        b = split_bounds(arr.shape[0], self.size)
        counts = [(b[i + 1] - b[i]) * row for i in range(self.size)]
        out = np.empty((b[self.rank + 1] - b[self.rank],) + arr.shape[1:], dtype=arr.dtype)
        return self._run(lambda: self.comm.Ireduce_scatter([arr, t], [out, t], counts,
                                                           self._op(op)),
                         deadline, "Ireduce_scatter", out, op)

    def native_barrier(self, deadline):
        self._run(self.comm.Ibarrier, deadline, "Ibarrier")

    def split(self, key, color, members):
        MPI = self.MPI
        # Every member just took part in the all-gather that chose the colors, so this blocking
        # call cannot wait on a dead rank.
        sub = self.comm.Split(MPI.UNDEFINED if color is None else int(color),
                              members.index(self.rank) if color is not None else 0)
        if sub == MPI.COMM_NULL:
            return None
        return MPITransport(sub, self.timeout, self.state)
