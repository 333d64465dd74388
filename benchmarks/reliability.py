"""Randomized fault injection over every parallel primitive.

For each run a seeded RNG picks a primitive, a fault (``raise``: an exception; ``stall``: sleep
past the timeout; ``exit``: the participant leaves early without a word), the faulty participant
and the point (step, phase, micro-batch) where it strikes. A run passes when

* every participant ended with a CollectiveError, or the injected exception itself (the faulty
  one), or a wrapper that names it (ReplicaError / PipelineError with the cause chained); an
  ``exit``-ed participant just left;
* the whole run finished within its bound (stall + 2 timeouts + slack for lavapipe);
* no thread it started is still alive afterwards (process-wide reduce helpers excepted);
* the same process then trains a fresh model (single device and DataParallel) to a lower loss.

    python benchmarks/reliability.py --runs 100 --seed 0 --timeout 1.5 --json out.json

tests/test_reliability_faults.py imports this module and runs a short campaign in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _child_env(*paths, **extra) -> dict:
    """A child's environment: ``paths`` (default: the repository) before the inherited
    PYTHONPATH, so an environment that finds wgpu through PYTHONPATH keeps finding it."""
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(p) for p in paths or (ROOT,)] + keep),
                **extra)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("WGRUMUS_DEVICES", "8")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

FAULTS = ("raise", "stall", "exit")
PRIMITIVES = ("barrier", "comm", "process_group", "data_parallel", "pipeline",
              "tensor_parallel", "fsdp", "mpi")
# helper threads of barriers still referenced (they end on the barrier's close, break or
# collection, or after host_reduce.HELPER_IDLE_S without a round; tests/test_barrier.py checks)
PERSISTENT_THREAD_PREFIXES = ("wgrumus-reduce",)


class InjectedFault(RuntimeError):
    """The exception the driver injects; a run must surface it (or a CollectiveError)."""


class Exited(BaseException):
    """Unwinds a participant that 'exits early' without reporting anything to its peers."""


@dataclass
class Plan:
    """Where and how one participant fails."""
    fault: str
    bad: int
    step: int
    phase: str = "forward"
    stall: float = 0.0
    notify: bool = False  # raw primitives: does the faulty one tell its peers (abort/mark_gone)?
    fired: list = field(default_factory=list)

    def hit(self, rank: int, step: int, phase: str = "forward") -> None:
        """Called by every participant at every injection point; fails the chosen one."""
        if rank != self.bad or step != self.step or phase != self.phase or self.fired:
            return
        self.fired.append((rank, step, phase, time.monotonic()))
        if self.fault == "raise":
            raise InjectedFault(f"injected fault: participant {rank}, step {step}, {phase}")
        if self.fault == "stall":
            time.sleep(self.stall)
        elif self.fault == "exit":
            raise Exited()


@dataclass
class Outcome:
    kind: str       # "error" | "exit" | "ok"
    error: BaseException | None = None
    seconds: float = 0.0

    def describe(self) -> str:
        if self.error is None:
            return self.kind
        return f"{type(self.error).__name__}: {str(self.error).splitlines()[0][:160]}"


def _chain(e: BaseException):
    seen = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _has(e, cls) -> bool:
    return any(isinstance(x, cls) for x in _chain(e))


# ----------------------------------------------------------------------------- helpers
def devices():
    import wgrumus as wr
    return wr.devices()


def thread_snapshot() -> set:
    return set(threading.enumerate())


def leftover_threads(baseline: set, wait: float = 5.0) -> list:
    """Threads started since ``baseline`` that are still alive after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        extra = [t for t in threading.enumerate() if t not in baseline and t.is_alive()
                 and not t.name.startswith(PERSISTENT_THREAD_PREFIXES)]
        if not extra or time.monotonic() > deadline:
            return [t.name for t in extra]
        time.sleep(0.02)


