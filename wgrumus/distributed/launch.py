"""Starting ranks: ``spawn`` (threads of this process, processes that wgrumus starts, or this
process under mpiexec) and ``init_process_group`` (this process's group: a rank that a processes
launch started, or under mpiexec)."""
from __future__ import annotations

import contextlib
import sys
import threading
import time

from ..runtime.context import MultiGpuContext
from .collectives import CollectiveConfig
from .errors import CollectiveError
from .process_group import ProcessGroup
from .transport import MPITransport, ThreadWorld

_mpi_group: ProcessGroup | None = None
BACKENDS = ("threads", "processes", "mpi")
PER_PROCESS = ("processes", "mpi")  # backends whose ranks are processes, one device each


def _config(config, world_size, timeout, backend):
    """The caller's config, or the backend's best: threads share memory, so their native
    collectives beat message passing; processes take the size-based Auto rule."""
    if config is not None:
        cfg = config
    elif backend == "threads":
        cfg = CollectiveConfig(num_devices=world_size, local_all_reduce="native",
                               local_reduce="native", local_broadcast="native")
    elif backend == "processes":  # all-reduce stays auto: device tensors take the staged path
        cfg = CollectiveConfig(num_devices=world_size, local_reduce="native",
                               local_broadcast="native")
    else:
        cfg = CollectiveConfig(num_devices=world_size)
    if timeout is not None:
        cfg = cfg.with_(timeout=float(timeout))
    return cfg.validate()


