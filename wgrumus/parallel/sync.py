"""Gradient synchronisation across data-parallel replicas.

- ``GradReducer``: one replica's bucketed all-reduce during one backward (PyTorch DDP's reducer).
  The autograd engine calls ``on_leaf_grad`` as each parameter's gradient becomes final; when a
  bucket's last gradient arrives the bucket is packed into one flat device buffer and its
  all-reduce is launched on the communication backend while backward goes on. Buckets launch in
  plan order on every replica (a ready bucket waits for the ones before it), so all replicas
  issue the same collectives in the same order.
- ``ThreadComm`` / ``MPIComm``: the two communication backends behind one small interface
  (``launch(rank, flat) -> handle with wait(timeout)``, ``abort``, ``reset``, ``close``).
- ``AllReduceSync``: RUMUS-style averaging of whole GradientStores after backward (no overlap).
- ``EventLog``: timestamped events (bucket launches, backward ends) that tests and benchmarks read.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from ..autograd import GradientStore, no_grad
from ..distributed import CollectiveBarrier, CollectiveError, CommThread, async_allreduce
from ..ops.elementwise import copy_into, fill_
from ..tensor import Tensor, contiguous_strides


# ---------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Event:
    t: float        # time.perf_counter()
    replica: int
    kind: str       # forward_start, backward_start, allreduce_start, backward_end, sync_end, ...
    bucket: int = -1


class EventLog:
    """Thread-safe, append-only list of Events in the order they happened."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def record(self, replica: int, kind: str, bucket: int = -1) -> None:
        e = Event(time.perf_counter(), replica, kind, bucket)
        with self._lock:
            self._events.append(e)

    def clear(self) -> None:
        with self._lock:
            self._events = []

    def events(self, replica: int | None = None, kind: str | None = None) -> list[Event]:
        with self._lock:
            evs = list(self._events)
        return [e for e in evs if (replica is None or e.replica == replica)
                and (kind is None or e.kind == kind)]

    def exposed_comm_seconds(self, replica: int) -> float:
        """Time this replica waited for communication after its backward ended."""
        end = self.events(replica, "backward_end")
        done = self.events(replica, "sync_end")
        return max(0.0, done[-1].t - end[-1].t) if end and done else 0.0


# ---------------------------------------------------------------------------------- backends
class ThreadComm:
    """One CommThread per device and one CollectiveBarrier: the in-process backend."""

    def __init__(self, devices, timeout: float):
        self.timeout = timeout
        self.comms = [CommThread(d, rank=k) for k, d in enumerate(devices)]
        self.barrier = CollectiveBarrier(len(devices), timeout=timeout)

    def launch(self, rank: int, flat: Tensor):
        """In-place mean of ``flat`` over all replicas; ``wait()`` returns ``flat``."""
        return async_allreduce(self.comms[rank], flat, self.barrier, "mean")

    def abort(self, exc: BaseException) -> None:
        self.barrier.abort(exc)

    def reset(self) -> None:
        """After a failed step: a fresh barrier (a broken one stays broken by design)."""
        if self.barrier.broken:
            self.barrier = CollectiveBarrier(len(self.comms), timeout=self.timeout)

    def close(self, timeout: float | None = None) -> None:
        for c in self.comms:
            c.close(self.timeout if timeout is None else timeout)


class _FutureHandle:
    def __init__(self, fut):
        self._fut = fut

    def done(self) -> bool:
        return self._fut.done()

    def wait(self, timeout: float | None = None):
        try:
            return self._fut.result(timeout)
        except FutureTimeout:
            raise CollectiveError(f"all-reduce not finished within {timeout} s",
                                  timed_out=True) from None


class MPIComm:
    """This process's ProcessGroup; bucket all-reduces run in order on one background thread, so
    they overlap backward like the CommThreads do in-process."""

    def __init__(self, group, timeout: float):
        self.group = group
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"wgrumus-dp-comm{group.rank}")

    def launch(self, rank: int, flat: Tensor):
        return _FutureHandle(self._pool.submit(self.group.all_reduce, flat, "mean"))

    def abort(self, exc: BaseException) -> None:
        self.group.abort(exc)

    def reset(self) -> None:
        pass  # a broken process group cannot be repaired; its next call raises clearly

    def close(self, timeout: float | None = None) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------- reducer
