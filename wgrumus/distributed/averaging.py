"""The one gradient averager every data-parallel path uses (GradientAverager), the RUMUS-style
AllReduceSync built on it, and the EventLog that tests and benchmarks read."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from ..autograd import GradientStore, no_grad
from ..autograd.store import store_of
from ..kernels.map import run_map
from ..ops.elementwise import cast, copy_into, fill_
from ..tensor import Tensor, contiguous_strides
from .buckets import plan_buckets


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

    def record(self, replica: int, kind: str, bucket: int = -1, t: float | None = None) -> None:
        """An event now (or at ``t``, a ``time.perf_counter()`` reading taken earlier)."""
        e = Event(time.perf_counter() if t is None else t, replica, kind, bucket)
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


def flat_view(flat: Tensor, shape, offset: int) -> Tensor:
    """A contiguous view of ``flat`` (1-D) holding ``shape`` at element ``offset``."""
    return flat._view(tuple(shape), contiguous_strides(shape), flat.offset + offset)


class GradientAverager:
    """Bucketed mean of one rank's gradients over ``group`` (PyTorch DDP's reducer): as each
    gradient becomes final (``on_leaf_grad``) it joins its bucket, and complete buckets launch
    with ``all_reduce_async`` in plan order (the same collectives on every rank) while backward
    goes on. One backward: ``start`` -> ``on_leaf_grad``... -> ``finish``. ``comm_dtype=float16``
    sends half the bytes (PyTorch's fp16 compression hook): each gradient is divided by the world
    size and cast on the device, the halves are summed, and the sum is cast back to float32."""

    def __init__(self, params, group, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 names=None, plan=None, device=None, events: EventLog | None = None,
                 replica: int | None = None, comm_dtype=None):
        self.params, self.group = list(params), group
        self.comm_dtype = check_comm_dtype(comm_dtype)
        self.device = device if device is not None else self.params[0].device
        if self.comm_dtype is not None and "shader-f16" not in self.device.features:
            raise ValueError(f"float16 gradient communication needs the adapter feature "
                             f"shader-f16, which {self.device.name} does not have; send float32")
        self.plan = plan if plan is not None else plan_buckets(self.params, bucket_cap_mb,
                                                                first_bucket_mb, names)
        self.events = events
        self.replica = group.rank if replica is None else replica
        self._index = None
        self.start()

    def start(self, accumulated: GradientStore | None = None) -> GradientAverager:
        """Begin one backward; ``accumulated``: earlier micro-steps' gradients (no_sync)."""
        self.accumulated = accumulated
        self._grads: list = [None] * len(self.params)
        self._remaining = [len(b.params) for b in self.plan.buckets]
        self._works: list = [None] * len(self.plan.buckets)
        self._next = 0
        return self

    def on_leaf_grad(self, grad_id, grad) -> None:
        """Autograd callback: ``grad`` is final; launch every bucket that is now complete."""
        if self._index is None:
            self._index = {p.grad_id: i for i, p in enumerate(self.params)}
        i = self._index.get(grad_id)
        if i is None or i not in self.plan.bucket_of or self._grads[i] is not None:
            return  # an input that requires grad, or a frozen parameter
        if self.accumulated is not None and grad_id in self.accumulated:
            grad = grad + self.accumulated.get(grad_id)
        self._put(i, grad)

    def _put(self, i: int, grad) -> None:
        self._grads[i] = grad
        self._remaining[self.plan.bucket_of[i]] -= 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self._works) and self._remaining[self._next] == 0:
            self._launch(self._next)
            self._next += 1

    def _launch(self, b: int) -> None:
        def grad_of(i):  # unused in this backward: the earlier micro-steps' sum, or zero (DDP)
            g = self._grads[i]
            return g if g is not None or self.accumulated is None else \
                self.accumulated.get(self.params[i])
        flat = self.pack(b, grad_of)
        if self.events is not None:
            self.events.record(self.replica, "allreduce_start", b)
        # compressed: pre-divided in pack (no overflow of the half sum), so a plain sum
        self._works[b] = self.group.all_reduce_async(flat, "mean" if self._exact(b) else "sum")

    def _exact(self, b: int) -> bool:
        return self.comm_dtype is None or np.dtype(self.plan.buckets[b].dtype) != np.float32

    def pack(self, b: int, grad_of) -> Tensor:
        """Bucket ``b``'s gradients (``grad_of(i)``; None: zero) in one flat device buffer, in
        ``comm_dtype`` and divided by the world size when compressing."""
        bucket = self.plan.buckets[b]
        exact = self._exact(b)
        inv = 1.0 / self.group.world_size
        with no_grad():
            flat = Tensor.empty((bucket.numel,), self.device,
                                bucket.dtype if exact else self.comm_dtype)
            for i, shape, off in zip(bucket.params, bucket.shapes, bucket.offsets):
                g = grad_of(i)
                if g is None:
                    fill_(flat_view(flat, shape, off), 0.0)
                elif exact:
                    copy_into(flat_view(flat, shape, off), g)
                else:
                    run_map("a * s", flat_view(flat, shape, off), [g], scalars={"s": inv})
        return flat

    def _widen(self, flats) -> list:
        """The reduced buckets in their gradients' dtype (compressed ones cast back)."""
        with no_grad():
            return [f if self._exact(b) else cast(f, self.plan.buckets[b].dtype)
                    for b, f in enumerate(flats)]

    def unpack(self, flats) -> list:
        """Per parameter, its view of the bucket buffers ``flats`` (None: not in the plan)."""
        views: list = [None] * len(self.params)
        for bucket, flat in zip(self.plan.buckets, flats):
            for i, shape, off in zip(bucket.params, bucket.shapes, bucket.offsets):
                views[i] = flat_view(flat, shape, off)
        return views

    def store(self, views) -> GradientStore:
        """``views`` (aligned with ``params``) as a GradientStore keyed by ``params``."""
        return store_of(zip(self.params, views))

    def _finish_views(self, timeout: float | None) -> list:
        self._remaining = [0] * len(self._remaining)
        self._launch_ready()
        try:
            views = self.unpack(self._widen([w.wait(timeout) for w in self._works]))
        finally:
            self.start()
        if self.events is not None:
            self.events.record(self.replica, "sync_end")
        return views

    def finish(self, timeout: float | None = None) -> GradientStore:
        """Launch what is left (missing gradients count as zero) and return the averages."""
        return self.store(self._finish_views(timeout))

    def average(self, grads, timeout: float | None = None):
        """The mean of finished gradients: a GradientStore, or a list aligned with ``params``."""
        self.start()
        aligned = isinstance(grads, (list, tuple))
        for i in self.plan.bucket_of:
            g = grads[i] if aligned else grads.get(self.params[i])
            if g is not None:
                self._put(i, g)
        return self._finish_views(timeout) if aligned else self.finish(timeout)