def fresh_training(steps: int = 4) -> dict:
    """A new model trains on one device and with DataParallel on 2 devices: the loss falls.
    Proves the process is usable after a fault."""
    import wgrumus as wr
    from wgrumus import nn
    devs = devices()
    rng = np.random.default_rng(123)
    X = rng.standard_normal((8, 4)).astype(np.float32)
    Y = (X @ rng.standard_normal((4, 2))).astype(np.float32)
    m = nn.Linear(4, 2, device=devs[0], seed=3)
    opt = wr.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(m(wr.tensor(X, device=devs[0])),
                                      wr.tensor(Y, device=devs[0]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    from wgrumus.parallel import DataParallel
    dp_losses = []
    with DataParallel(nn.Linear(4, 2, device=devs[0], seed=3), devs[:2], timeout=30) as dp:
        for _ in range(steps):
            dp_losses.append(dp.train_step(X, Y, nn.functional.mse_loss,
                                           lambda ps: wr.optim.SGD(ps, lr=0.1)))
    ok = (losses[-1] < losses[0] and dp_losses[-1] < dp_losses[0]
          and abs(losses[0] - dp_losses[0]) < 1e-4)
    return {"ok": bool(ok), "losses": losses, "dp_losses": dp_losses}


def _run_threads(world: int, body, limit: float) -> dict:
    """Run body(rank) on ``world`` threads; {rank: Outcome}. Threads still running at ``limit``
    are reported as 'hung'."""
    out: dict = {}
    t0 = time.monotonic()

    def run(r):
        try:
            body(r)
        except Exited:
            out[r] = Outcome("exit", None, time.monotonic() - t0)
        except BaseException as e:  # noqa: BLE001 - recorded and checked
            out[r] = Outcome("error", e, time.monotonic() - t0)
        else:
            out[r] = Outcome("ok", None, time.monotonic() - t0)

    ts = [threading.Thread(target=run, args=(r,), name=f"fault-participant{r}", daemon=True)
          for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(max(0.0, limit - (time.monotonic() - t0)))
    for r, t in enumerate(ts):
        if t.is_alive():
            out[r] = Outcome("hung", None, time.monotonic() - t0)
    return out


# ----------------------------------------------------------------------------- primitives
def case_barrier(plan: Plan, T: float, rng) -> dict:
    from wgrumus.distributed import CollectiveBarrier
    world, steps = 3, 4
    bar = CollectiveBarrier(world, timeout=T)

    def body(r):
        for s in range(steps):
            try:
                plan.hit(r, s)
            except Exited:
                if plan.notify:
                    bar.mark_gone(r)
                raise
            except InjectedFault as e:
                if plan.notify:
                    bar.abort(e)
                raise
            got = bar.reduce(np.full(5, float(r + s), np.float32), "sum", rank=r)
            assert np.allclose(got, sum(q + s for q in range(world)))
    return {"participants": _run_threads(world, body, plan.stall + 3 * T + 10)}


def case_comm(plan: Plan, T: float, rng) -> dict:
    import wgrumus as wr
    from wgrumus.distributed import CollectiveBarrier, CommThread, async_allreduce
    world, steps = 3, 3
    devs = devices()[1:1 + world]
    bar = CollectiveBarrier(world, timeout=T)
    comms = [CommThread(d, rank=r) for r, d in enumerate(devs)]
    try:
        def body(r):
            for s in range(steps):
                try:
                    plan.hit(r, s)
                except InjectedFault as e:
                    if plan.notify:
                        bar.abort(e)
                    raise
                x = wr.tensor(np.full(6, float(r + 1 + s), np.float32), device=devs[r])
                h = async_allreduce(comms[r], x, bar, op="sum")
                got = h.wait(timeout=3 * T).numpy()
                assert np.allclose(got, sum(q + 1 + s for q in range(world))), got
        return {"participants": _run_threads(world, body, plan.stall + 3 * T + 10)}
    finally:
        for c in comms:
            c.close(timeout=2 * T)


def _spawn_case(plan: Plan, T: float, world: int, rank_body) -> dict:
    """rank_body(group) under dist.spawn; every rank's own outcome is recorded, then spawn's."""
    from wgrumus import distributed as dist
    out: dict = {}
    t0 = time.monotonic()

    def fn(g):
        try:
            rank_body(g)
            g.barrier()  # a collective always follows the last injection point
        except Exited:
            out[g.rank] = Outcome("exit", None, time.monotonic() - t0)
            return None  # leaves silently: spawn marks the rank exited
        except BaseException as e:
            out[g.rank] = Outcome("error", e, time.monotonic() - t0)
            raise
        out[g.rank] = Outcome("ok", None, time.monotonic() - t0)

    raised = None
    try:
        dist.spawn(fn, world, devices=devices()[1:1 + world], timeout=T)
    except BaseException as e:  # noqa: BLE001 - checked
        raised = e
    for r in range(world):
        out.setdefault(r, Outcome("hung", None, time.monotonic() - t0))
    return {"participants": out, "raised": raised}


def case_process_group(plan: Plan, T: float, rng) -> dict:
    import wgrumus as wr
    world, steps = 3, 5
    ops = [str(o) for o in rng.choice(["all_reduce", "broadcast", "all_gather",
                                       "reduce_scatter", "sendrecv", "reduce"], steps)]

    def body(g):
        r, n = g.rank, g.world_size
        for s, op in enumerate(ops):
            plan.hit(r, s)
            x = wr.tensor(np.full((n, 2), float(r + s), np.float32), device=g.device)
            if op == "all_reduce":
                y = g.all_reduce(x, "sum")
                assert np.allclose(y.numpy(), sum(q + s for q in range(n)))
            elif op == "broadcast":
                y = g.broadcast(x if r == 1 else None, root=1)
                assert np.allclose(np.asarray(y.numpy() if hasattr(y, "numpy") else y), 1 + s)
            elif op == "all_gather":
                y = g.all_gather(x)
                assert tuple(y.shape) == (n * n, 2)
            elif op == "reduce_scatter":
                y = g.reduce_scatter(x, "sum")
                assert tuple(y.shape) == (1, 2)
            elif op == "reduce":
                g.reduce(x.numpy(), root=0)
            else:  # ring: send to the next rank, receive from the previous one
                w = g.isend(x.numpy(), (r + 1) % n, tag=s)
                y = g.recv((r - 1) % n, tag=s)
                w.wait(T)
                assert np.allclose(np.asarray(y), (r - 1) % n + s)
    return _spawn_case(plan, T, world, body)


class FaultPoint:
    """An identity layer that runs ``plan.hit`` in its forward, or in its backward through a
    recorded autograd node. ``rank_of(x)`` names the participant that is running it."""

    def __init__(self, plan: Plan, rank_of):
        self.plan, self.rank_of, self.calls = plan, rank_of, {}

    def __deepcopy__(self, memo):
        return self  # DataParallel replicas share the one plan (and report into it)

    def __call__(self, x):
        from wgrumus.autograd.tape import record
        r = self.rank_of(x)
        step = self.calls.get(r, 0)
        self.calls[r] = step + 1
        self.plan.hit(r, step, "forward")
        out = x * 1.0
        if self.plan.phase == "backward" and r == self.plan.bad:
            plan = self.plan

            def bw(g, step=step):
                plan.hit(r, step, "backward")
                return (g,)
            record("fault_point", out, [x], bw)
        return out


def _module_with_fault(point, device, seed=1):
    """Linear -> FaultPoint -> ReLU -> Linear as a wr.nn.Module."""
    from wgrumus import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8, device=device, seed=seed)
            self.fc2 = nn.Linear(8, 2, device=device, seed=seed + 1)
            object.__setattr__(self, "point", point)  # not a sub-module: shared by replicas

        def forward(self, x):
            return self.fc2(self.point(self.fc1(x)).relu())
    return Net()


def case_data_parallel(plan: Plan, T: float, rng) -> dict:
    import wgrumus as wr
    from wgrumus import nn
    from wgrumus.parallel import DataParallel
    world, steps = 3, 3
    devs = devices()[1:1 + world]
    index = {d.index: r for r, d in enumerate(devs)}
    point = FaultPoint(plan, lambda x: index[x.device.index])
    X = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    Y = np.random.default_rng(1).standard_normal((6, 2)).astype(np.float32)
    raised, t0 = None, time.monotonic()
    dp = DataParallel(_module_with_fault(point, devs[0]), devs, timeout=T)
    try:
        for _ in range(steps):
            dp.train_step(X, Y, nn.functional.mse_loss, lambda ps: wr.optim.SGD(ps, lr=0.05))
    except BaseException as e:  # noqa: BLE001 - checked
        raised = e
    finally:
        dp.close()
    return {"raised": raised, "seconds_to_error": time.monotonic() - t0}


def case_pipeline(plan: Plan, T: float, rng) -> dict:
    from wgrumus import nn
    from wgrumus.distributed.pipeline import PipelineExecutor, PipelineStage
    p, m = 3, 4
    devs = devices()[1:1 + p]
    schedule = str(rng.choice(["gpipe", "1f1b"]))
    plan.step = int(rng.integers(m))  # the micro-batch that fails
    stages = []
    for s in range(p):
        lin = nn.Linear(4, 4, device=devs[s], seed=s)
        if s == plan.bad:
            point = FaultPoint(plan, lambda x, s=s: s)
            stages.append(PipelineStage(lambda x, lin=lin, point=point: point(lin(x)), devs[s]))
        else:
            stages.append(PipelineStage(lin, devs[s]))
    X = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    Y = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    ex = PipelineExecutor(stages, m, schedule=schedule, timeout=T)
    raised, t0, loss = None, time.monotonic(), None
    try:
        loss, _ = ex.run(X, Y, nn.functional.mse_loss)
    except BaseException as e:  # noqa: BLE001 - checked
        raised = e
    return {"raised": raised, "schedule": schedule, "seconds_to_error": time.monotonic() - t0,
            "benign": _nobody_waits(plan, schedule, p, m), "loss": loss}


def _nobody_waits(plan: Plan, schedule: str, p: int, m: int) -> bool:
    """A stall in stage 0's backward of micro-batch k delays nobody when stage 0 runs no forward
    after it (stage 0 sends nothing backward): the run must then just succeed, later."""
    from wgrumus.distributed.pipeline import get_schedule
    if plan.fault != "stall" or plan.bad != 0 or plan.phase != "backward":
        return False
    acts = list(get_schedule(schedule, p, m).stages[0])
    k = next(i for i, a in enumerate(acts) if a.kind == "B" and a.mb == plan.step)
    return all(a.kind != "F" for a in acts[k + 1:])


def case_tensor_parallel(plan: Plan, T: float, rng) -> dict:
    import wgrumus as wr
    from wgrumus import distributed as dist
    world, steps = 2, 3
    X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)

    def body(g):
        col = dist.ColumnParallelLinear(4, 8, g, gather_output=False, seed=1)
        row = dist.RowParallelLinear(8, 4, g, input_is_parallel=True, seed=2)
        point = FaultPoint(plan, lambda x: g.rank)
        for _ in range(steps):
            x = wr.tensor(X, device=g.device, requires_grad=True)
            y = row(point(col(x)).relu())
            (y * y).mean().backward()
    return _spawn_case(plan, T, world, body)


def case_fsdp(plan: Plan, T: float, rng) -> dict:
    import wgrumus as wr
    from wgrumus import nn
    from wgrumus.distributed import FSDP
    world, steps = 2, 3
    X = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    Y = np.random.default_rng(1).standard_normal((4, 2)).astype(np.float32)

    def body(g):
        point = FaultPoint(plan, lambda x: g.rank)
        f = FSDP(_module_with_fault(point, g.device), g)
        opt = wr.optim.SGD(f.parameters(), lr=0.05)
        for _ in range(steps):
            loss = nn.functional.mse_loss(f(wr.tensor(X, device=g.device)),
                                          wr.tensor(Y, device=g.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return _spawn_case(plan, T, world, body)


def mpiexec():
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    import shutil
    return shutil.which("mpiexec")


def case_mpi(plan: Plan, T: float, rng) -> dict:
    """Two processes under mpiexec run a random sequence of collectives; rank ``bad`` fails at
    step ``step``. Each rank prints one OUTCOME line."""
    exe = mpiexec()
    if exe is None:
        raise RuntimeError("mpiexec not found: pip install 'wgrumus[mpi]'")
    seed = int(rng.integers(1 << 30))
    env = _child_env()
    t0 = time.monotonic()
    p = subprocess.run([exe, "-n", "2", sys.executable, str(Path(__file__).resolve()),
                        "--mpi-worker", plan.fault, str(plan.bad), str(plan.step), str(seed),
                        str(T), str(plan.stall)], capture_output=True, text=True,
                       timeout=plan.stall + 4 * T + 60, env=env, cwd=ROOT)
    outs = {}
    for line in p.stdout.splitlines():
        if line.startswith("OUTCOME "):
            _, r, kind, secs, msg = line.split(" ", 4)
            outs[int(r)] = (kind, float(secs), msg)
    return {"mpi": outs, "returncode": p.returncode, "stderr": p.stderr[-2000:],
            "wall": time.monotonic() - t0}


def mpi_worker(fault, bad, step, seed, T, stall) -> None:
    """One rank under mpiexec (``--mpi-worker``)."""
    from wgrumus import distributed as dist
    from wgrumus.distributed import CollectiveError
    T = float(T)
    g = dist.init_process_group("mpi", timeout=T)
    plan = Plan(fault, int(bad), int(step), stall=float(stall))
    rng = np.random.default_rng(int(seed))
    ops = [str(o) for o in rng.choice(["all_reduce", "broadcast", "all_gather",
                                       "reduce_scatter", "sendrecv"], 5)]
    r, n = g.rank, g.world_size
    t0 = time.monotonic()

    def say(kind, msg=""):
        sys.stdout.write(f"OUTCOME {r} {kind} {time.monotonic() - t0:.3f} {msg}\n")
        sys.stdout.flush()
    try:
        for s, op in enumerate(ops):
            plan.hit(r, s)
            x = np.full((n, 2), float(r + s), np.float32)
            if op == "all_reduce":
                g.all_reduce(x, "sum")
            elif op == "broadcast":
                g.broadcast(x if r == 0 else None, root=0)
            elif op == "all_gather":
                g.all_gather(x)
            elif op == "reduce_scatter":
                g.reduce_scatter(x, "sum")
            else:
                w = g.isend(x, (r + 1) % n, tag=s)
                g.recv((r - 1) % n, tag=s)
                w.wait(T)
        g.barrier()
    except Exited:
        say("exit")
        sys.exit(0)  # leaves without telling anyone (no excepthook for SystemExit)
    except InjectedFault as e:
        say("error", f"InjectedFault: {e}")
        raise  # the excepthook tells the other ranks, then the process fails
    except CollectiveError as e:
        say("error", f"CollectiveError: {str(e).splitlines()[0]}")
        sys.exit(1)
    say("ok")


CASES = {"barrier": case_barrier, "comm": case_comm, "process_group": case_process_group,
         "data_parallel": case_data_parallel, "pipeline": case_pipeline,
         "tensor_parallel": case_tensor_parallel, "fsdp": case_fsdp, "mpi": case_mpi}
WORLD = {"barrier": 3, "comm": 3, "process_group": 3, "data_parallel": 3, "pipeline": 3,
         "tensor_parallel": 2, "fsdp": 2, "mpi": 2}
STEPS = {"barrier": 4, "comm": 3, "process_group": 5, "data_parallel": 3, "pipeline": 4,
         "tensor_parallel": 3, "fsdp": 3, "mpi": 5}


# ----------------------------------------------------------------------------- checking
def _participant_ok(plan: Plan, r: int, o: Outcome) -> str | None:
    from wgrumus.distributed import CollectiveError
    if o.kind == "hung":
        return f"participant {r} still running"
    if r == plan.bad and plan.fault == "exit":
        return None if o.kind == "exit" else f"exited participant {r} reported {o.describe()}"
    if o.kind != "error":
        return f"participant {r} ended {o.kind}, expected an error"
    if r == plan.bad and plan.fault == "raise":
        if not _has(o.error, InjectedFault):
            return f"faulty participant {r} raised {o.describe()}, not the injected fault"
        return None
    if not _has(o.error, (CollectiveError, InjectedFault)):
        return f"participant {r} raised {o.describe()} (not a CollectiveError)"
    return None


def _wrapper_ok(plan: Plan, prim: str, e) -> str | None:
    """DataParallel / pipeline raise one error in the caller: it must name the failing replica
    or stage and chain the injected fault (or a CollectiveError / timeout)."""
    from wgrumus.distributed import CollectiveError
    if e is None:
        return "no error raised"
    if isinstance(e, AssertionError):
        return f"assertion in the run: {e}"
    msg = str(e)
    if plan.fault in ("raise", "exit"):
        who = "replica" if prim == "data_parallel" else "stage"
        if f"{who} {plan.bad}" not in msg:
            return f"error does not name {who} {plan.bad}: {msg[:300]}"
        if plan.fault == "raise" and not _has(e, InjectedFault):
            return f"injected fault not chained: {type(e).__name__}: {msg[:200]}"
    else:
        from wgrumus.distributed.pipeline import PipelineError
        from wgrumus.parallel import ReplicaError
        if not isinstance(e, (CollectiveError, ReplicaError, PipelineError)):
            return f"stall surfaced as {type(e).__name__}: {msg[:200]}"
    return None


def check(prim: str, plan: Plan, res: dict, T: float, seconds: float) -> list:
    problems = []
    if prim == "mpi":
        outs = res["mpi"]
        for r in range(2):
            if r not in outs:
                problems.append(f"rank {r} printed no outcome (rc {res['returncode']}): "
                                f"{res['stderr'][-400:]}")
                continue
            kind, secs, msg = outs[r]
            if r == plan.bad:
                want = {"raise": "InjectedFault", "stall": "CollectiveError", "exit": None}[
                    plan.fault]
                if want is None and kind != "exit" or want and want not in msg:
                    problems.append(f"faulty rank {r}: {kind} {msg}")
            elif kind != "error" or "CollectiveError" not in msg:
                problems.append(f"rank {r}: {kind} {msg}")
            elif secs > plan.stall + 2 * T + 3:
                problems.append(f"rank {r} took {secs:.2f} s to fail")
        return problems
    if "participants" in res:
        for r, o in sorted(res["participants"].items()):
            p = _participant_ok(plan, r, o)
            if p:
                problems.append(p)
    if res.get("benign"):
        if res["raised"] is not None or not np.isfinite(res["loss"]):
            problems.append(f"a stall nobody waits on failed the run: {res['raised']!r}")
    elif "raised" in res and prim in ("data_parallel", "pipeline"):
        p = _wrapper_ok(plan, prim, res["raised"])
        if p:
            problems.append(p)
    elif "raised" in res and res["raised"] is None:
        problems.append("spawn returned normally despite the fault")
    limit = plan.stall + 2 * T + 4.0
    if seconds > limit:
        problems.append(f"run took {seconds:.2f} s > bound {limit:.2f} s")
    return problems


def make_plan(prim: str, fault: str, rng, T: float) -> Plan:
    phase = "forward"
    if prim in ("data_parallel", "pipeline", "tensor_parallel", "fsdp"):
        phase = str(rng.choice(["forward", "backward"]))
    return Plan(fault, int(rng.integers(WORLD[prim])), int(rng.integers(STEPS[prim])), phase,
                stall=1.5 * T if fault == "stall" else 0.0, notify=bool(rng.integers(2)))


def run_one(prim: str, fault: str, seed: int, T: float, train_after: bool = True) -> dict:
    """One injected run; returns a JSON-able record with ``ok`` and any ``problems``."""
    rng = np.random.default_rng(seed)
    plan = make_plan(prim, fault, rng, T)
    baseline = thread_snapshot()
    t0 = time.monotonic()
    try:
        res = CASES[prim](plan, T, rng)
        seconds = time.monotonic() - t0
        problems = check(prim, plan, res, T, seconds)
    except Exception as e:  # the driver itself failed: a finding, not a crash
        seconds = time.monotonic() - t0
        res, problems = {}, [f"driver error {type(e).__name__}: {e}\n{traceback.format_exc()}"]
    if prim != "mpi" and not plan.fired:
        problems.append("the fault point was never reached")
    left = leftover_threads(baseline)
    if left:
        problems.append(f"threads left alive: {left}")
    fresh = None
    if train_after:
        try:
            fresh = fresh_training()
            if not fresh["ok"]:
                problems.append(f"fresh training after the fault failed: {fresh}")
        except Exception as e:  # noqa: BLE001
            problems.append(f"fresh training raised {type(e).__name__}: {e}")
    rec = {"primitive": prim, "fault": fault, "seed": seed, "bad": plan.bad, "step": plan.step,
           "phase": plan.phase, "notify": plan.notify, "seconds": round(seconds, 3),
           "ok": not problems, "problems": problems}
    if "participants" in res:
        rec["participants"] = {str(r): o.describe() for r, o in res["participants"].items()}
    if res.get("raised") is not None:
        rec["raised"] = f"{type(res['raised']).__name__}: {str(res['raised'])[:300]}"
    if "mpi" in res:
        rec["participants"] = {str(r): " ".join(map(str, v)) for r, v in res["mpi"].items()}
    if "schedule" in res:
        rec["schedule"] = res["schedule"]
    if res.get("benign"):
        rec["benign"] = True  # the stalled action had no waiter: success (later) is right
    return rec


def warm_up(T: float) -> None:
    """Compile every kernel and start the persistent pools once, so timeouts measure faults,
    not first-use shader compilation."""
    class NoFault(Plan):
        def hit(self, *a, **k):
            self.fired.append(a)
    for prim in PRIMITIVES:
        if prim == "mpi":
            continue
        rng = np.random.default_rng(0)
        res = CASES[prim](NoFault("none", -1, -1, stall=0.0), max(T, 30.0), rng)
        err = res.get("raised")
        bad = [o for o in res.get("participants", {}).values() if o.kind != "ok"]
        if err is not None or bad:
            raise RuntimeError(f"warm-up of {prim} failed: {err!r} {[o.describe() for o in bad]}")
    fresh_training()


def schedule_runs(n: int, seed: int, primitives=PRIMITIVES) -> list:
    """(primitive, fault, seed) for n runs: every primitive x fault pair in turn, order and
    per-run seeds drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    pairs = [(p, f) for p in primitives for f in FAULTS]
    runs = []
    while len(runs) < n:
        for k in rng.permutation(len(pairs)):
            runs.append((*pairs[k], int(rng.integers(1 << 30))))
    return runs[:n]


def campaign(n: int, seed: int, T: float, primitives=PRIMITIVES, log=print) -> list:
    warm_up(T)
    recs = []
    for i, (prim, fault, s) in enumerate(schedule_runs(n, seed, primitives)):
        rec = run_one(prim, fault, s, T)
        recs.append(rec)
        log(f"[{i + 1}/{n}] {prim:16s} {fault:6s} seed={s:<10d} {rec['seconds']:6.2f}s "
            f"{'ok' if rec['ok'] else 'FAIL ' + '; '.join(rec['problems'])[:400]}")
    return recs


def summarize(recs: list) -> dict:
    table: dict = {}
    for r in recs:
        row = table.setdefault(r["primitive"], {f: [0, 0, 0.0] for f in FAULTS})
        cell = row[r["fault"]]
        cell[0] += 1
        cell[1] += r["ok"]
        cell[2] = max(cell[2], r["seconds"])
    return table


# ============================================================================= nothing lost
# A child process trains and overwrites one checkpoint after every step; the parent kills it
# with SIGKILL at a random moment (seeded). The file left behind must load, hold exactly the
# state of a step the child reached, and resume: one more step equals the uninterrupted run's.
CKPT_DIMS = (256, 1024, 256)  # ~0.5 M weights + momentum: a ~4 MB file, so kills land mid-write


def ckpt_setup(device):
    import wgrumus as wr
    from wgrumus import nn
    m = nn.Sequential(nn.Linear(CKPT_DIMS[0], CKPT_DIMS[1], device=device, seed=1), nn.ReLU(),
                      nn.Linear(CKPT_DIMS[1], CKPT_DIMS[2], device=device, seed=2))
    opt = wr.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(7)
    X = wr.tensor(rng.standard_normal((16, CKPT_DIMS[0])).astype(np.float32), device=device)
    Y = wr.tensor(rng.standard_normal((16, CKPT_DIMS[2])).astype(np.float32), device=device)
    return m, opt, X, Y


def ckpt_train_step(m, opt, X, Y) -> float:
    from wgrumus import nn
    loss = nn.functional.mse_loss(m(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def ckpt_child(path: str) -> None:
    """``--ckpt-child PATH``: train forever, checkpointing after every step."""
    import wgrumus.io as wio
    dev = devices()[0]
    m, opt, X, Y = ckpt_setup(dev)
    step = 0
    write = wio.atomic_write

    def traced_write(path, data):  # marks the start of the file write for the parent
        print(f"WRITE {step} {len(data)}", flush=True)
        write(path, data)
    wio.atomic_write = traced_write
    while True:
        print(f"BEGIN {step}", flush=True)
        wio.save_checkpoint(path, m, opt, step=step)
        print(f"SAVED {step}", flush=True)
        ckpt_train_step(m, opt, X, Y)
        step += 1


class Reference:
    """The uninterrupted run's parameters after each step (computed on demand, cached)."""

    def __init__(self):
        self.m, self.opt, self.X, self.Y = ckpt_setup(devices()[0])
        self.states = [self._snap()]

    def _snap(self):
        return [p.numpy().copy() for p in self.m.parameters()]

    def at(self, step: int):
        while len(self.states) <= step:
            ckpt_train_step(self.m, self.opt, self.X, self.Y)
            self.states.append(self._snap())
        return self.states[step]


def kill_once(folder: Path, rng, ref: Reference, max_delay: float = 1.5) -> dict:
    """Start a checkpointing child, SIGKILL it after a random delay, check what is left."""
    import signal

    import wgrumus.io as wio
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.safetensors"
    if path.exists():
        path.unlink()
    env = _child_env(WGRUMUS_DEVICES="1")
    child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--ckpt-child",
                              str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=ROOT)
    lines: list = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True,
                              name="ckpt-child-reader")
    reader.start()
    t0 = time.monotonic()
    while not any(l.startswith("SAVED") for l in list(lines)):
        if child.poll() is not None or time.monotonic() - t0 > 120:
            child.kill()
            raise RuntimeError(f"checkpoint child never saved: {child.stderr.read()[-2000:]}")
        time.sleep(0.01)
    mode = str(rng.choice(["anytime", "during-write"]))
    if mode == "during-write":  # the next write that starts, killed 0-20 ms into it
        seen = sum(l.startswith("WRITE") for l in list(lines)) + int(rng.integers(0, 6))
        while sum(l.startswith("WRITE") for l in list(lines)) <= seen:
            if time.monotonic() - t0 > 120:
                break
            time.sleep(0.0005)
        delay = float(rng.uniform(0.0, 0.02))
    else:
        delay = float(rng.uniform(0.0, max_delay))
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    reader.join(10)
    child.stderr.close()
    saved = [int(l.split()[1]) for l in lines if l.startswith("SAVED")]
    events = [l.split()[0] for l in lines if l.split() and l.split()[0] in
              ("BEGIN", "WRITE", "SAVED")]
    # where the kill landed: serialising the state, writing the file, or training
    phase = {"BEGIN": "serialize", "WRITE": "write", "SAVED": "train"}[events[-1]]
    mid_write = phase == "write"
    nbytes = [int(l.split()[2]) for l in lines if l.startswith("WRITE")]
    temps = [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]
    rec = {"mode": mode, "delay": round(delay, 4), "phase": phase, "bytes": nbytes[-1],
           "last_saved": saved[-1], "mid_write": mid_write,
           "temp_files_left": len(temps), "returncode": child.returncode}
    problems = []
    m, opt, X, Y = ckpt_setup(devices()[0])
    try:
        info = wio.load_checkpoint(path, m, opt)
    except Exception as e:  # noqa: BLE001
        problems.append(f"checkpoint did not load: {type(e).__name__}: {e}")
    else:
        step = info["step"]
        rec["loaded_step"] = step
        if step not in (saved[-1], saved[-1] + 1):
            problems.append(f"loaded step {step}, last completed save was {saved[-1]}")
        for a, b in zip((p.numpy() for p in m.parameters()), ref.at(step)):
            if not np.allclose(a, b, rtol=1e-5, atol=1e-6):
                problems.append(f"weights of step {step} differ from the uninterrupted run")
                break
        ckpt_train_step(m, opt, X, Y)  # resume: one more step must match the reference
        for a, b in zip((p.numpy() for p in m.parameters()), ref.at(step + 1)):
            if not np.allclose(a, b, rtol=1e-4, atol=1e-5):
                problems.append(f"resumed step {step + 1} differs from the uninterrupted run")
                break
        wio.save_checkpoint(path, m, opt, step=step + 1)  # the resumed run checkpoints again:
        left = [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]
        rec["temp_files_after_next_save"] = len(left)  # ... and clears the killed one's litter
        if left:
            problems.append(f"temporary files of the killed writer survive the next save: {left}")
    rec["ok"], rec["problems"] = not problems, problems
    return rec


def kill_campaign(n: int, seed: int, folder: Path, log=print, max_delay: float = 1.5) -> list:
    rng = np.random.default_rng(seed)
    ref = Reference()
    recs = []
    for i in range(n):
        rec = kill_once(folder, rng, ref, max_delay)
        recs.append(rec)
        log(f"[kill {i + 1}/{n}] {rec['mode']:12s} +{rec['delay']:.4f}s in {rec['phase']:9s}: "
            f"last saved {rec['last_saved']}, loaded {rec.get('loaded_step')}, "
            f"temp files {rec['temp_files_left']} "
            f"{'ok' if rec['ok'] else 'FAIL ' + '; '.join(rec['problems'])}")
    return recs


def kill_cli_once(folder: Path, rng, max_delay: float = 2.0) -> dict:
    """The same through the real command: ``wgrumus train mlp --checkpoint DIR
    --checkpoint-every 1`` is SIGKILLed at a random moment, then ``--resume`` must continue."""
    import shutil
    import signal

    import wgrumus.io as wio
    shutil.rmtree(folder, ignore_errors=True)
    env = _child_env(WGRUMUS_DEVICES="2")
    cmd = [sys.executable, "-m", "wgrumus.cli", "train", "mlp", "--checkpoint", str(folder)]
    child = subprocess.Popen(cmd + ["--steps", "100000", "--checkpoint-every", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                             cwd=ROOT)
    ckpt = folder / "checkpoint.safetensors"
    t0 = time.monotonic()
    while not ckpt.exists() and child.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.01)
    delay = float(rng.uniform(0.0, max_delay))
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    temps = [p.name for p in folder.iterdir() if ".tmp" in p.name]
    rec = {"delay": round(delay, 3), "temp_files_left": len(temps), "problems": []}
    try:
        _, meta = wio.load_numpy(ckpt)
        step = int(meta["step"])
    except Exception as e:  # noqa: BLE001
        rec["problems"].append(f"checkpoint unreadable after the kill: {e}")
    else:
        rec["step"] = step
        p = subprocess.run(cmd + ["--steps", str(step + 2), "--resume", "--json"], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
            rec["resumed_final_loss"] = out["final_loss"]
            if p.returncode != 0 or not np.isfinite(out["final_loss"]):
                rec["problems"].append(f"resume failed (rc {p.returncode})")
        except Exception as e:  # noqa: BLE001
            rec["problems"].append(f"resume failed (rc {p.returncode}): {e} {p.stderr[-500:]}")
    rec["ok"] = not rec["problems"]
    return rec


def kill_cli_campaign(n: int, seed: int, folder: Path, log=print) -> list:
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        rec = kill_cli_once(folder, rng)
        recs.append(rec)
        log(f"[cli kill {i + 1}/{n}] +{rec['delay']:.3f}s: checkpoint step {rec.get('step')}, "
            f"temp files {rec['temp_files_left']}, resumed loss {rec.get('resumed_final_loss')} "
            f"{'ok' if rec['ok'] else 'FAIL ' + '; '.join(rec['problems'])}")
    return recs


# ============================================================================= concurrency
# The parallel tests, run again and again with random sleeps (seeded) injected at the points
# where threads meet: barrier arrivals, comm-thread all-reduces, thread transport send/recv,
# pipeline channels, device submit/read/write, data-loader prefetch, rank-worker job hand-off.
JITTER_POINTS = [
    "wgrumus.distributed.barrier:CollectiveBarrier.reduce",
    "wgrumus.distributed.barrier:CollectiveBarrier.wait",
    "wgrumus.distributed.comm:CommThread._all_reduce",
    "wgrumus.distributed.transport.threads:ThreadTransport.isend",
    "wgrumus.distributed.transport.threads:ThreadTransport.recv",
    "wgrumus.distributed.pipeline.executor:_Channel.put",
    "wgrumus.distributed.pipeline.executor:_Channel.get",
    "wgrumus.runtime.device:Device.flush",
    "wgrumus.runtime.device:Device.read_start",
    "wgrumus.runtime.device:Device.write",
    "wgrumus.data.loader:_Iter._put",
    "wgrumus.distributed.engine:Worker.submit",
    "wgrumus.distributed.process_group:ProcessGroup.all_reduce_async",
]
PARALLEL_TESTS = ["tests/test_barrier.py", "tests/test_comm.py", "tests/test_data_parallel.py",
                  "tests/test_pipeline.py", "tests/test_fsdp.py", "tests/test_tensor_parallel.py",
                  "tests/test_data.py", "tests/test_multidevice.py"]


def install_jitter(seed: int, max_delay: float = 0.003, prob: float = 0.3) -> list:
    """Wrap every JITTER_POINTS function so that, with probability ``prob``, it first sleeps a
    random time below ``max_delay`` seconds (one seeded RNG shared by all threads). Returns the
    points patched (a point whose module or name does not exist is skipped and not listed)."""
    import importlib
    import random
    rng, lock, patched = random.Random(seed), threading.Lock(), []
    for point in JITTER_POINTS:
        mod_name, qual = point.split(":")
        try:
            owner = importlib.import_module(mod_name)
        except ImportError:
            continue
        *path, name = qual.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None or getattr(fn, "_jittered", False):
            continue

        def wrapper(*a, __fn=fn, **k):
            with lock:
                d = rng.random() * max_delay if rng.random() < prob else 0.0
            if d:
                time.sleep(d)
            return __fn(*a, **k)
        wrapper._jittered = True
        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        setattr(owner, name, wrapper)
        patched.append(point)
    return patched


def pytest_configure(config):
    """Loaded as a pytest plugin (``-p reliability`` with benchmarks/ on PYTHONPATH): installs
    the jitter when WGRUMUS_JITTER_SEED is set."""
    seed = os.environ.get("WGRUMUS_JITTER_SEED")
    if seed is not None:
        patched = install_jitter(int(seed), float(os.environ.get("WGRUMUS_JITTER_MAX", "0.003")))
        report = os.environ.get("WGRUMUS_JITTER_REPORT")
        if report:
            Path(report).write_text("\n".join(patched))


def concurrency_run(seed: int, tests=PARALLEL_TESTS, extra=(), wall: float = 900) -> dict:
    """One pytest process over ``tests`` with jitter seeded by ``seed``."""
    import tempfile
    report = Path(tempfile.mkdtemp(prefix="wgrumus-jitter-")) / "points.txt"
    env = _child_env(ROOT / "benchmarks", ROOT, WGRUMUS_JITTER_SEED=str(seed),
                     WGRUMUS_JITTER_REPORT=str(report))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "reliability",
                        "-p", "no:cacheprovider", "-k", "not mpi", *extra, *tests],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=wall)
    out = p.stdout + p.stderr
    import re
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|error|errors|skipped)",
                                               out.splitlines()[-1] if out else "")}
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    points = report.read_text().split() if report.exists() else []
    return {"seed": seed, "returncode": p.returncode, "seconds": round(time.monotonic() - t0, 1),
            "counts": counts, "failed": failed, "jitter_points": len(points),
            "ok": p.returncode == 0 and len(points) > 0,
            "tail": "" if p.returncode == 0 else out[-3000:]}


