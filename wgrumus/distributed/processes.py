"""One process per adapter, started by wgrumus itself (torchrun's model, no mpiexec): the launcher
creates the shared-memory segment, starts each rank as a fresh interpreter (never a fork of a
process that may hold a wgpu device) with its rank, world size, segment and launcher in the
environment, watches them, and turns a rank that dies or hangs into an abort every other rank sees.
Whatever happens, no rank outlives the launch and no segment stays in /dev/shm.

Why processes: replicas as threads of one process serialise on the host. A replay holds the
interpreter lock for its whole per-dispatch loop (runtime/replay.py: binding, dispatch and copy
calls through wgpu-py's cffi layer, each a short C call between Python bytecodes), and captures
and eager steps also take the process-wide encode lock there (``_ENCODE``, because wgpu-native
panicked when several threads recorded command encoders at once). With K replicas those loops
take turns on one interpreter; separate processes each have their own.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback

from .errors import CollectiveError
from .transport.shm import ShmState, ShmTransport, publish_abort
from .transport.shm_segment import Segment, new_world_name, sizes_for, unlink_all

ENV_RANK = "WGRUMUS_RANK"
ENV_WORLD = "WGRUMUS_WORLD_SIZE"
ENV_SHM = "WGRUMUS_SHM"
ENV_LAUNCHER = "WGRUMUS_LAUNCHER_PID"
_POLL = 0.02
FAILURE_GRACE = 5.0  # seconds a rank has to end after another failed, before it is killed


def launched() -> bool:
    """This process is a rank that a processes launch started."""
    return ENV_SHM in os.environ


def child_env(rank: int, world: int, name: str, adapter=None) -> dict:
    """The environment of rank ``rank``: who it is, where the segment is, which adapter."""
    env = dict(os.environ)
    env.update({ENV_RANK: str(rank), ENV_WORLD: str(world), ENV_SHM: name,
                ENV_LAUNCHER: str(os.getpid())})
    if adapter is not None:
        env["WGRUMUS_ADAPTER"] = str(adapter)
        env.pop("WGRUMUS_DEVICES", None)
    elif env.get("WGRUMUS_DEVICES"):
        env["WGRUMUS_DEVICES"] = "1"  # logical devices: each rank opens the one adapter once
    return env


def transport_from_env(timeout: float) -> ShmTransport:
    """This rank's transport on the launch's segment (marks the rank present, and ended at
    exit)."""
    import atexit
    try:
        rank, world, name = int(os.environ[ENV_RANK]), int(os.environ[ENV_WORLD]), \
            os.environ[ENV_SHM]
    except (KeyError, ValueError):
        raise ValueError("backend 'processes' joins ranks that wgrumus started: use "
                         "dist.spawn(fn, n, backend='processes') or wgrumus train --backend "
                         "processes (under mpiexec use backend 'mpi')") from None
    seg = Segment(name)
    if seg.world != world or not 0 <= rank < world:
        raise ValueError(f"{ENV_RANK}={rank} / {ENV_WORLD}={world} do not match the segment "
                         f"{name} of {seg.world} ranks")
    launcher = os.environ.get(ENV_LAUNCHER)
    state = ShmState(seg, rank, int(launcher) if launcher else None)
    seg.pids[rank] = os.getpid()
    atexit.register(_mark_exited, seg, rank)
    return ShmTransport(seg, rank, state, timeout=timeout)


def _mark_exited(seg: Segment, rank: int) -> None:
    with contextlib.suppress(Exception):
        seg.exited[rank] = 1


def _exit_text(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-rc).name}"
        return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


class _Launch:
    """The ranks of one launch and their shared segment: start, watch, end, clean up."""

    def __init__(self, world: int, timeout: float):
        self.world, self.timeout = world, float(timeout)
        self.name = new_world_name()
        ring, slot = sizes_for(world)
        self.seg = Segment(self.name, create_world=world, ring=ring, slot=slot)
        self.procs: list = []
        self.failures: list[tuple[float, int, BaseException]] = []
        self.notes: list[str] = []

    def fail(self, rank: int, exc: BaseException, publish: str | None = None) -> None:
        self.failures.append((time.monotonic(), rank, exc))
        if publish is not None and not int(self.seg.header[4]):
            publish_abort(self.seg, self.world, publish)

    def watch(self, exitcode, on_tick=None) -> None:
        """Until every rank ended; a failure gives the others FAILURE_GRACE (at most the
        timeout) to end, then they are killed."""
        grace = min(FAILURE_GRACE, self.timeout)
        ended = [False] * self.world
        while not all(ended):
            if on_tick is not None:
                on_tick()
            for r, p in enumerate(self.procs):
                if ended[r]:
                    continue
                rc = exitcode(p)
                if rc is None:
                    continue
                ended[r] = True
                if on_tick is not None:
                    on_tick()
                if rc != 0 and not any(f[1] == r for f in self.failures):
                    text = f"rank {r} (pid {p.pid}) {_exit_text(rc)}"
                    self.fail(r, CollectiveError(text, rank=r), text)
            if self.failures and not all(ended):
                first = min(f[0] for f in self.failures)
                if time.monotonic() - first > grace:
                    stuck = [r for r in range(self.world) if not ended[r]]
                    self.notes.append(f"rank(s) {stuck} still running {grace:.0f} s after the "
                                      "failure; killed")
                    self.kill()
                    return
            time.sleep(_POLL)

    def kill(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.kill()
        for p in self.procs:
            with contextlib.suppress(Exception):
                if hasattr(p, "join"):
                    p.join(5.0)
                else:
                    p.wait(5.0)

    def close(self) -> None:
        self.kill()
        self.seg.close()
        unlink_all(self.name)

    def raise_first(self) -> None:
        if not self.failures:
            return
        first = min(self.failures, key=lambda f: f[0])[2]
        for _, rank, e in sorted(self.failures, key=lambda f: f[1]):
            _note(first, f"rank {rank}: {type(e).__name__}: {e}")
        for n in self.notes:
            _note(first, n)
        raise first


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(text)


def spawn_processes(fn, world_size: int, config, adapters=None) -> list:
    """``fn(group)`` in ``world_size`` new processes (results in rank order)."""
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - lambdas, closures, bound methods of local objects
        raise ValueError(f"backend 'processes' runs fn in new processes, so it must be "
                         f"picklable (a function defined at module level, or a "
                         f"functools.partial of one); {fn!r} is not: {e}") from None
    ctx = multiprocessing.get_context("spawn")
    launch = _Launch(world_size, config.timeout)
    conns, results = [], [None] * world_size
    got, reported = [False] * world_size, [False] * world_size
    try:
        for r in range(world_size):
            parent_end, child_end = ctx.Pipe(duplex=False)
            env = child_env(r, world_size, launch.name,
                            adapters[r] if adapters is not None else None)
            p = ctx.Process(target=_child_main, args=(fn, config, env, child_end),
                            name=f"wgrumus-rank{r}", daemon=True)
            with _environ(env):  # the spawned interpreter starts with the rank's environment
                p.start()
            child_end.close()
            launch.procs.append(p)
            conns.append(parent_end)

        def take():
            for r, c in enumerate(conns):
                if got[r]:
                    continue
                try:
                    if not c.poll():
                        continue
                    ok, value = c.recv()
                except (EOFError, OSError):
                    got[r] = True
                    continue
                got[r] = reported[r] = True
                if ok:
                    results[r] = value
                else:
                    launch.fail(r, value)

        launch.watch(lambda p: p.exitcode, take)
        take()
        for r, p in enumerate(launch.procs):
            if not reported[r] and not any(f[1] == r for f in launch.failures):
                text = f"rank {r} (pid {p.pid}) ended without a result ({_exit_text(p.exitcode)})"
                launch.fail(r, CollectiveError(text, rank=r), text)
        launch.raise_first()
        return results
    finally:
        for c in conns:
            c.close()
        launch.close()


@contextlib.contextmanager
def _environ(env: dict):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _child_main(fn, config, env, conn) -> None:
    """A spawned rank: join the group, run ``fn``, report, end (marked ended for the peers)."""
    os.environ.update(env)
    from ..runtime.context import MultiGpuContext
    from .launch import rank_device
    from .process_group import ProcessGroup
    group = None
    try:
        t = transport_from_env(config.timeout)
        MultiGpuContext.pin_local(t.rank)
        group = ProcessGroup(t, config, None, "world")
        group.device = rank_device(t.rank)
        out = (True, fn(group))
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        if group is not None:
            with contextlib.suppress(Exception):
                group.abort(e)
        out = (False, _portable(e))
    try:
        conn.send(out)
    except Exception as e:  # noqa: BLE001 - e.g. a result that does not pickle
        conn.send((False, _portable(e)))
    finally:
        conn.close()
        if group is not None:
            group.close()


def _portable(e: BaseException) -> BaseException:
    """``e`` if it pickles, else a RuntimeError with its text and traceback."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        tb = "".join(traceback.format_exception(e))
        return RuntimeError(f"{type(e).__name__}: {e}\n{tb}")