def check_comm_dtype(comm_dtype):
    """None (exact, the gradients' own dtype) or float16; anything else is refused."""
    if comm_dtype is None:
        return None
    dt = np.dtype(comm_dtype)
    if dt == np.float32:
        return None
    if dt != np.float16:
        raise ValueError(f"comm_dtype must be float32 (exact) or float16 (half the bytes on the "
                         f"wire), got {dt}")
    return dt


class AllReduceSync:
    """RUMUS's AllReduceSync: average whole GradientStores across devices after backward (one
    spawned rank per device with a GradientAverager); the simple baseline of DataParallel."""

    def __init__(self, devices, timeout: float = 60.0):
        self.devices, self.timeout = list(devices), timeout
        if not self.devices:
            raise ValueError("AllReduceSync needs at least one device")

    def all_reduce(self, grad_stores, params) -> list:
        """Per device k, the averages of ``grad_stores[k]`` keyed by ``params[k]`` (the replicas'
        lists in one order); a missing gradient counts as zero."""
        from .launch import spawn
        k_dev = len(self.devices)
        if len(grad_stores) != k_dev or len(params) != k_dev:
            raise ValueError(f"AllReduceSync over {k_dev} devices got {len(grad_stores)} "
                             f"gradient stores and {len(params)} parameter lists")
        params = [list(ps) for ps in params]
        shapes = [[tuple(p.shape) for p in ps] for ps in params]
        for d, sh in enumerate(shapes):
            if sh != shapes[0]:
                raise ValueError(f"device {d}: parameter shapes {sh} != device 0's {shapes[0]}; "
                                 "every device needs the same parameter list (its replica's)")

        def rank(group):
            dev, ps, store = self.devices[group.rank], params[group.rank], \
                grad_stores[group.rank]
            grads = [store.get(p) for p in ps]
            grads = [g if g is None or g.device is dev else g.to(dev) for g in grads]
            avg = GradientAverager(ps, group, device=dev)
            return avg.store(avg.average(grads))

        return spawn(rank, k_dev, devices=self.devices, timeout=self.timeout)