def concurrency_campaign(n: int, seed: int, log=print, tests=PARALLEL_TESTS) -> list:
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        rec = concurrency_run(int(rng.integers(1 << 30)), tests)
        recs.append(rec)
        log(f"[concurrency {i + 1}/{n}] seed={rec['seed']} {rec['seconds']}s {rec['counts']} "
            f"{rec['jitter_points']} {'ok' if rec['ok'] else 'FAIL ' + str(rec['failed'])}")
    return recs


# ============================================================================= command line
# --------------------------------------------------------------------------------- host guards
def _raises(fn, cls, pattern: str) -> str | None:
    """None when ``fn()`` raises ``cls`` whose message matches ``pattern``, else the problem."""
    import re
    try:
        fn()
    except cls as e:
        return None if re.search(pattern, str(e)) else f"message {str(e)[:200]!r}"
    except BaseException as e:  # noqa: BLE001 - recorded
        return f"raised {type(e).__name__}: {str(e)[:200]}"
    return "no error (a silent result)"


def guard_shapes(rng) -> dict:
    """A random bad dimension (negative, or a float) in a random constructor or view."""
    import wgrumus as wr
    from wgrumus import nn
    from wgrumus.runtime.errors import ShapeError
    bad = [int(-rng.integers(2, 9)), float(rng.integers(1, 9)) + 0.5, float(rng.integers(1, 9))]
    d = bad[rng.integers(len(bad))]
    ok = int(rng.integers(1, 5))
    makers = {"reshape": lambda: wr.ones(ok * 6).reshape(d, -1 if d != -1 else 6),
              "expand": lambda: wr.ones(1, ok).expand(d, ok),
              "zeros": lambda: wr.zeros(d, ok), "rand": lambda: wr.rand(ok, d),
              "full": lambda: wr.full((ok, d), 1.0), "Linear": lambda: nn.Linear(d, ok)}
    name = list(makers)[rng.integers(len(makers))]
    problem = _raises(makers[name], ShapeError, r"negative dimension|dimensions must be ints")
    if problem is None:  # and the empty Linear of PyTorch works: out = bias over the batch
        lin = nn.Linear(0, ok)
        y = lin(wr.zeros(3, 0)).numpy()
        if not np.array_equal(y, np.broadcast_to(lin.bias.numpy(), (3, ok))):
            problem = "Linear(0, n) output is not its bias"
    return {"case": f"{name}({d!r})", "problem": problem}


