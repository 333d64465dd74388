"""The one training step of every layout. A rank's model part (a replica, a pipeline stage, a
tensor-parallel shard) turns a batch into gradients; the :class:`RankEngine` around it does the
rest the same way everywhere: gradient accumulation, averaging over the data-parallel group
(exact, or float16 on the wire, or post-local SGD), loss scaling, clipping and the optimizer,
captured once with ``wr.jit``. Ranks run on persistent :class:`Worker` threads of one
:class:`RankPool`, or are this process (``--backend mpi`` / ``processes``)."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

from ..autograd import install_tape
from ..autograd.store import grads_of, store_of
from ..autograd.tape import Tape, no_grad
from ..ops.elementwise import copy_into
from ..runtime.errors import WgrumusError
from .averaging import GradientAverager, check_comm_dtype
from .collectives import CollectiveConfig
from .errors import CollectiveError
from .process_group import ProcessGroup
from .transport import ThreadWorld


class RankError(WgrumusError):
    """A rank failed during a step; ``rank`` and ``phase`` say where."""

    def __init__(self, msg, rank: int, phase: str):
        super().__init__(msg)
        self.rank, self.phase = rank, phase


class Worker:
    """A persistent thread with its own autograd tape (and random generator), running one job at
    a time. It keeps no reference to a finished job, so an owner dropped without ``close()`` is
    collected and its ``__del__`` can stop the thread."""

    def __init__(self, rank: int, name: str = "wgrumus-rank", rng_state=None):
        self.rank = rank
        self.phase = "idle"
        self._jobs: queue.Queue = queue.Queue()
        self._rng = rng_state
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"{name}{rank}")
        self._thread.start()

    def submit(self, fn, results: queue.Queue) -> None:
        self._jobs.put((fn, results))

    def close(self, timeout: float) -> None:
        self._jobs.put(None)
        if timeout > 0 and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        if self._rng is not None:
            from ..ops.random import use_thread_generator
            use_thread_generator(self._rng)
        install_tape(Tape())
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, results = job
            job = None
            try:
                out = fn(self)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                results.put((self.rank, self.phase, None, e))
            else:
                results.put((self.rank, self.phase, out, None))
            finally:
                install_tape(Tape())  # drop anything a failed job left recorded
                self.phase = "idle"
                fn = results = out = None  # the job's closure must not outlive it


def run_jobs(workers, job, timeout: float, on_failure=None,
             on_timeout=None) -> tuple[list, list]:
    """``job(worker)`` on every worker; (results in worker order, failures as (rank, phase,
    error)); a worker that does not answer within ``timeout`` is a failure (phase: its own), or
    ``on_timeout(workers that did not answer)`` runs (and raises) when given.
    ``on_failure(rank, error)`` runs at the first failure (to wake the others at once)."""
    results: queue.Queue = queue.Queue()
    for w in workers:
        w.submit(job, results)
    out, failures, answered = [None] * len(workers), [], set()
    deadline = time.monotonic() + timeout
    index = {w.rank: i for i, w in enumerate(workers)}
    for _ in workers:
        try:
            rank, phase, value, err = results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            if on_timeout is not None:
                on_timeout([w for w in workers if w.rank not in answered])
            for w in workers:
                if w.rank not in answered:
                    failures.append((w.rank, w.phase, TimeoutError(
                        f"no answer within {timeout:.0f} s (phase {w.phase}); check for a hang "
                        f"in the model or raise the timeout")))
            return out, failures
        answered.add(rank)
        if err is not None:
            if not failures and on_failure is not None:
                on_failure(rank, err)
            failures.append((rank, phase, err))
        else:
            out[index[rank]] = value
    return out, failures


def first_own_error(failures) -> tuple:
    """(rank, phase, error) of the failure that caused the others (not an abort it caused)."""
    own = [f for f in failures if not isinstance(f[2], CollectiveError)] or failures
    return own[0]


class RankPool:
    """One persistent worker per rank of a ``world``-rank layout, each with its ProcessGroup on
    its device; ``run(fn)`` calls ``fn(rank_index)`` on every worker (threads), or in the calling
    thread when there is one rank here: ``group`` given (one rank per process: mpi, processes),
    or ``world == 1`` (no thread hand-off per step)."""

    def __init__(self, world: int, devices=None, timeout: float = 120.0, group=None,
                 name: str = "wgrumus-rank"):
        self.timeout = float(timeout)
        self._world = None
        self._closed = False
        if group is not None:
            self.groups, self.workers = [group], []
            self.world_size = group.world_size
            return
        from ..ops.random import get_rng_state
        devices = list(devices)
        if len(devices) < world:
            raise ValueError(f"{world} ranks need {world} devices, got {len(devices)}")
        self.world_size = world
        self._world = ThreadWorld(world, self.timeout, name=name)
        cfg = CollectiveConfig(num_devices=world, local_all_reduce="native",
                               local_reduce="native", local_broadcast="native",
                               timeout=self.timeout).validate()
        self.groups = [ProcessGroup(self._world.transport(r), cfg, devices[r])
                       for r in range(world)]
        rng = get_rng_state()  # every rank starts from this generator state, as a process would
        self.workers = [Worker(r, name, rng) for r in range(world)] if world > 1 else []

    @property
    def local(self) -> bool:
        """True when the one rank here runs in the calling thread."""
        return not self.workers

    def run(self, fn, timeout: float | None = None) -> list:
        """``fn(k)`` for each local rank k, results in rank order; the first failure aborts the
        group (no rank waits on it) and is raised as a RankError naming the rank."""
        if self._closed:
            raise WgrumusError("this rank pool was closed")
        if self.local:
            try:
                return [fn(0)]
            except BaseException as e:
                self.groups[0].abort(e)
                raise
        def abort(rank, err):  # ranks blocked in a collective with the failed one raise at once
            if not isinstance(err, CollectiveError):
                err = CollectiveError(f"rank {rank} failed: {type(err).__name__}: {err}",
                                      rank=rank)
            self._world.abort(err)

        out, failures = run_jobs(self.workers, lambda w: fn(w.rank),
                                 timeout if timeout is not None else self.timeout * 2, abort)
        if failures:
            rank, phase, err = first_own_error(failures)
            abort(rank, err)
            others = "; ".join(f"rank {q}: {type(e).__name__}: {e}" for q, _, e in failures
                               if q != rank)
            msg = f"rank {rank} (device {self.groups[rank].device.index}) failed: " \
                  f"{type(err).__name__}: {err}" + (f" [also: {others}]" if others else "")
            raise RankError(msg, rank, phase) from err
        return out

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            w.close(timeout)
        for g in self.groups:
            if self._world is not None:
                g.close()
        if self._world is not None:
            self._world.close(timeout)

    def __del__(self):
        try:
            self.close(0)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown or half-built
            pass


@dataclass(frozen=True)
class SyncOptions:
    """How a rank's gradients meet the other replicas'. ``comm_dtype``: None (exact) or float16
    on the wire; ``grad_accum``: micro-steps per optimizer step (one all-reduce); ``sync_every``:
    None (every step) or post-local SGD's period H, after ``local_sgd_warmup`` exact steps."""
    comm_dtype: object = None
    grad_accum: int = 1
    sync_every: int | None = None
    local_sgd_warmup: int = 0

    def __post_init__(self):
        check_comm_dtype(self.comm_dtype)
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ValueError(f"grad_accum must be an int >= 1, got {self.grad_accum!r}")
        if self.sync_every is not None and (not isinstance(self.sync_every, int)
                                            or self.sync_every < 1):
            raise ValueError(f"sync_every must be None or an int >= 1, got {self.sync_every!r}")
        if not isinstance(self.local_sgd_warmup, int) or self.local_sgd_warmup < 0:
            raise ValueError(f"local_sgd_warmup must be an int >= 0, got "
                             f"{self.local_sgd_warmup!r}")

    def local_at(self, t: int) -> bool:
        """Step ``t`` (0-based) steps each replica alone (no gradient all-reduce)."""
        return self.sync_every is not None and t >= self.local_sgd_warmup

    def average_after(self, t: int) -> bool:
        """The replicas' parameters are averaged after local step ``t``."""
        return self.local_at(t) and (t + 1 - self.local_sgd_warmup) % self.sync_every == 0


