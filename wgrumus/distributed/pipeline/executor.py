"""PipelineExecutor: one thread per pipeline stage, each running its schedule list (with
``add_send_recv``'s communication) through the one interpreter, :class:`~.interpreter.StageRunner`,
over bounded queue channels between neighbouring virtual stages; each stage's sends (the copy to
the next device and the hand-off) run on its send lane, overlapping its next compute action
(``jit=True`` sends in order, as host operations of the replay). The last stage computes
``loss_fn(out, target) / m``, so summed gradients are those of the mean loss. ``jit=True`` replays
each stage thread's actions from a ``wr.jit`` capture, its sends and receives as host operations.
A failing stage sets an abort event every channel wait polls, so ``run`` raises one PipelineError
naming stage, action and micro-batch.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np

from ...autograd import GradientStore, Tape, no_grad
from ...runtime.capture import host_op
from ...runtime.errors import ShapeError, WgrumusError
from ...tensor import Tensor, tensor
from ..launch import join_threads
from .actions import RECV_F, SEND_F, Schedule, ScheduleError, add_send_recv
from .interpreter import StageRunner
from .p2p import _Lane
from .schedules import get_schedule, schedule_key
from .stage import PipelineStage
from .timeline import validate
from .trace import ActionRecord, PipelineTrace

_POLL = 0.02  # seconds between checks of the abort event while blocked on a channel


class PipelineError(WgrumusError):
    """A pipeline run failed. ``stage``, ``action`` and ``micro_batch`` say where (None if the
    failure is not tied to one action); ``__cause__`` is the original exception."""

    def __init__(self, msg: str, stage=None, action=None):
        super().__init__(msg)
        self.stage = stage
        self.action = action
        self.micro_batch = action.mb if action is not None else None


class PipelineShapeError(PipelineError, ShapeError):
    """A stage could not take the output of the stage before it."""


class PipelineConfigError(PipelineError, ValueError):
    """Bad arguments: stage count, schedule, batch size, optimizers."""


class PipelineTimeoutError(PipelineError):
    """A stage waited longer than ``timeout`` for a neighbour."""


class _Aborted(Exception):
    """Another stage failed; this one stops quietly."""


class _Channel:
    """Bounded queue between neighbouring virtual stages; messages for other micro-batches than
    the one asked for are stashed, so any order the schedule asks for works."""

    def __init__(self, name: str, capacity: int, abort: threading.Event, timeout: float):
        # The abort event and timeout, not the run: a channel -> run -> channel cycle would leave
        # the run's tensors to the cyclic GC instead of freeing them when the run ends.
        self.name = name
        self._q: queue.Queue = queue.Queue(maxsize=capacity)
        self._stash: dict = {}
        self._abort = abort
        self._timeout = timeout

    def _poll(self, attempt, empty, t0: float, timeout_message: str):
        """Retry ``attempt`` (a queue call with a ``_POLL`` timeout), noticing an abort within
        ``_POLL`` and giving up ``timeout`` s after ``t0``."""
        while True:
            if self._abort.is_set():
                raise _Aborted
            try:
                return attempt()
            except empty:
                if time.perf_counter() - t0 > self._timeout:
                    raise PipelineTimeoutError(timeout_message) from None

    def put(self, mb: int, value, who: str) -> float:
        t0 = time.perf_counter()
        self._poll(lambda: self._q.put((mb, value), timeout=_POLL), queue.Full, t0,
                   f"{who} waited more than {self._timeout:g} s to send micro-batch {mb} on the "
                   f"{self.name} channel (full; the receiver is not taking messages)")
        return time.perf_counter() - t0

    def get(self, mb: int, who: str):
        if mb in self._stash:
            return self._stash.pop(mb), 0.0
        t0 = time.perf_counter()
        message = (f"{who} waited more than {self._timeout:g} s for micro-batch {mb} on the "
                   f"{self.name} channel; the neighbouring stage is stuck or too slow (raise "
                   f"PipelineExecutor(timeout=...) for slow stages)")
        while True:
            got, value = self._poll(lambda: self._q.get(timeout=_POLL), queue.Empty, t0, message)
            if got == mb:
                return value, time.perf_counter() - t0
            self._stash[got] = value


@dataclass
class _Run:
    m: int
    timeout: float
    inputs: list
    targets: list
    loss_fn: object
    fwd: list  # fwd[k]: activations into virtual stage k (from k - 1)
    bwd: list  # bwd[k]: gradients into virtual stage k (from k + 1)
    stores: list  # stores[k]: GradientStore of virtual stage k
    losses: list
    records: list  # records[s]: ActionRecords of stage thread s
    t0: float
    abort: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    error: tuple | None = None  # (stage, action, exception) of the first failure
    failed_at: float | None = None  # its time.monotonic()

    def fail(self, stage: int, action, exc: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error, self.failed_at = (stage, action, exc), time.monotonic()
        self.abort.set()


class PipelineExecutor:
    """Run ``stages`` (PipelineStages in model order) as a pipeline with ``schedule`` (a name or
    a :class:`Schedule`); "interleaved" takes ``p * num_chunks`` stages (default 2 chunks).
    ``synchronize``: wait for each action's device work, so the trace measures real bubbles."""

    def __init__(self, stages, num_micro_batches: int, schedule="1f1b", timeout: float = 60.0,
                 num_chunks: int | None = None, synchronize: bool = True,
                 channel_capacity: int | None = None, jit: bool = False):
        self.stages = list(stages)
        if not self.stages:
            raise PipelineConfigError("PipelineExecutor needs at least one PipelineStage")
        for i, st in enumerate(self.stages):
            if not isinstance(st, PipelineStage):
                raise PipelineConfigError(f"stages[{i}] is a {type(st).__name__}, not a "
                                          "PipelineStage; wrap it: PipelineStage(module, device)")
        m = num_micro_batches
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise PipelineConfigError(f"num_micro_batches must be an int >= 1, got {m!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise PipelineConfigError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.num_micro_batches = m
        self.timeout = float(timeout)
        self.synchronize = bool(synchronize)
        self.schedule = self._make_schedule(schedule, num_chunks).compute()
        self._program = add_send_recv(self.schedule)  # what the stage threads run
        self.num_stages = self.schedule.num_stages
        self.num_chunks = self.schedule.num_chunks
        self.channel_capacity = channel_capacity or m  # m messages per channel per run at most
        self.last_trace: PipelineTrace | None = None
        self._busy = threading.Lock()
        self.jit = bool(jit)
        self._jits: dict = {}  # (stage thread, loss_fn) -> wr.jit of its actions
        self._live: list = [None] * self.num_stages  # each stage thread's _StageWork this run

    def _make_schedule(self, schedule, num_chunks) -> Schedule:
        n, m = len(self.stages), self.num_micro_batches
        try:
            if isinstance(schedule, str):
                if schedule_key(schedule) != "interleaved":
                    if num_chunks not in (None, 1):
                        raise PipelineConfigError(
                            f"num_chunks={num_chunks} only applies to schedule='interleaved'")
                    return get_schedule(schedule, n, m)
                v = 2 if num_chunks is None else num_chunks
                if not isinstance(v, int) or v < 2:
                    raise PipelineConfigError(
                        f"interleaved schedule needs num_chunks >= 2 model chunks per stage, "
                        f"got {v!r}; use schedule='1f1b' for one chunk per stage")
                if n % v:
                    raise PipelineConfigError(
                        f"interleaved schedule with num_chunks={v} needs the number of "
                        f"PipelineStages to be a multiple of {v} (p stages x {v} chunks), got "
                        f"{n}; split the model into {v * max(1, n // v)} or {v * (n // v + 1)} "
                        f"pieces")
                return get_schedule("interleaved", n // v, m, v=v)
            if not isinstance(schedule, (Schedule, list, tuple)):
                raise PipelineConfigError(
                    f"schedule must be a name ('1f1b', 'gpipe', 'interleaved', 'zb_h1') or a "
                    f"Schedule, got {type(schedule).__name__}")
            sched = validate(schedule)
        except ScheduleError as e:  # (a PipelineConfigError is no ScheduleError: it passes)
            raise PipelineConfigError(f"cannot build pipeline schedule {schedule!r} for "
                                      f"{n} PipelineStage(s) and {m} micro-batch(es): {e}") from e
        if sched.num_microbatches != m:
            raise PipelineConfigError(
                f"the schedule is for {sched.num_microbatches} micro-batches but the executor "
                f"was built with num_micro_batches={m}")
        if sched.num_virtual_stages != n:
            raise PipelineConfigError(
                f"the schedule has {sched.num_stages} stage(s) x {sched.num_chunks} chunk(s) = "
                f"{sched.num_virtual_stages} model pieces, but {n} PipelineStages were given")
        return sched

    def _split(self, data, what: str, device):
        """``data`` cut into m equal micro-batches along dim 0, on ``device``."""
        m = self.num_micro_batches
        if data is None:
            return [None] * m
        if not isinstance(data, Tensor):
            try:
                data = tensor(np.asarray(data), device=device)
            except Exception as e:
                raise PipelineConfigError(
                    f"{what} must be a Tensor or a numpy array, got {type(data).__name__}") from e
        if data.ndim == 0:
            raise PipelineConfigError(f"{what} must have a batch dimension (dim 0), got a scalar")
        n = data.shape[0]
        if n % m:
            raise PipelineConfigError(
                f"{what}: batch size {n} (dim 0 of shape {tuple(data.shape)}) is not divisible "
                f"by num_micro_batches={m}; use a batch that is a multiple of {m} or change "
                f"num_micro_batches to a divisor of {n}")
        size = n // m
        out = []
        with no_grad():
            for i in range(m):
                piece = data[i * size:(i + 1) * size]
                # each micro-batch owns its storage (so it is freed, and counted, on its own)
                out.append(piece.clone() if piece.device is device else piece.to(device))
        return out

    def run(self, inputs, targets, loss_fn, optimizers=None, accumulate_grad: bool = False):
        """One training step over ``inputs`` (m micro-batches along dim 0): ``(mean loss,
        GradientStore)``. ``accumulate_grad`` also adds to ``.grad``; ``optimizers`` (one per
        stage, None skips one) step after the whole pipeline succeeded."""
        if not callable(loss_fn):
            raise PipelineConfigError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        if optimizers is not None:
            optimizers = list(optimizers)
            if len(optimizers) != len(self.stages):
                raise PipelineConfigError(
                    f"optimizers: got {len(optimizers)}, need one per PipelineStage "
                    f"({len(self.stages)}; None to leave a stage unchanged)")
        if not self._busy.acquire(blocking=False):
            raise PipelineConfigError("this PipelineExecutor is already running in another "
                                      "thread; use one executor per concurrent pipeline")
        try:
            return self._run(inputs, targets, loss_fn, optimizers, accumulate_grad)
        finally:
            self._busy.release()

    def _new_run(self, inputs, targets, loss_fn) -> _Run:
        """This step's micro-batches and fresh channels (nothing of a failed step leaks on)."""
        m, p, nv = self.num_micro_batches, self.num_stages, len(self.stages)
        run = _Run(
            m=m, timeout=self.timeout,
            inputs=self._split(inputs, "inputs", self.stages[0].device),
            targets=self._split(targets, "targets", self.stages[-1].device),
            loss_fn=loss_fn, fwd=[None] * nv, bwd=[None] * nv,
            stores=[GradientStore() for _ in range(nv)],
            losses=[None] * m, records=[[] for _ in range(p)], t0=time.perf_counter())
        where = self.schedule.where
        for k in range(nv - 1):
            run.fwd[k + 1] = _Channel(f"activation {where(k)} -> {where(k + 1)}",
                                      self.channel_capacity, run.abort, run.timeout)
            run.bwd[k] = _Channel(f"gradient {where(k + 1)} -> {where(k)}",
                                  self.channel_capacity, run.abort, run.timeout)
        return run

    def _run(self, inputs, targets, loss_fn, optimizers, accumulate_grad):
        m, p = self.num_micro_batches, self.num_stages
        run = self._new_run(inputs, targets, loss_fn)
        threads = [threading.Thread(target=self._stage_main, args=(s, run), daemon=True,
                                    name=f"wgrumus-pipeline-stage-{s}") for s in range(p)]
        try:
            for t in threads:
                t.start()
            self._join(threads, run)
        except BaseException as e:  # e.g. KeyboardInterrupt in the caller: stop the stages too
            run.fail(-1, None, e)
            self._join(threads, run)
            raise
        finally:
            self.last_trace = None if self.jit else PipelineTrace(
                self.schedule, tuple(tuple(r) for r in run.records))
        if run.error is not None:
            # Drop the stage frames' locals (tensors) held by the traceback: the exception is
            # kept by the caller, and frame <-> run cycles would leave device buffers to the GC.
            traceback.clear_frames(run.error[2].__traceback__)
            self._raise(run.error)
        with no_grad():
            loss = sum(float(l.item()) for l in run.losses) / m
            store = GradientStore()
            for st in run.stores:
                store.merge_from(st)
            if accumulate_grad:
                for gid, g in store.items():
                    leaf = store.leaf(gid)
                    if leaf is not None:
                        leaf.grad = g if leaf.grad is None else leaf.grad + g
        if optimizers is not None:
            for opt, st in zip(optimizers, run.stores):
                if opt is not None:
                    opt.step(st)
        return loss, store

    def _join(self, threads, run: _Run) -> None:
        """Wait for every stage thread (after a failure, ``timeout + 5`` s at most)."""
        alive = [threads[i].name for i in join_threads(threads, lambda: run.failed_at,
                                                       run.timeout + 5.0)]
        if alive:
            first = run.error[2] if run.error else None
            raise PipelineError(
                f"pipeline stage thread(s) {alive} did not stop within {run.timeout + 5:g} s "
                f"after a failure (stuck inside a kernel or a device read); the failure was: "
                f"{type(first).__name__}: {first}") from first

    def _raise(self, error) -> None:
        s, a, exc = error
        if s < 0:
            raise exc
        where = f"pipeline stage {s}"
        if a is not None:
            where += f", micro-batch {a.mb}" + (f" chunk {a.chunk}" if self.num_chunks > 1 else "")
            where += f" (action {a!r}, schedule {self.schedule.name!r})"
        cls = PipelineTimeoutError if isinstance(exc, PipelineTimeoutError) else \
            PipelineShapeError if isinstance(exc, ShapeError) else PipelineError
        raise cls(f"{where} failed: {type(exc).__name__}: {exc}", s, a) from exc

    def _stage_main(self, s: int, run: _Run) -> None:
        work = _StageWork(self, run, s)
        try:
            (self._replayed_stage if self.jit else self._eager_stage)(s, run, work)
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by run() with stage and action
            run.fail(s, None if work.runner is None else work.runner.action, e)

    def _eager_stage(self, s: int, run: _Run, work) -> None:
        work.runner = StageRunner(work, self.num_stages, len(self.stages), s)
        try:
            work.runner.run(self._program[s], work.record, run.abort.is_set)
            for k, store in work.runner.stores.items():
                run.stores[k].merge_from(store)
        finally:
            work.runner.clear()
            if work.lane is not None:  # its sends are done (or the run failed): let it end
                work.lane.close()
                work.lane.join(run.timeout + 5.0)

    def _replayed_stage(self, s: int, run: _Run, work) -> None:
        """Stage thread ``s`` with ``jit=True``: replay its actions, collect grads and losses."""
        from ...jit import jit
        loss_fn = run.loss_fn
        jf = self._jits.get((s, loss_fn))
        if jf is None:
            jf = self._jits[(s, loss_fn)] = jit(
                lambda ins, tgts: self._stage_actions(s, loss_fn, ins, tgts),
                devices=[self.stages[s].device])
        self._live[s] = work
        last = len(self.stages) - 1
        try:
            grads, losses = jf(run.inputs if s == 0 else [],
                               run.targets if last % self.num_stages == s else [])
        finally:
            self._live[s] = None
        for k, gs in grads.items():
            for p, g in zip(self.stages[k].parameters(), gs):
                if g is not None:
                    run.stores[k].accumulate(p, g)
        for mb, loss in enumerate(losses):
            if loss is not None:
                run.losses[mb] = loss

    def _stage_actions(self, s: int, loss_fn, inputs, targets):
        """Stage thread ``s``'s step as ``jit=True`` captures it: ({virtual stage: gradients in
        parameter order}, micro-batch losses)."""
        m = self.num_micro_batches
        # what _StageWork.forward reads of a _Run
        feed = SimpleNamespace(m=m, inputs=inputs or [None] * m, targets=targets or [None] * m,
                               loss_fn=loss_fn, losses=[None] * m)
        runner = StageRunner(_CapturedStageWork(self, feed, s), self.num_stages,
                             len(self.stages), s)
        try:
            runner.run(self._program[s])
        finally:
            runner.clear()
        grads = {k: [st.get(p) for p in self.stages[k].parameters()]
                 for k, st in runner.stores.items()}
        return grads, feed.losses

    def close(self) -> None:
        """Give the stage threads' captures (``jit=True``) back to the buffer pools now."""
        while self._jits:
            self._jits.popitem()[1].free()

    def __repr__(self) -> str:
        return (f"PipelineExecutor({len(self.stages)} stages, m={self.num_micro_batches}, "
                f"schedule={self.schedule.name!r})")


def _activation_bytes(tape: Tape, x, out, stage: PipelineStage) -> int:
    """Bytes of distinct non-parameter storages this micro-batch keeps alive on the stage."""
    params = {id(p.storage) for p in stage.parameters()}
    seen: dict = {}
    tensors = [x, out] + [t for n in tape.nodes for t, _ in n.saved]
    for t in tensors:
        st = getattr(t, "storage", None)
        if st is not None and id(st) not in params:
            seen[id(st)] = st.nbytes
    return sum(seen.values())


class _StageWork:
    """What the runtime asks of one stage thread: forwards, loss, channels, trace records."""

    def __init__(self, ex: PipelineExecutor, run: _Run, s: int):
        self.ex, self.run, self.s = ex, run, s
        self.wait, self.got, self.start = 0.0, None, None
        self.runner = None
        self.lane = None  # this stage's send lane this run (made at its first send)

    def forward(self, a, k: int, x):
        ex, run = self.ex, self.run
        stage = ex.stages[k]
        if k == 0:
            x = self.input = run.inputs[a.mb]
        try:
            out = stage.forward(x)
        except ShapeError as e:
            if k == 0:
                raise
            here, prev = ex.schedule.where(k), ex.schedule.where(k - 1)
            raise PipelineShapeError(
                f"{here} cannot take the output of {prev}: it got an activation of shape "
                f"{tuple(x.shape)} and raised: {e}; make {prev} produce what {here} expects (or "
                f"cut the model elsewhere)") from e
        if k < len(ex.stages) - 1:
            return out
        loss = run.loss_fn(out, run.targets[a.mb])
        if not callable(getattr(loss, "numel", None)) or loss.numel() != 1:
            raise ShapeError(f"loss_fn must return a one-element tensor (the mean loss of the "
                             f"micro-batch), got {type(loss).__name__} of shape "
                             f"{getattr(loss, 'shape', None)}")
        run.losses[a.mb] = loss.detach()
        return loss * (1.0 / run.m)

    def activation_bytes(self, tape, x, out, k: int) -> int:
        return _activation_bytes(tape, self.input if x is None else x, out, self.ex.stages[k])

    def _who(self, a, k: int) -> str:
        return f"{self.ex.schedule.where(k)} ({a!r})"

    def recv(self, a, k: int):
        self.start = self.start or time.perf_counter()
        value, wait = self._channel(a, k).get(a.mb, self._who(a, k))
        self.wait += wait
        self.got = time.perf_counter()
        return value

    def _channel(self, a, to: int) -> _Channel:
        return self.run.fwd[to] if a.kind in (SEND_F, RECV_F) else self.run.bwd[to]

    def send(self, a, k: int, value) -> None:
        to = k + 1 if a.kind == SEND_F else k - 1
        with no_grad():
            value = value.to(self.ex.stages[to].device)
        sent = time.perf_counter()
        wait = self._channel(a, to).put(a.mb, value, self._who(a, k))
        recs, t0 = self.run.records[self.s], self.run.t0
        last = recs[-1]
        recs[-1] = replace(last, end=time.perf_counter() - t0, wait=last.wait + wait,
                           sent=sent - t0)

    def isend(self, a, k: int, value):
        """The send on this stage's send lane: the copy to the next device and the hand-off
        overlap the stage's next compute action (its trace record gets the hand-off time)."""
        to = k + 1 if a.kind == SEND_F else k - 1
        recs, t0 = self.run.records[self.s], self.run.t0
        at = len(recs) - 1  # the record of the compute action that made ``value``
        dst, who, channel = self.ex.stages[to].device, self._who(a, k), self._channel(a, to)

        def go():
            with no_grad():
                moved = value.to(dst)
            sent = time.perf_counter()
            channel.put(a.mb, moved, who)
            if at >= 0:
                recs[at] = replace(recs[at], sent=sent - t0)
        if self.lane is None:
            self.lane = _Lane(f"wgrumus-pipeline-stage-{self.s}-send")
        return _LaneWork(self.lane.submit(go), self.run.timeout + 5.0, who)

    def record(self, a, start: float, end: float) -> None:
        """A trace record per compute action; its receive before and send after count in."""
        if a.is_comm:
            return
        ex, t0 = self.ex, self.run.t0
        if ex.synchronize:
            ex.stages[ex.schedule.virtual_stage(self.s, a.chunk)].device.synchronize()
            end = time.perf_counter()
        start = self.start or start
        got = None if self.got is None else self.got - t0
        self.run.records[self.s].append(ActionRecord(
            self.s, a, start - t0, end - t0, self.wait, self.runner.live_bytes, got, None))
        self.wait, self.got, self.start = 0.0, None, None


class _LaneWork:
    """A send on a stage's send lane; ``wait`` re-raises its failure (an abort: quietly)."""

    def __init__(self, fut, timeout: float, who: str):
        self._fut, self._timeout, self._who = fut, timeout, who

    def wait(self):
        try:
            return self._fut.result(self._timeout)
        except FutureTimeout:
            raise PipelineTimeoutError(f"{self._who}: a send did not finish within "
                                       f"{self._timeout:g} s") from None


class _CapturedStageWork(_StageWork):
    """A stage's work inside its ``wr.jit`` capture: sends and receives are host operations on
    the live run's channels, moving host arrays."""

    isend = None  # (a replay's sends run in order, as host operations)

    def _now(self) -> _StageWork:
        return self.ex._live[self.s]

    def send(self, a, k: int, value) -> None:
        to = k + 1 if a.kind == SEND_F else k - 1

        def put(t):
            live = self._now()
            live._channel(a, to).put(a.mb, t.numpy(), live._who(a, k))
        host_op(value.device, put, value)

    def recv(self, a, k: int):
        dev = self.ex.stages[k].device

        def get():
            live = self._now()
            return tensor(live._channel(a, k).get(a.mb, live._who(a, k))[0], device=dev)
        return host_op(dev, get)