def guard_collectives(rng, T: float) -> dict:
    """0-d arrays through a random strategy, or ranks that disagree (op, root, collective)."""
    from wgrumus import distributed as dist
    from wgrumus.distributed import CollectiveConfig, CollectiveError
    n = int(rng.integers(2, 5))
    strat = ["ring", "tree", "tree:3", "centralized", "native", "auto"][rng.integers(6)]
    rooted = {"ring": "direct", "centralized": "direct"}.get(strat, strat)
    cfg = CollectiveConfig(num_devices=n, local_all_reduce=strat, local_reduce=rooted,
                           local_broadcast=rooted, timeout=T)
    kind = ["zero_d", "op", "root", "collective"][rng.integers(4)]
    bad = int(rng.integers(1, n))
    t0 = time.monotonic()
    if kind == "zero_d":
        def fn(g):
            a = g.all_reduce(np.float32(g.rank))
            r = g.reduce(np.float32(1), root=n - 1)
            b = g.broadcast(np.float32(7) if g.rank == 0 else None, root=0)
            return a.shape, None if r is None else r.shape, b.shape
        try:
            out = dist.spawn(fn, n, timeout=T, config=cfg)
            problem = None if all(a == () and b == () for a, _, b in out) and out[-1][1] == () \
                else f"shapes {out}"
        except BaseException as e:  # noqa: BLE001 - recorded
            problem = f"raised {type(e).__name__}: {str(e)[:200]}"
    else:
        calls = {"op": lambda g: g.all_reduce(np.ones(3), "max" if g.rank == bad else "sum"),
                 "root": lambda g: g.broadcast(np.ones(3), root=bad if g.rank == bad else 0),
                 "collective": lambda g: g.barrier() if g.rank == bad
                 else g.all_reduce(np.ones(2))}
        problem = _raises(lambda: dist.spawn(calls[kind], n, timeout=T, config=cfg),
                          CollectiveError, "disagree|different collectives")
        if problem is None and time.monotonic() - t0 > T:
            problem = f"detected only after {time.monotonic() - t0:.2f} s (timeout {T} s)"
    return {"case": f"{kind} {strat} n={n}", "problem": problem,
            "seconds": round(time.monotonic() - t0, 3)}