def flat_view(flat: Tensor, shape, offset: int) -> Tensor:
    """A contiguous view of ``flat`` (1-D) holding ``shape`` at element ``offset``."""
    return flat._view(tuple(shape), contiguous_strides(shape), flat.offset + offset)


def _pack(flat: Tensor, shape, offset: int, g) -> None:
    """Write gradient ``g`` (or zeros where it is None: an unused parameter) into ``flat``."""
    dst = flat_view(flat, shape, offset)
    if g is None:
        fill_(dst, 0.0)
    else:
        copy_into(dst, g)


class GradReducer:
    """Bucketed, overlapped gradient all-reduce of one replica during one backward."""

    def __init__(self, plan, params, rank: int, comm, events: EventLog | None = None,
                 accumulated: GradientStore | None = None):
        self.plan, self.params, self.rank, self.comm = plan, list(params), rank, comm
        self.events = events
        self.accumulated = accumulated  # earlier micro-steps' gradients (no_sync)
        self.device = self.params[0].device if self.params else None
        self._index = {p.grad_id: i for i, p in enumerate(self.params)}
        self._grads: list = [None] * len(self.params)
        self._remaining = [len(b.params) for b in plan.buckets]
        self._handles: list = [None] * len(plan.buckets)
        self._next = 0

    def on_leaf_grad(self, grad_id, grad) -> None:
        """Autograd callback: ``grad`` is final; launch every bucket that is now complete."""
        i = self._index.get(grad_id)
        if i is None or i not in self.plan.bucket_of or self._grads[i] is not None:
            return  # an input that requires grad, or a frozen parameter
        if self.accumulated is not None and grad_id in self.accumulated:
            grad = grad + self.accumulated.get(grad_id)
        self._grads[i] = grad
        self._remaining[self.plan.bucket_of[i]] -= 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self._handles) and self._remaining[self._next] == 0:
            self._launch(self._next)
            self._next += 1

    def _launch(self, b: int) -> None:
        bucket = self.plan.buckets[b]
        with no_grad():
            flat = Tensor.empty((bucket.numel,), self.device, bucket.dtype)
            for i, shape, off in zip(bucket.params, bucket.shapes, bucket.offsets):
                g = self._grads[i]
                if g is None and self.accumulated is not None:
                    g = self.accumulated.get(self.params[i])
                _pack(flat, shape, off, g)  # unused in this backward: zero, as in DDP
        if self.events is not None:
            self.events.record(self.rank, "allreduce_start", b)
        self._handles[b] = self.comm.launch(self.rank, flat)

    def finish(self, timeout: float) -> GradientStore:
        """Backward is over: launch what is left (gradients never produced count as zero), wait
        for every bucket, and return the averaged gradients keyed by this replica's params."""
        self._remaining = [0] * len(self._remaining)
        self._launch_ready()
        store = GradientStore()
        for b, h in enumerate(self._handles):
            flat = h.wait(timeout)
            bucket = self.plan.buckets[b]
            for i, shape, off in zip(bucket.params, bucket.shapes, bucket.offsets):
                store.accumulate(self.params[i], flat_view(flat, shape, off))
        if self.events is not None:
            self.events.record(self.rank, "sync_end")
        return store


