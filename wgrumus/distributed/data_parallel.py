"""DataParallel: one replica per device (``threads``) or process (``mpi``), each on its own thread
and tape, gradients all-reduced in buckets while backward still runs (PyTorch DDP's scheme); the
replicas step with bit-identical gradients, so they stay identical without re-broadcasting."""
from __future__ import annotations

import contextlib
import copy
import hashlib

import numpy as np

from ..autograd import backward_with_grad, is_grad_enabled, no_grad
from ..autograd.store import grads_of, store_of
from ..ops.creation import full
from ..ops.elementwise import clone, copy_into
from ..ops.shape import cat
from ..runtime import Device
from ..runtime.capture import refuse
from ..runtime.context import MultiGpuContext, get_device
from ..runtime.errors import WgrumusError
from ..tensor import Tensor, tensor
from .averaging import EventLog, GradientAverager, check_comm_dtype
from .buckets import plan_buckets
from .collectives import CollectiveConfig
from .engine import Worker, run_jobs
from .errors import CollectiveError
from .launch import PER_PROCESS
from .pipeline.stage import moved_to
from .process_group import ProcessGroup
from .transport import ThreadWorld
from .zero import OptimizerSharding


class ReplicaError(WgrumusError):
    """A replica failed during a data-parallel step; ``replica`` and ``phase`` say where."""

    def __init__(self, msg, replica: int, phase: str):
        super().__init__(msg)
        self.replica, self.phase = replica, phase


def _walk_tensors(obj, found: dict, seen: set) -> None:
    """Every Tensor reachable from a module through attributes, lists, tuples and dicts."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Tensor):
        found[id(obj)] = obj
        return
    if isinstance(obj, (Device, str, bytes, int, float, bool, type(None), np.ndarray, type)):
        return
    if isinstance(obj, dict):
        for v in obj.values():
            _walk_tensors(v, found, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _walk_tensors(v, found, seen)
    elif hasattr(obj, "__dict__") and not callable(getattr(obj, "__func__", None)):
        for v in vars(obj).values():
            _walk_tensors(v, found, seen)


def _copy_tensor(t: Tensor, device) -> Tensor:
    """``t``'s class and values on ``device``, with its own storage and GradId."""
    with no_grad():
        data = clone(t.detach()) if t.device is device else t.detach().to(device)
    new = copy.copy(t)
    new.storage, new.shape, new.strides, new.offset = (data.storage, data.shape, data.strides,
                                                       data.offset)
    new._node, new._grad_id, new.grad, new.requires_grad = None, None, None, False
    if t.requires_grad:
        new.requires_grad_(True)
    return new


def replicate(module, device):
    """A deep copy of ``module`` on ``device`` (devices themselves are shared, not copied)."""
    device = get_device(device)
    tensors: dict = {}
    _walk_tensors(module, tensors, set())
    memo = {id(t): _copy_tensor(t, device) for t in tensors.values()}
    for d in MultiGpuContext.get().devices:
        memo[id(d)] = d
    return moved_to(copy.deepcopy(module, memo), device)


def _state_tensors(module) -> list:
    """Parameters, then buffers (e.g. BatchNorm statistics): what replicas must agree on."""
    ts = list(module.parameters())
    if hasattr(module, "buffers"):
        ts += [b for b in module.buffers() if isinstance(b, Tensor)]
    return ts


def shard_sizes(batch: int, parts: int) -> list[int]:
    """Split ``batch`` rows as evenly as possible (the first ``batch % parts`` get one more)."""
    if batch < parts:
        raise ValueError(f"DataParallel: a batch of {batch} sample(s) cannot be split over "
                         f"{parts} replicas (each needs at least one); use a global batch of at "
                         f"least {parts} or fewer devices")
    q, r = divmod(batch, parts)
    return [q + (1 if k < r else 0) for k in range(parts)]


def _rows(x, lo: int, hi: int, device):
    """Rows [lo, hi) of ``x`` (numpy array or Tensor) as a Tensor on ``device``."""
    if x is None:
        return None
    if isinstance(x, Tensor):
        with no_grad():
            part = x[lo:hi]
            return part.to(device) if part.device is not device else part
    return tensor(np.ascontiguousarray(np.asarray(x)[lo:hi]), device=device)