def guard_rng(rng) -> dict:
    """Rank threads seed alike, meet, then draw weights and a dropout mask: all identical."""
    import wgrumus as wr
    from wgrumus import distributed as dist
    from wgrumus import nn
    n, seed = int(rng.integers(2, 5)), int(rng.integers(1 << 30))

    def fn(g):
        wr.manual_seed(seed)
        g.barrier()
        m = nn.Sequential(nn.Linear(8, 16, device=g.device), nn.Dropout(0.5))
        return np.concatenate([m[0].weight.numpy().ravel(),
                               m(wr.ones(4, 8, device=g.device)).numpy().ravel()])
    out = dist.spawn(fn, n, devices=devices()[:n], timeout=60)
    same = all(np.array_equal(out[0], o) for o in out[1:])
    return {"case": f"{n} ranks seed {seed}", "problem": None if same else "ranks differ"}


def guard_loading(rng, folder: Path) -> dict:
    """A corrupt wgrumus metadata string, or a float64 value float32 cannot hold."""
    from safetensors.numpy import save_file

    import wgrumus as wr
    from wgrumus import nn
    from wgrumus.io import CheckpointError, load_checkpoint
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / f"guard-{os.getpid()}.safetensors")
    if rng.integers(2):
        good = '{"format": "wgrumus-checkpoint-1", "step": 1, "rng": {"seed": 0, "calls": 0}}'
        cut = int(rng.integers(1, len(good) - 1))
        meta = good[:cut]  # truncated JSON, or (cut past the keys) incomplete metadata
        save_file({"model.weight": np.zeros((2, 2), np.float32)}, path, {"wgrumus": meta})
        problem = _raises(lambda: load_checkpoint(path, nn.Linear(2, 2, bias=False)),
                          CheckpointError, "corrupt wgrumus metadata|incomplete wgrumus metadata|"
                                           "format")
        case = f"metadata {meta!r}"
    else:
        v = float(rng.choice([1e39, -1e300, 1e-46, 4e38]))
        save_file({"w": np.array([1.0, v], np.float64)}, path)
        problem = _raises(lambda: wr.load(path), CheckpointError, "outside the float32 range")
        case = f"float64 {v!r}"
    os.unlink(path)
    return {"case": case, "problem": problem}


