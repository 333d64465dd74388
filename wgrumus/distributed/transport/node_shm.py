"""All-reduce between the MPI processes of one host through a shared-memory window: each rank
copies its chunk into its slot, rank r reduces slice r over all slots in rank order into slot 0,
and all copy slot 0 out (52 MB on the H100 host: 18 ms, against ~45 ms for MPICH's Iallreduce;
BENCHMARKS.md's MPI all-reduce row). Two slot sets alternate, so a chunk needs two polled
Ibarriers (a dead rank means a CollectiveError at the deadline, never a hang).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import time

import numpy as np

from ...runtime.staging import par_ranges
from ..host_reduce import reduce_into
from .wire import split_bounds

CHUNK = 8 << 20  # bytes per slot
MIN_BYTES = 256 << 10  # below this MPI's own all-reduce has the lower latency
PIECE = 1 << 18  # items per copy/reduce thread


def fits(ranks: int) -> bool:
    """/dev/shm has room for the window twice over (MPICH backs it there; too large a window
    dies with SIGBUS at first touch, e.g. in a container's 64 MiB default)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return True
    return st.f_bavail * st.f_frsize >= 2 * ranks * 2 * CHUNK


class NodeAllReduce:
    """The shared window of one communicator whose ranks all run on this host."""
    gathers = True  # exchange rounds without an op gather (staged_collectives' float16 sums)

    def __init__(self, transport, node_comm, deadline):
        MPI = transport.MPI
        self.t, self.comm = transport, node_comm
        self.rank, self.size = node_comm.Get_rank(), node_comm.Get_size()
        transport.native_barrier(deadline)  # all present, so the blocking calls below return
        self.win = MPI.Win.Allocate_shared(2 * CHUNK, 1, comm=node_comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        atexit.register(self._unlock)  # before mpi4py's MPI_Finalize (atexit runs LIFO)
        self.chunks = 0  # chunks reduced so far: the slot set alternates across calls too
        self.slots = []  # [rank][set] -> uint8 array of CHUNK bytes
        for r in range(self.size):
            mem, _ = self.win.Shared_query(r)
            flat = np.frombuffer(mem, np.uint8, 2 * CHUNK)
            self.slots.append((flat[:CHUNK], flat[CHUNK:]))

    def _unlock(self) -> None:
        """End the access epoch (local: a collective free could hang a failed rank's peers)."""
        with contextlib.suppress(Exception):
            self.win.Unlock_all()

    @property
    def timeout(self) -> float:
        return self.t.timeout

    def abort(self, err) -> None:
        """(The pipelined engine's call on a local failure: the group tells the peers.)"""

    @property
    def world_size(self) -> int:
        return self.size

    def exchange(self, length, dtype, rank, item, item_at, out, out_at, op) -> None:
        """One chunk of the pipelined staging engine, on its mapped buffers: reduced, or
        without ``op`` gathered (every rank's item side by side in rank order in ``out``)."""
        if op is None:
            self._gather(item, out, time.monotonic() + self.timeout)
        else:
            self._chunk(item, out, op, time.monotonic() + self.timeout)

    def _gather(self, src, out, deadline) -> None:
        n, k = src.size, self.chunks
        self.chunks += 1
        views = [s[k % 2][:src.nbytes].view(src.dtype) for s in self.slots]
        mine = views[self.rank]
        par_ranges(lambda a, b: np.copyto(mine[a:b], src[a:b]), n, PIECE)
        self._fence(deadline)
        for r, v in enumerate(views):
            par_ranges(lambda a, b, lo=r * n, v=v: np.copyto(out[lo + a:lo + b], v[a:b]), n,
                       PIECE)

    def _fence(self, deadline):
        self.win.Sync()
        self.t._run(self.comm.Ibarrier, deadline, "Ibarrier (shared-memory all-reduce)")
        self.win.Sync()

    def all_reduce(self, arr: np.ndarray, op: str, deadline) -> np.ndarray:
        src = np.ascontiguousarray(arr).reshape(-1)
        out = np.empty_like(src)
        per = CHUNK // src.dtype.itemsize
        for lo in range(0, src.size, per):
            hi = min(lo + per, src.size)
            self._chunk(src[lo:hi], out[lo:hi], op, deadline)
        return out.reshape(arr.shape)

    def _chunk(self, src, out, op, deadline) -> None:
        n, k = src.size, self.chunks
        self.chunks += 1
        views = [s[k % 2][:src.nbytes].view(src.dtype) for s in self.slots]
        mine, dst = views[self.rank], views[0]
        par_ranges(lambda a, b: np.copyto(mine[a:b], src[a:b]), n, PIECE)
        self._fence(deadline)
        bounds = split_bounds(n, self.size)
        lo = bounds[self.rank]

        def reduce(a, b):  # into slot 0 itself, which is the first input
            reduce_into(dst[lo + a:lo + b], [v[lo + a:lo + b] for v in views], op, self.size)
        if self.size > 1:
            par_ranges(reduce, bounds[self.rank + 1] - lo, PIECE)
        self._fence(deadline)
        par_ranges(lambda a, b: np.copyto(out[a:b], dst[a:b]), n, PIECE)