# ---------------------------------------------------------------------------------- RUMUS style
class AllReduceSync:
    """Average whole GradientStores across devices after backward (RUMUS's AllReduceSync).

    The four phases of the original, with one flat buffer per device instead of one staging
    buffer per parameter: (1) pack each device's gradients into one flat buffer and submit its
    copy to a mappable staging buffer, on every device before waiting on any; (2) start the maps;
    (3) wait for them; (4) average on the host in device order and upload the result to every
    device. No overlap with backward: ``DataParallel`` does that; this is the simple baseline.
    """

    def __init__(self, devices):
        self.devices = list(devices)
        if not self.devices:
            raise ValueError("AllReduceSync needs at least one device")

    def all_reduce(self, grad_stores, params) -> list:
        """``grad_stores[k]`` holds device k's gradients of ``params[k]`` (one parameter list per
        device, the replicas, in the same order). Returns one GradientStore per device with the
        averaged gradients, keyed by that device's parameters. A gradient missing from a store
        (parameter unused there) counts as zero."""
        k_dev = len(self.devices)
        if len(grad_stores) != k_dev or len(params) != k_dev:
            raise ValueError(f"AllReduceSync over {k_dev} devices got {len(grad_stores)} "
                             f"gradient stores and {len(params)} parameter lists")
        params = [list(ps) for ps in params]
        n = len(params[0])
        if any(len(ps) != n for ps in params):
            raise ValueError("every device needs the same parameter list (its replica's)")
        shapes = [tuple(p.shape) for p in params[0]]
        offs = np.cumsum([0] + [int(np.prod(s)) for s in shapes])
        flats, downloads = [], []
        with no_grad():
            for d, (store, ps) in enumerate(zip(grad_stores, params)):  # phases 1 + 2
                dev = self.devices[d]
                flat = Tensor.empty((int(offs[-1]),), dev)
                for p, shape, off in zip(ps, shapes, offs[:-1]):
                    if tuple(p.shape) != shape:
                        raise ValueError(f"device {d}: parameter shape {tuple(p.shape)} != "
                                         f"device 0's {shape}")
                    g = store.get(p)
                    if g is not None and g.device is not dev:
                        g = g.to(dev)
                    _pack(flat, shape, int(off), g)
                flats.append(flat)
                downloads.append(dev.read_start(flat._storage.buffer, 0, flat.numel() * 4))
        arrays = [dl.array(np.float32) for dl in downloads]  # phase 3
        mean = arrays[0].copy()  # phase 4, in device order so every device gets the same bits
        for a in arrays[1:]:
            mean += a
        mean /= np.float32(k_dev)
        out = []
        for d, (flat, ps) in enumerate(zip(flats, params)):
            self.devices[d].write(flat._storage.buffer, mean)
            st = GradientStore()
            for p, shape, off in zip(ps, shapes, offs[:-1]):
                st.accumulate(p, flat_view(flat, shape, int(off)))
            out.append(st)
        return out


# ---------------------------------------------------------------------------------- ZeRO-1
class OptimizerSharding:
    """ZeRO stage 1 (DeepSpeed; PyTorch's ZeroRedundancyOptimizer): every parameter has one
    owner replica, the owners' parameter counts balanced greedily (largest first). After the
    gradient all-reduce each replica steps only the parameters it owns, so its optimizer creates
    state (Adam's moments) for about 1/N of the model; then every owner's updated parameters
    reach the other replicas (one packed buffer per owner), so all replicas stay identical."""

    def __init__(self, params, world: int):
        self.world = world
        self.owner = [0] * len(params)
        load = [0] * world
        for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
            r = min(range(world), key=lambda r: (load[r], r))
            self.owner[i] = r
            load[r] += params[i].numel()
        self.owned = [[i for i in range(len(params)) if self.owner[i] == r]
                      for r in range(world)]

    def owned_grads(self, rank: int, params, grads: GradientStore) -> GradientStore:
        """The part of ``grads`` this replica's optimizer steps."""
        out = GradientStore()
        for i in self.owned[rank]:
            g = grads.get(params[i])
            if g is not None:
                out.accumulate(params[i], g)
        return out

    def _pack(self, rank: int, params) -> Tensor:
        ps = [params[i] for i in self.owned[rank]]
        flat = Tensor.empty((sum(p.numel() for p in ps),), params[0].device)
        off = 0
        with no_grad():
            for p in ps:
                copy_into(flat_view(flat, p.shape, off), p)
                off += p.numel()
        return flat

    def _unpack(self, rank: int, params, flat: Tensor) -> None:
        off = 0
        with no_grad():
            for i in self.owned[rank]:
                copy_into(params[i], flat_view(flat, params[i].shape, off))
                off += params[i].numel()

    def gather_threads(self, replica_params: list) -> None:
        """In-process replicas (``replica_params[k]``: replica k's parameter list)."""
        for r in range(self.world):
            if not self.owned[r]:
                continue
            flat = self._pack(r, replica_params[r])
            for k, ps in enumerate(replica_params):
                if k != r:
                    self._unpack(r, ps, flat.to(ps[0].device))

    def gather_group(self, group, params) -> None:
        """One replica per process: each owner broadcasts its packed parameters."""
        for r in range(self.world):
            if not self.owned[r]:
                continue
            if group.rank == r:
                group.broadcast(self._pack(r, params), root=r)
            else:
                n = sum(params[i].numel() for i in self.owned[r])
                like = Tensor.empty((n,), params[0].device)
                self._unpack(r, params, group.broadcast(like, root=r))