def guard_memory(steps: int = 300) -> dict:
    """Linear 32-64-10, AdamW, batch 128 (1.1 MB/step before the fix): RSS slope after
    warm-up, from benchmarks/soak.py."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import soak
    samples = soak.soak_model("linear", steps, every=50, warmup=100)
    v = soak.flatness(samples, 100, rss_slack_mb=8.0)
    return {"case": f"linear batch 128, {steps} steps: {v['rss_kb_per_step']} KB/step",
            "problem": "; ".join(v["problems"]) or None}


def guard_oom() -> dict:
    """A child limited to 6 GiB of address space allocates 96 MiB tensors until it cannot."""
    code = ("import resource, time, wgrumus as wr\n"
            "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
            "from wgrumus.runtime.errors import OutOfMemoryError\n"
            "ts, t0 = [], time.monotonic()\n"
            "try:\n    [ts.append(wr.empty(25_000_000)) for _ in range(400)]\n"
            "except OutOfMemoryError as e:\n    print('OOM', time.monotonic() - t0, e)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], env=_child_env(), capture_output=True,
                       text=True, timeout=120)
    ok = p.stdout.startswith("OOM") and "cannot allocate" in p.stdout
    return {"case": "RLIMIT_AS 6 GiB, 96 MiB tensors", "seconds": round(time.monotonic() - t0, 1),
            "problem": None if ok else (p.stdout + p.stderr)[-400:]}


def guards_campaign(n: int, seed: int, folder: Path, T: float, log=print) -> list:
    """``n`` seeded random cases of items 5-8 of issue 15 (shapes, collectives, rng, loading),
    then one memory soak and one out-of-memory child (items 9, 10)."""
    rng = np.random.default_rng(seed)
    kinds = {"shapes": guard_shapes, "collectives": lambda r: guard_collectives(r, T),
             "rng": guard_rng, "loading": lambda r: guard_loading(r, folder)}
    plan = [list(kinds)[i % len(kinds)] for i in range(n)]
    recs = []
    for i, kind in enumerate(plan + ["memory", "oom"]):
        t0 = time.monotonic()
        try:
            rec = (guard_memory() if kind == "memory" else guard_oom() if kind == "oom"
                   else kinds[kind](rng))
        except Exception as e:  # noqa: BLE001 - a case that crashes is a failed case
            rec = {"case": kind, "problem": f"raised {type(e).__name__}: {str(e)[:300]}"}
        rec = {"run": i, "kind": kind, "ok": rec["problem"] is None,
               "seconds": round(time.monotonic() - t0, 3), **rec}
        recs.append(rec)
        log(f"{i:3d} {kind:12s} {'ok ' if rec['ok'] else 'BAD'} {rec['case']}"
            + ("" if rec["ok"] else f": {rec['problem']}"))
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaign",
                    choices=["faults", "kill", "kill-cli", "concurrency", "numerics", "guards"],
                    default="faults")
    ap.add_argument("--runs", type=int, default=100, help="fault runs / concurrency repeats")
    ap.add_argument("--kills", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1.5, help="collective timeout, seconds")
    ap.add_argument("--primitives", default=",".join(PRIMITIVES))
    ap.add_argument("--folder", default="/tmp/wgrumus-kill", help="kill campaign's checkpoints")
    ap.add_argument("--json", help="write every run's record here")
    ap.add_argument("--mpi-worker", nargs=6, metavar="ARG", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-child", metavar="PATH", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.mpi_worker:
        mpi_worker(*a.mpi_worker)
        return 0
    if a.ckpt_child:
        ckpt_child(a.ckpt_child)
        return 0
    t0 = time.monotonic()
    if a.campaign == "kill":
        recs = kill_campaign(a.kills, a.seed, Path(a.folder))
        phases = {ph: sum(r["phase"] == ph for r in recs) for ph in ("serialize", "write",
                                                                      "train")}
        print(f"\n{sum(r['ok'] for r in recs)}/{len(recs)} kills left a loadable, resumable "
              f"checkpoint; kills landed in: {phases}; "
              f"{sum(r['temp_files_left'] for r in recs)} temp files left by the kills, "
              f"{sum(r.get('temp_files_after_next_save', 0) for r in recs)} after the next save; "
              f"{time.monotonic() - t0:.1f} s")
        summary = {}
    elif a.campaign == "kill-cli":
        recs = kill_cli_campaign(a.kills, a.seed, Path(a.folder))
        print(f"\n{sum(r['ok'] for r in recs)}/{len(recs)} killed CLI trainings resumed; "
              f"{sum(r['temp_files_left'] for r in recs)} temp files left by the kills; "
              f"{time.monotonic() - t0:.1f} s")
        summary = {}
    elif a.campaign == "numerics":  # benchmarks/reliability_numerics.py
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from reliability_numerics import numerics_campaign, summarize_numerics
        recs = numerics_campaign(a.runs, a.seed)
        summary = summarize_numerics(recs)
        print(f"\n{sum(r['ok'] for r in recs)}/{len(recs)} numerics runs matched numpy; "
              f"{time.monotonic() - t0:.1f} s")
        for case, (runs, ok, worst) in summary.items():
            print(f"{case:16s} {ok:>3d}/{runs:<3d} max {worst:6.2f}s")
    elif a.campaign == "guards":
        recs = guards_campaign(a.runs, a.seed, Path(a.folder), a.timeout)
        kinds = sorted({r["kind"] for r in recs})
        print(f"\n{sum(r['ok'] for r in recs)}/{len(recs)} host-guard cases held: "
              + ", ".join(f"{k} {sum(r['ok'] for r in recs if r['kind'] == k)}/"
                          f"{sum(r['kind'] == k for r in recs)}" for k in kinds)
              + f"; {time.monotonic() - t0:.1f} s")
        summary = {}
    elif a.campaign == "concurrency":
        recs = concurrency_campaign(a.runs, a.seed)
        print(f"\n{sum(r['ok'] for r in recs)}/{len(recs)} jittered runs of the parallel tests "
              f"passed; {time.monotonic() - t0:.1f} s")
        summary = {}
    else:
        prims = [p for p in a.primitives.split(",") if p]
        unknown = set(prims) - set(PRIMITIVES)
        if unknown:
            ap.error(f"unknown primitive(s) {sorted(unknown)}; choose from "
                     f"{', '.join(PRIMITIVES)}")
        recs = campaign(a.runs, a.seed, a.timeout, prims)
        summary = summarize(recs)
        print(f"\n{sum(r['ok'] for r in recs)}/{len(recs)} runs passed in "
              f"{time.monotonic() - t0:.1f} s (timeout {a.timeout} s)")
        print(f"{'primitive':16s} " + " ".join(f"{f:>16s}" for f in FAULTS))
        for prim, row in summary.items():
            print(f"{prim:16s} " + " ".join(
                f"{row[f][1]:>3d}/{row[f][0]:<3d} max {row[f][2]:5.2f}s" for f in FAULTS))
    if a.json:
        Path(a.json).write_text(json.dumps({"campaign": a.campaign, "runs": recs,
                                            "table": summary, "seconds": time.monotonic() - t0,
                                            "timeout": a.timeout, "seed": a.seed}, indent=1))
    return 0 if all(r["ok"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