def _check_loss(loss):
    if loss.numel() != 1:
        raise ValueError(f"loss_fn must return one value (the mean over the shard), got shape "
                         f"{loss.shape}")
    return loss


class DataParallel:
    """Replicas of ``module`` (replica 0, moved to ``devices[0]``) on ``devices``. ``backend=
    "processes"`` or ``"mpi"``: this process holds one replica (device ``rank %
    len(wr.devices())``) joined by ``group`` (default ``init_process_group(backend)``); every
    process passes the same batch.
    ``shard_optimizer_state=True`` is ZeRO-1. ``jit=True`` replays each replica's step from a
    ``wr.jit`` capture, buckets still overlapping backward (``no_sync`` steps run eagerly).
    ``comm_dtype=wr.float16`` sends the gradients as float16 (half the bytes; close to exact)."""

    def __init__(self, module, devices=None, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, backend: str = "threads", group=None,
                 timeout: float = 60.0, shard_optimizer_state: bool = False,
                 jit: bool = False, comm_dtype=None):
        if backend not in ("threads", *PER_PROCESS):
            raise ValueError(f"unknown backend {backend!r}; use 'threads', 'processes' or "
                             "'mpi'")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if jit and shard_optimizer_state:
            raise ValueError("DataParallel(jit=True, shard_optimizer_state=True) is not supported "
                             "yet: the captured optimizer step updates every parameter; use "
                             "one of the two")
        self.backend, self.timeout = backend, float(timeout)
        self.comm_dtype = check_comm_dtype(comm_dtype)
        if backend in PER_PROCESS:
            devs = [get_device(devices[0])] if devices else None
            from .launch import init_process_group, rank_device
            if group is None:  # before any device: it opens this rank's adapter only
                group = init_process_group(backend, timeout=timeout)
            self.world_size = group.world_size
            if devs is None:
                devs = [group.device or rank_device(group.rank)]
        else:
            all_devs = MultiGpuContext.get().devices
            devs = [get_device(d) for d in (devices if devices is not None else all_devs)]
            if not devs:
                raise ValueError("DataParallel needs at least one device; pass devices= or "
                                 "check `wgrumus devices` for a usable adapter")
            if len({id(d) for d in devs}) != len(devs):
                raise ValueError("DataParallel: each device may hold only one replica; pass "
                                 "distinct devices (WGRUMUS_DEVICES=N makes N logical ones)")
            self.world_size = len(devs)
        self.devices = devs
        self.module = moved_to(module, devs[0])
        self.replicas = [self.module] + [replicate(self.module, d) for d in devs[1:]]
        self._params = [list(r.parameters()) for r in self.replicas]
        names = [n for n, _ in self.module.named_parameters()] \
            if hasattr(self.module, "named_parameters") else None
        self.plan = plan_buckets(self._params[0], bucket_cap_mb, first_bucket_mb, names)
        self.sharding = OptimizerSharding(self._params[0], self.world_size) \
            if shard_optimizer_state else None
        self.events = EventLog()
        self._world = None
        self.groups = [group] if backend in PER_PROCESS else self._thread_groups()
        self.group = self.groups[0]
        self._workers = [Worker(k, "wgrumus-dp-replica") for k in range(len(devs))]
        self._sync = True
        self._accum: list = [None] * len(devs)
        self._averagers: list = [None] * len(devs)  # see _averager
        self._optimizers = None
        self.jit = bool(jit)
        self._jits: dict = {}  # (replica, loss_fn, optimizer) -> wr.jit of its step
        self._closed = False
        if backend in PER_PROCESS:
            self.broadcast_weights()

    def __repr__(self):
        return (f"DataParallel({type(self.module).__name__}, {self.world_size} replicas, "
                f"{self.backend}, {len(self.plan)} buckets)")

    def _thread_groups(self) -> list:
        """A fresh ThreadWorld and one ProcessGroup per replica (a broken group stays broken)."""
        if self._world is not None:
            self._world.close(0)
        self._world = ThreadWorld(len(self.devices), self.timeout, name="data-parallel")
        cfg = CollectiveConfig(num_devices=len(self.devices), timeout=self.timeout)
        return [ProcessGroup(self._world.transport(k), cfg, d) for k, d in enumerate(self.devices)]

    def _stop(self, timeout: float) -> bool:
        """Stop the replica and communication threads once; False when already stopped."""
        if self._closed:
            return False
        self._closed = True
        for w in self._workers:
            w.close(timeout)
        for g in self.groups:
            g.close()
        if self._world is not None:
            self._world.close(timeout)
        return True

    def close(self) -> None:
        """Stop the replica and communication threads."""
        if self._stop(self.timeout):
            self._free_jits()

    def __del__(self):  # forgotten close(): the threads end without waiting on them here
        with contextlib.suppress(Exception):  # interpreter shutdown, or a half-built object
            if self._stop(0):
                self._free_jits()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def parameters(self):
        return self._params[0]

    def named_parameters(self):
        return self.module.named_parameters()

    def state_dict(self):
        return self.module.state_dict()

    def train(self, mode: bool = True):
        """Training / evaluation mode on every replica (Dropout, BatchNorm)."""
        for r in self.replicas:
            if hasattr(r, "train"):
                r.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def broadcast_weights(self) -> None:
        """Copy replica (rank) 0's state to the others, after it changed outside a step."""
        def job(w):
            with no_grad():
                for p in _state_tensors(self.replicas[w.rank]):
                    copy_into(p, self.groups[w.rank].broadcast(p, root=0))
        self._run(job)

    def _shards(self, batch):
        n = int(batch.shape[0] if hasattr(batch, "shape") else len(batch))
        return n, np.cumsum([0] + shard_sizes(n, self.world_size))

    def _run(self, job) -> list:
        """``job(worker)`` on every replica's thread, results in replica order; the first failure
        aborts communication (no replica waits on it) and is raised as a ReplicaError."""
        if self._closed:
            raise WgrumusError("this DataParallel was closed; create a new one to keep "
                               "training")
        def on_timeout(stuck):
            exc = ReplicaError(f"DataParallel: replica(s) {[w.rank for w in stuck]} did not "
                               f"finish within {self.timeout * 2} s (phase {stuck[0].phase}); "
                               f"check for a hang in the model or raise timeout=",
                               stuck[0].rank, stuck[0].phase)
            self.group.abort(exc)
            raise exc from None

        # the first failure aborts communication: replicas blocked in a collective wake at once
        out, failures = run_jobs(self._workers, job, self.timeout * 2,
                                 lambda _rank, err: self.group.abort(err), on_timeout)
        if failures:
            self._free_jits()  # their replays call the broken groups
            if self.backend == "threads":
                self.groups = self._thread_groups()
                self.group = self.groups[0]
            exc, cause = self._replica_error(failures)
            raise exc from cause
        return out

    def _replica_error(self, failures) -> tuple:
        """(ReplicaError, cause) naming a replica's own error, not the aborts it triggered."""
        own = [f for f in failures if not isinstance(f[2], CollectiveError)] or failures
        rank, phase, err = own[0]
        r = self.groups[rank].rank
        others = "; ".join(f"replica {q} in {ph}: {type(e).__name__}: {e}"
                           for q, ph, e in failures if q != rank)
        msg = (f"DataParallel: replica {r} (device {self.devices[rank].index}) failed in "
               f"{phase}: {type(err).__name__}: {err}")
        if others:
            msg += f" [also: {others}]"
        return ReplicaError(msg, r, phase), err

    def forward(self, batch):
        """Scatter ``batch`` on dim 0, run the replicas, gather the outputs on device 0 (mpi: on
        every rank). Records gradients when the caller does, so a backward from the output
        reaches every replica (the RUMUS workflow: then AllReduceSync, step, broadcast_weights)."""
        bounds = self._shards(batch)[1]
        grad = is_grad_enabled()

        def job(w):
            k = w.rank
            lo, hi = self._local_bounds(bounds, k)
            w.phase = "forward"
            x = _rows(batch, lo, hi, self.devices[k])
            with contextlib.nullcontext() if grad else no_grad():
                return self.replicas[k](x)

        outs = self._run(job)
        if self.backend in PER_PROCESS:
            return self.group.all_gather(outs[0])
        return cat([o.to(self.devices[0]) for o in outs], 0)

    __call__ = forward

    def _local_bounds(self, bounds, k):  # rows of this process's replica k (its group rank)
        r = self.groups[k].rank
        return int(bounds[r]), int(bounds[r + 1])

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: steps inside only add to a per-replica sum, which the next step
        outside all-reduces with its own gradients."""
        prev = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = prev

    def train_step(self, batch, targets, loss_fn, optimizers):
        """One optimizer step on the global batch (``loss_fn`` gives the mean over a shard);
        returns the global-batch loss, equal to the single-device one. ``optimizers``: one per
        replica, a factory ``params -> optimizer`` (its optimizers are kept while the same factory
        object is passed), or with mpi / one replica a single optimizer."""
        refuse("DataParallel.train_step", "data-parallel replicas do not compose with wr.jit "
               "yet (their steps run on worker threads around host all-reduces); run "
               "DataParallel without wr.jit")
        optimizers = self._resolve_optimizers(optimizers)
        n, bounds = self._shards(batch)
        if targets is not None:
            tn = targets.shape[0] if hasattr(targets, "shape") else len(targets)
            if int(tn) != n:
                raise ValueError(f"DataParallel: {n} inputs but {tn} targets; pass one "
                                 f"target row per input row")
        sync = self._sync
        self.events.clear()

        def job(w):
            k = w.rank
            lo, hi = self._local_bounds(bounds, k)
            dev = self.devices[k]
            w.phase = "scatter"
            x, y = _rows(batch, lo, hi, dev), _rows(targets, lo, hi, dev)
            # d(global loss)/d(shard loss) = n_k / B; the all-reduce averages over world_size.
            scale = float(hi - lo) * self.world_size / n
            if self.jit and sync and self._accum[k] is None:
                w.phase = "captured step"
                loss = self._captured_step(k, x, y, loss_fn, scale, optimizers[k])
                self.events.record(k, "step_end")
                return loss.item() * (hi - lo)
            w.phase = "forward"
            self.events.record(k, "forward_start")
            out = self.replicas[k](x)
            w.phase = "loss"
            loss = _check_loss(loss_fn(out, y))
            w.phase = "backward"
            self.events.record(k, "backward_start")
            reducer = None
            if sync and self.world_size > 1:  # one replica has nothing to average with
                reducer = self._averager(k).start(self._accum[k])
            grads = backward_with_grad(loss, full(loss.shape, scale, device=loss.device),
                                       on_leaf_grad=reducer.on_leaf_grad if reducer else None)
            self.events.record(k, "backward_end")
            if reducer is None:  # no_sync, or one replica: added to the running sum
                self._accumulate(k, grads)
                avg = self._accum[k]
            else:
                w.phase = "all-reduce"
                avg = reducer.finish(self.timeout)
            if sync:
                w.phase = "optimizer step"
                optimizers[k].step(avg if self.sharding is None else self.sharding.owned_grads(
                    self.groups[k].rank, self._params[k], avg))
                self.events.record(k, "step_end")
            return loss.item() * (hi - lo)

        try:
            res = self._run(job)
        finally:
            if sync:
                self._accum = [None] * len(self.replicas)
        if sync and self.sharding is not None:
            self._run(lambda w: self.sharding.gather_group(self.groups[w.rank],
                                                           self._params[w.rank]))
        local = float(np.sum(res, dtype=np.float64))
        if self.backend in PER_PROCESS:
            local = float(self.group.all_reduce(np.array([local]), "sum")[0])
        return local / n

    def _resolve_optimizers(self, optimizers):
        if isinstance(optimizers, type) or (callable(optimizers) and
                                            not hasattr(optimizers, "step")):
            if self._optimizers is None or self._optimizers[0] != optimizers:
                self._optimizers = (optimizers, [optimizers(ps) for ps in self._params])
            return self._optimizers[1]
        if hasattr(optimizers, "step"):
            optimizers = [optimizers]
        optimizers = list(optimizers)
        if len(optimizers) != len(self.replicas):
            raise ValueError(f"train_step needs one optimizer per local replica "
                             f"({len(self.replicas)}), got {len(optimizers)}; build them on "
                             f"dp.replicas[k].parameters(), or pass a factory params -> optimizer")
        return optimizers

    def optimizer_state_dict(self, optimizers) -> dict:
        """The whole model's optimizer state as one ``state_dict()`` (ZeRO-1: from the owners)."""
        opts = self._resolve_optimizers(optimizers)
        sd = opts[0].state_dict()
        if self.sharding is None:
            return sd
        if self.backend in PER_PROCESS:
            raise WgrumusError("optimizer_state_dict with shard_optimizer_state under mpi: "
                               "each process holds its own part; save it per rank")
        own = [o.state_dict()["state"] for o in opts]
        return dict(sd, state={i: own[r][i] for i, r in enumerate(self.sharding.owner)
                               if i in own[r]})

    def _captured_step(self, k: int, x, y, loss_fn, scale: float, opt):
        """Replica ``k``'s step replayed from one ``wr.jit`` capture of the eager step; a replay
        launches each bucket's all-reduce once its work is submitted (``capture.host_launch``)."""
        key = (k, loss_fn, id(opt))
        jf = self._jits.get(key)
        if jf is None:
            from ..jit import jit
            replica, dev = self.replicas[k], self.devices[k]
            avg = GradientAverager(self._params[k], self.groups[k], plan=self.plan,
                                   comm_dtype=self.comm_dtype) if self.world_size > 1 else None

            def step(x, y, scale):
                loss = _check_loss(loss_fn(replica(x), y))
                grads = backward_with_grad(loss, full(loss.shape, scale, device=loss.device),
                                           on_leaf_grad=None if avg is None else
                                           avg.start().on_leaf_grad)
                opt.step(grads if avg is None else avg.finish(self.timeout))
                return loss

            jf = self._jits[key] = jit(step, devices=[dev])
        loss = jf(x, y, float(scale))
        self._replay_events(k, jf.last_trace)
        return loss

    def _averager(self, k: int) -> GradientAverager:
        """Replica ``k``'s GradientAverager, made once per group (a failed step replaces them)."""
        avg = self._averagers[k]
        if avg is None or avg.group is not self.groups[k]:
            avg = self._averagers[k] = GradientAverager(
                self._params[k], self.groups[k], plan=self.plan, events=self.events, replica=k,
                comm_dtype=self.comm_dtype)
        return avg

    def _replay_events(self, k: int, trace) -> None:
        """A replay's bucket launches and waits as ``events`` (backward_end: its first wait)."""
        joins = [e for e in trace or () if e[0] == "join"]
        for e in trace or ():
            if e[0] == "launch":
                self.events.record(k, "allreduce_start", e[1], t=e[2])
        if joins:
            self.events.record(k, "backward_end", t=joins[0][2])
            self.events.record(k, "sync_end", t=joins[-1][3])

    def _free_jits(self) -> None:
        while self._jits:
            self._jits.popitem()[1].free()

    def _accumulate(self, k: int, grads) -> None:
        """Add replica ``k``'s gradients to its ``no_sync`` running sum."""
        self._accum[k] = store_of(grads_of(self._params[k], grads), self._accum[k])

    def replicas_identical(self) -> bool:
        """Every replica's (rank's) parameters equal replica 0's bit for bit (for tests)."""
        def digests(w):
            h = hashlib.sha256()
            for p in self._params[w.rank]:
                h.update(np.ascontiguousarray(p.numpy()).tobytes())
            return self.groups[w.rank].all_gather_object(h.hexdigest())
        return all(len(set(d)) == 1 for d in self._run(digests))