class RankEngine:
    """One rank's training step around ``part`` (``params``, ``names``, ``overlaps`` and
    ``gradients(batch, seed, on_leaf_grad) -> (loss or None, grads aligned with params)``, the
    loss a device tensor on the rank that holds it, ``seed`` the backward's scale).

    ``step(micro_batches)`` runs one optimizer step over ``grad_accum`` micro-batches and returns
    the mean loss as a device tensor (no host read), or None on ranks without the loss.
    ``dp_group`` averages gradients over the replicas; ``model_group`` holds the ranks of one
    replica (pipeline stages, tensor shards): loss-scaling skips are agreed there."""

    def __init__(self, part, optimizer, device, dp_group=None, model_group=None,
                 sync: SyncOptions | None = None, precision: str = "f32", jit: bool = False,
                 timeout: float = 120.0, names=None):
        from ..amp import GradScaler
        self.part, self.opt, self.device = part, optimizer, device
        self.params = list(part.params)
        self.sync = sync or SyncOptions()
        self.dp_group = dp_group if dp_group is not None and dp_group.world_size > 1 else None
        self.model_group = model_group if model_group is not None and \
            model_group.world_size > 1 else None
        self.timeout = float(timeout)
        self.f16 = precision == "f16"
        self.scaler = GradScaler(enabled=self.f16)
        self.t = 0  # optimizer steps taken (checkpoints restore it: set_step)
        self._avg = self._param_avg = None
        if self.dp_group is not None:
            self._avg = GradientAverager(self.params, self.dp_group, names=names,
                                         device=device, comm_dtype=self.sync.comm_dtype)
            if self.sync.sync_every is not None:  # parameters: exact, float32
                self._param_avg = GradientAverager(self.params, self.dp_group, names=names,
                                                   device=device)
        self._jit = None
        if jit:
            from ..jit import jit as wr_jit
            self._jit = wr_jit(self._device_step, devices=[device])

    def set_step(self, t: int) -> None:
        """The optimizer steps already taken (a resumed run continues the local SGD phase)."""
        self.t = int(t)

    def step(self, micro_batches: list):
        """One optimizer step on this rank's ``grad_accum`` micro-batches (device tensors)."""
        k = self.sync.grad_accum
        if len(micro_batches) != k:
            raise ValueError(f"{len(micro_batches)} micro-batches for grad_accum={k}")
        flat = [t for mb in micro_batches for t in mb]
        local = self.sync.local_at(self.t)
        run = self._jit or self._device_step
        ts = self.opt.begin_step() if hasattr(self.opt, "begin_step") else None
        loss = run(len(micro_batches[0]), local, *flat)
        if ts is not None:
            self.opt.end_step(ts)
        if self._param_avg is not None and self.sync.average_after(self.t):
            self.average_parameters()
        self.t += 1
        return loss

    def _device_step(self, width: int, local: bool, *flat):
        """The step's device work and collectives, without a host read (what ``wr.jit``
        captures; ``local`` is part of the signature, so both phases have their capture)."""
        mbs = [flat[i:i + width] for i in range(0, len(flat), width)]
        from ..amp import autocast
        k = len(mbs)
        sync = self.dp_group is not None and not local
        accum, losses = None, []
        for i, mb in enumerate(mbs):
            seed = 1.0 / k
            if self.f16:  # the scale stays on the device, so a replay follows its updates
                from ..ops.creation import ones
                seed = self.scaler.scale(ones((), device=self.device)) * seed
            hook = None
            if sync and i == k - 1 and self.part.overlaps:  # buckets launch during backward
                hook = self._avg.start(accum).on_leaf_grad
            with autocast(enabled=self.f16, device=self.device):
                loss, grads = self.part.gradients(mb, seed, hook)
            if loss is not None:
                losses.append(loss)
            if hook is not None:
                grads = self._avg.finish(self.timeout)
            else:
                accum = store_of(grads_of(self.params, _store(self.params, grads)), accum)
                grads = accum
        if sync and not self.part.overlaps:
            grads = self._avg.average(grads, self.timeout)
        self._optimizer_step(grads)
        if not losses:
            return None
        with no_grad():
            total = losses[0]
            for v in losses[1:]:
                total = total + v
            return total * (1.0 / len(losses)) if len(losses) > 1 else total

    def _optimizer_step(self, grads) -> None:
        if not self.f16:
            self.opt.clip_and_step(grads) if hasattr(self.opt, "clip_and_step") \
                else self.opt.step(grads)
            return
        work = _ScaledStep(self.opt)
        self.scaler.unscale_(work, grads)
        if self.model_group is not None:  # one replica's shards skip a step together
            self._agree_found_inf(work)
        self.scaler.step(work, grads)
        self.scaler.update()

    def _agree_found_inf(self, work) -> None:
        """OR the inf/NaN flags of this replica's ranks (device tensors through the group)."""
        flags = self.scaler._found_inf.get(id(work), {})
        with no_grad():
            for flag in flags.values():
                agreed = self.model_group.all_reduce(flag, "max")
                copy_into(flag, agreed)
                copy_into(self.scaler._state[1:2], agreed)

    def average_parameters(self) -> None:
        """Post-local SGD: every replica takes the mean of the replicas' parameters (exact
        float32, so they are bit-identical afterwards)."""
        with no_grad():
            views = self._param_avg.average(list(self.params), self.timeout)
            for p, v in zip(self.params, views):
                if v is not None:
                    copy_into(p, v)

    def close(self) -> None:
        """Give the captured step's buffers back to the pool."""
        if self._jit is not None:
            self._jit.free()


def _store(params, grads):
    """``grads`` (aligned with ``params``, None for no gradient, or a GradientStore) as a store."""
    if isinstance(grads, (list, tuple)):
        return store_of((p, g) for p, g in zip(params, grads) if g is not None)
    return grads


class _ScaledStep:
    """An optimizer stepped by GradScaler.step with the device-side skip (found_inf)."""
    _step_supports_amp_scaling = True

    def __init__(self, opt):
        self.opt, self.param_groups = opt, opt.param_groups

    def step(self, grads=None, found_inf=None) -> None:
        if hasattr(self.opt, "clip_and_step"):
            self.opt.clip_and_step(grads, found_inf)
        else:
            self.opt.step(grads, found_inf=found_inf)


def even_split(n: int, parts: int, what: str) -> int:
    """``n`` rows in ``parts`` equal parts (the size), or a ValueError naming ``what``."""
    if n % parts:
        raise ValueError(f"{what}: {n} rows do not split into {parts} equal parts")
    return n // parts


__all__ = ["RankEngine", "RankPool", "RankError", "SyncOptions", "Worker", "run_jobs",
           "first_own_error", "even_split"]