def run_command(argv: list[str], world_size: int, timeout: float = 120.0) -> int:
    """``python -m wgrumus *argv`` as ``world_size`` ranks; rank 0 prints, the others' stdout is
    discarded; rank 0's exit code (1 when it succeeded but another rank failed)."""
    launch = _Launch(world_size, timeout)
    try:
        for r in range(world_size):
            launch.procs.append(subprocess.Popen(
                [sys.executable, "-m", "wgrumus", *argv], env=child_env(r, world_size,
                                                                      launch.name),
                stdout=None if r == 0 else subprocess.DEVNULL))
        launch.watch(lambda p: p.poll())
    except KeyboardInterrupt:
        # A terminal's Ctrl-C reached the ranks too (they stop after a checkpoint); a SIGINT
        # sent to this process alone is passed on after a moment.
        end = time.monotonic() + 2.0
        while time.monotonic() < end and any(p.poll() is None for p in launch.procs):
            time.sleep(_POLL)
        for p in launch.procs:
            if p.poll() is None:
                with contextlib.suppress(Exception):
                    p.send_signal(signal.SIGINT)
        with contextlib.suppress(BaseException):
            launch.watch(lambda p: p.poll())
        raise
    finally:
        launch.close()
    rc0 = launch.procs[0].returncode
    if launch.failures:
        first = min(launch.failures, key=lambda f: f[0])
        if first[1] != 0 or rc0 == 0:
            print(f"wgrumus: {first[2]}" + "".join(f"; {n}" for n in launch.notes),
                  file=sys.stderr, flush=True)
    if rc0 is None or rc0 < 0:
        return 1
    return rc0 if rc0 != 0 or not launch.failures else 1