def spawn(fn, world_size: int, backend: str = "threads", devices=None, timeout: float = 60.0,
          config: CollectiveConfig | None = None) -> list:
    """``fn(group)`` on ``world_size`` ranks, results in rank order: threads of this process (a
    rank's failure aborts the group and is re-raised with every rank's outcome in its notes),
    ``backend="processes"``: as many new processes, one adapter each (``devices``: adapter
    indices; ``fn`` must be importable, results picklable; a rank that dies or hangs is a
    CollectiveError in every other and here, and none outlives the call), or under ``mpiexec -n
    world_size`` this process's rank (results must be picklable)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if devices is not None and len(devices) < world_size:
        raise ValueError(f"{world_size} ranks need {world_size} devices, got {len(devices)}; "
                         f"pass more devices (WGRUMUS_DEVICES={world_size} makes that many "
                         f"logical devices) or fewer ranks")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    cfg = _config(config, world_size, timeout, backend)
    if backend == "mpi":
        return _spawn_mpi(fn, world_size, cfg, devices)
    if backend == "processes":
        from .processes import spawn_processes
        return spawn_processes(fn, world_size, cfg, _adapters(devices))
    return _spawn_threads(fn, world_size, cfg, devices)


def _spawn_threads(fn, world_size: int, cfg: CollectiveConfig, devices) -> list:
    """One daemon thread per rank (one stuck outside collectives cannot keep the process up)."""
    from ..ops.random import get_rng_state, use_thread_generator
    world = ThreadWorld(world_size, cfg.timeout)
    results = [None] * world_size
    failures: list[tuple[float, int, BaseException]] = []
    lock = threading.Lock()
    rng = get_rng_state()  # each rank starts its own generator here, as a process would

    def run(rank: int) -> None:
        use_thread_generator(rng)
        group = ProcessGroup(world.transport(rank), cfg,
                             devices[rank] if devices is not None else None)
        try:
            results[rank] = fn(group)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            with lock:
                failures.append((time.monotonic(), rank, e))
            err = CollectiveError(f"rank {rank} failed: {type(e).__name__}: {e}", rank=rank)
            err.__cause__ = e
            world.abort(err)
        else:
            world.mark_exited(rank)
        finally:
            group.close()

    threads = [threading.Thread(target=run, args=(r,), name=f"wgrumus-rank{r}", daemon=True)
               for r in range(world_size)]
    for t in threads:
        t.start()
    stuck = join_threads(threads, lambda: min((f[0] for f in failures), default=None),
                         cfg.timeout)
    world.close(0)  # the ranks' CommThreads (asynchronous device collectives) end on their own
    if failures:
        first = min(failures, key=lambda f: f[0])[2]
        for _, rank, e in sorted(failures, key=lambda f: f[1]):
            _note(first, f"rank {rank}: {type(e).__name__}: {e}")
        if stuck:
            _note(first, f"rank(s) {stuck} still running {cfg.timeout} s after the failure "
                         "(stuck outside collectives); abandoned")
        raise first
    return results


def _adapters(devices):
    """Adapter indices for spawned processes: ints as given, a Device by its host adapter."""
    if devices is None:
        return None
    out = []
    for d in devices:
        if isinstance(d, int):
            out.append(d)
        elif hasattr(d, "host_index"):
            out.append(d.host_index)
        else:
            raise TypeError(f"backend 'processes' takes adapter indices (ints) or Devices as "
                            f"devices, got {type(d).__name__}")
    return out


def join_threads(threads, failed_at, grace: float) -> list[int]:
    """Wait for every thread, at most ``grace`` s past ``failed_at()`` (the first failure's
    ``time.monotonic()``, None while there is none); the indices of those still alive."""
    while True:
        alive = [t for t in threads if t.is_alive()]
        if not alive:
            return []
        t0 = failed_at()
        if t0 is not None and time.monotonic() - t0 > grace:
            return [threads.index(t) for t in alive]
        alive[0].join(0.05)


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(text)


def init_process_group(backend: str | None = None, timeout: float = 60.0,
                       config: CollectiveConfig | None = None, device=None) -> ProcessGroup:
    """This process's group (the same one on every call): a rank started by a processes launch
    (``backend="processes"``, found from the environment when ``backend`` is None) or under
    ``mpiexec -n N`` (``"mpi"``). Called before any device exists, with several adapters, no
    ``device`` and WGRUMUS_DEVICES unset, it opens only adapter ``local rank % adapters``. An
    uncaught exception tells the other ranks before exiting, so they do not wait out their
    timeout."""
    global _mpi_group
    if backend is None:
        from .processes import launched
        backend = "processes" if launched() else "mpi"
    if backend not in PER_PROCESS:
        raise ValueError(f"init_process_group supports backend 'processes' or 'mpi' (got "
                         f"{backend!r}); for ranks as threads of one process use "
                         "dist.spawn(fn, world_size)")
    if _mpi_group is not None:
        if _mpi_group.backend != backend:
            raise ValueError(f"this process already joined a {_mpi_group.backend!r} group")
        return _mpi_group
    if backend == "processes":
        from .processes import transport_from_env
        t = transport_from_env(timeout)
        if device is None:
            MultiGpuContext.pin_local(t.rank)
        _mpi_group = ProcessGroup(t, _config(config, t.size, timeout, backend), device, "world")
        _install_excepthook(_mpi_group)
        return _mpi_group
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("the MPI backend needs mpi4py and an MPI library: "
                          "pip install 'wgrumus[mpi]' (mpi4py + the mpich wheel)") from e
    comm = MPI.COMM_WORLD
    t = MPITransport(comm, timeout)
    if device is None:  # before any device exists: this rank's adapter only
        MultiGpuContext.pin_local(t.local_rank)
    _mpi_group = ProcessGroup(t, _config(config, comm.Get_size(), timeout, "mpi"), device,
                              "world")
    _install_excepthook(_mpi_group)
    return _mpi_group


def rank_device(rank: int):
    """This process's device for ``rank`` (processes or MPI): its devices round-robin (the
    only one where init_process_group pinned the rank to its adapter)."""
    devs = MultiGpuContext.get().devices
    return devs[rank % len(devs)]


def _install_excepthook(group: ProcessGroup) -> None:
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if not issubclass(exc_type, KeyboardInterrupt):
            with contextlib.suppress(Exception):  # never hide the original error
                group.abort(exc)
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def _spawn_mpi(fn, world_size, cfg, devices):
    group = init_process_group("mpi", cfg.timeout, cfg)
    if group.world_size != world_size:
        raise ValueError(f"spawn(world_size={world_size}) under mpiexec with "
                         f"{group.world_size} processes; run mpiexec -n {world_size}")
    if devices is not None:
        group.device = devices[group.rank]
    try:
        result = fn(group)
    except BaseException as e:
        group.abort(e)
        raise
    return group.all_gather_object(result)
