"""ProcessGroup: the collectives one rank calls, over either transport (threads or MPI).

Methods take a numpy array or a Tensor and *return* the result (Tensor in, Tensor out on its
device). As with MPI and NCCL, all ranks call the same collectives in the same order; a rank that
fails or never arrives makes the others raise CollectiveError by the deadline and breaks the group.
Inside a ``wr.jit`` capture a call on tensors is a ``capture.host_op`` the replay runs again.
"""
from __future__ import annotations

import contextlib
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from types import SimpleNamespace

import numpy as np

from ..runtime import capture
from . import collectives as C
from .collectives import CollectiveConfig
from .device_collectives import movable_slice, on_devices
from .errors import CollectiveError
from .host_reduce import check_op
from .interop import from_numpy, is_tensor, to_numpy


class Work:
    """Handle of a nonblocking operation: ``wait(timeout=None)`` returns its result (by default
    waiting until the group's deadline); a failure or timeout breaks the group."""

    def __init__(self, group, finish, deadline, name: str | None = None, nbytes: int = 0):
        self._group, self._finish, self._deadline = group, finish, deadline
        self._name, self._nbytes, self._t0 = name, nbytes, time.perf_counter()
        self._done, self._result = False, None

    def wait(self, timeout: float | None = None):
        if not self._done:
            deadline = self._deadline if timeout is None else time.monotonic() + timeout
            try:
                self._result = self._finish(deadline)
            except FutureTimeout:  # still queued or running on the group's background thread
                err = CollectiveError(f"rank {self._group.rank}: a nonblocking call did not "
                                      "finish in time", timed_out=True)
                self._group._fail(err)
                raise err from None
            except CollectiveError as e:
                self._group._fail(e)
                raise
            except BaseException as e:
                raise self._group._failed_inside(self._name or "a nonblocking call", e) from e
            self._done = True
            if self._name is not None:  # counted here, not by the call it started
                self._group._record(self._name, self._nbytes, time.perf_counter() - self._t0)
        return self._result


class ProcessGroup:
    """One rank's view of a group of ranks: rank, world_size, collectives, point-to-point, stats."""

    def __init__(self, transport, config: CollectiveConfig | None = None, device=None,
                 name: str = "world", ranks=None):
        self._t = transport
        self.rank, self.world_size, self.backend = transport.rank, transport.size, transport.backend
        self.config = (config or CollectiveConfig(num_devices=transport.size)).validate()
        self.device, self.name = device, name
        self.ranks = tuple(ranks) if ranks is not None else tuple(range(transport.size))
        self._lock = threading.RLock()
        self._seq = self._splits = 0
        self._hier = None
        self._broken: CollectiveError | None = None
        # user tags below, collective tags (a sequence number each) from the middle up
        self._coll_base = transport.tag_ub // 2 + 1
        self._coll_span = transport.tag_ub - self._coll_base
        self.max_user_tag = self._coll_base - 1
        self._ops: dict[str, list] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._children: list[ProcessGroup] = []

    def __repr__(self):
        return (f"ProcessGroup({self.name}: rank {self.rank}/{self.world_size}, "
                f"{self.backend}, ranks {list(self.ranks)})")

    @property
    def timeout(self) -> float:
        return self.config.timeout

    def _run(self, name: str, nbytes, fn, collective: bool = True, detail: str = ""):
        """One operation under the group's deadline, with stats; any error breaks the group.
        Collectives take the next sequence number as tag (every rank counts the same ones) and
        first compare ``name`` and ``detail``, so a mismatch is an error, not a hang."""
        with self._lock:
            self._check_usable()
            if collective:
                self._seq += 1
            tag = self._coll_base + self._seq % self._coll_span
            deadline = time.monotonic() + self.config.timeout
            t0 = time.perf_counter()
            try:
                if collective:
                    self._t.agree(self._seq, name, detail, deadline)
                out = fn(tag, deadline)
            except CollectiveError as e:
                self._fail(e)
                raise
            except BaseException as e:
                self._failed_inside(name, e)
                raise
            self._record(name, out.nbytes if nbytes is None else nbytes,
                         time.perf_counter() - t0)
            return out

    def _record(self, name, nbytes, seconds):
        rec = self._ops.setdefault(name, [0, 0, 0.0])
        rec[0] += 1
        rec[1] += int(nbytes)
        rec[2] += seconds

    def _check_usable(self):
        if self._broken is None:
            try:
                self._t.check()  # MPI: picks up an abort notice a peer sent meanwhile
            except CollectiveError as e:
                self._broken = e
        b = self._broken or self._t.failed
        if b is not None:
            raise CollectiveError(f"process group {self.name} is broken by an earlier failure: "
                                  f"{b}", missing=b.missing, rank=b.rank,
                                  timed_out=b.timed_out) from b

    def _failed_inside(self, name: str, e: BaseException) -> CollectiveError:
        """Break the group over a non-collective error ``e`` raised inside ``name``."""
        err = CollectiveError(f"rank {self.rank} failed inside {name}: {type(e).__name__}: {e}",
                              rank=self.rank)
        err.__cause__ = e
        self._fail(err)
        return err

    def _fail(self, err: CollectiveError) -> None:
        if self._broken is None:
            self._broken = err
        with contextlib.suppress(Exception):  # telling peers is best effort; we raise anyway
            self._t.abort(err)

    def abort(self, exc: BaseException | None = None) -> None:
        """Break the group on purpose: peers waiting in a collective raise at once."""
        err = exc if isinstance(exc, CollectiveError) else CollectiveError(
            f"rank {self.rank} aborted: {type(exc).__name__}: {exc}" if exc is not None
            else f"rank {self.rank} aborted", rank=self.rank)
        if err is not exc and exc is not None:
            err.__cause__ = exc
        self._fail(err)

    def _check_rank(self, r: int, what: str) -> int:
        if not isinstance(r, (int, np.integer)) or not 0 <= r < self.world_size:
            raise ValueError(f"{what} must be a rank in [0, {self.world_size}), got {r!r}")
        return int(r)

    def all_reduce(self, x, op: str = "sum", strategy=None):
        """Reduce ``x`` over all ranks (op: sum, mean, max, min); every rank gets the result."""
        if _captured(x):
            return capture.host_op(x.device, lambda t: self.all_reduce(t, op, strategy), x)
        if strategy is None and is_tensor(x) and \
                (out := on_devices(self, "all_reduce", x, op=op)) is not None:
            return out
        shared = self._shared() if strategy is None else None
        if shared and (s := movable_slice(x)) is not None and shared(s.nbytes):
            return self._shared_device_all_reduce(x, s, op)
        arr, dev = to_numpy(x)
        check_op(op, arr.dtype)
        if strategy is None and self.config.num_nodes is not None and self.world_size > 1:
            return from_numpy(self._hierarchical_all_reduce(arr, op), dev)
        if shared and shared(arr.nbytes):
            strategy = "native"  # processes of one host: through their shared memory
        strat = self.config.select_all_reduce(arr.nbytes, self.world_size, strategy)
        out = self._run("all_reduce", arr.nbytes,
                        lambda tag, dl: C.all_reduce(self._t, arr, op, strat, tag, dl),
                        detail=_detail(arr, op=op, strategy=strat))
        return from_numpy(out.reshape(arr.shape), dev)  # (some paths make 0-d arrays 1-d)

    def _shared(self):
        """The transport's ``native_shared(nbytes)`` where all-reduces may use it, else None."""
        if self.config.local_all_reduce.kind == "auto" and self.config.num_nodes is None:
            return getattr(self._t, "native_shared", None)
        return None

    def _shared_device_all_reduce(self, x, s, op, early=None):
        """Processes or MPI ranks of one host: a device tensor through the host's shared memory,
        pipelined (``early``: its first downloads, issued already)."""
        check_op(op, s.dtype)
        from ..tensor import Tensor
        out = Tensor.empty(tuple(x.shape), s.device, s.dtype)
        strat = self.config.select_all_reduce(s.nbytes, self.world_size, "native")
        spec = SimpleNamespace(shape=tuple(x.shape), dtype=s.dtype)  # as the host path's array

        def run(tag, dl):
            if self._t.device_all_reduce(s, out.buffer_slice(), op, dl, early=early):
                return out
            arr, dev = to_numpy(x)  # no shared window after all (the same on every rank)
            return from_numpy(self._t.native_all_reduce(arr, op, dl).reshape(arr.shape), dev)
        return self._run("all_reduce", s.nbytes, run,
                         detail=_detail(spec, op=op, strategy=strat))

    def all_reduce_async(self, x, op: str = "sum") -> Work:
        """Start ``all_reduce(x, op)`` in order on a communication thread (threads backend, device
        tensors: the rank's CommThread, no numpy round trip); ``Work.wait`` returns the result.
        Leave ``x`` and this group alone until then."""
        self._check_usable()
        if _captured(x):  # replays start it here and wait where (and as long as) this waits
            return capture.host_launch(x.device, lambda t: self.all_reduce_async(t, op), x)
        deadline = time.monotonic() + self.config.timeout
        s = movable_slice(x) if is_tensor(x) and self.config.num_nodes is None else None
        world = getattr(self._t, "world", None)
        if s is not None and world is None:
            return self._shared_device_all_reduce_async(x, s, op)
        if s is None:
            return self.run_async(lambda: self.all_reduce(x, op))
        check_op(op, s.dtype)
        from ..tensor import Tensor
        out = Tensor.empty(tuple(x.shape), s.device, s.dtype)
        try:
            handle = world.comm_thread(self.rank, s.device).submit(
                s, world.comm_barrier, op, target=out, dst=out.buffer_slice())
        except CollectiveError as e:
            self._fail(e)
            raise
        # counted as an all_reduce; the closure holds x (its buffer stays out of the pool)
        return Work(self, lambda dl, _x=x: handle.wait(_left(dl)), deadline, "all_reduce",
                    s.nbytes)

    def _shared_device_all_reduce_async(self, x, s, op) -> Work:
        """Processes (or MPI ranks with a shared window) of one host: the call runs on the
        group's background thread, but its first downloads are issued here, in order after the
        work that produced ``x`` (staged_collectives.EarlyDownload)."""
        shared = self._shared()
        chunk = self._t.device_chunk_bytes() if shared and shared(s.nbytes) else None
        if chunk is None:
            return self.run_async(lambda: self.all_reduce(x, op))
        check_op(op, s.dtype)
        self._check_usable()
        from .staged_collectives import EarlyDownload
        early = EarlyDownload(s, chunk)

        def run():
            try:
                return self._shared_device_all_reduce(x, s, op, early)
            finally:
                early.release()  # (nothing left once the engine took them over)
        try:
            return self.run_async(run)
        except BaseException:
            early.release()
            raise

    def run_async(self, fn) -> Work:
        """Run ``fn()`` on the group's background thread after what was started there."""
        self._check_usable()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, f"wgrumus-{self.name}-rank{self.rank}")
            fut = self._pool.submit(fn)
        return Work(self, lambda dl: fut.result(_left(dl)), time.monotonic() + self.config.timeout)

    def close(self) -> None:
        """Stop the background threads of this group and its subgroups (queued calls cancelled)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for child in self._children:
            child.close()

    def reduce(self, x, root: int = 0, op: str = "sum", strategy=None):
        """Reduce ``x`` over all ranks to ``root``; returns the result on root, None elsewhere."""
        arr, dev = to_numpy(x)
        check_op(op, arr.dtype)
        root = self._check_rank(root, "root")
        strat = self.config.select_reduce(arr.nbytes, self.world_size, strategy)

        def go(tag, dl):
            if strat.kind == "native":
                out = self._t.native_reduce(np.ascontiguousarray(arr), op, root, dl)
            elif strat.kind == "direct":
                out = C.direct_reduce(self._t, arr, op, root, tag, dl)
            else:
                out = C.tree_reduce(self._t, arr, op, root, strat.arity, tag, dl)
            return out if out is None else out.reshape(arr.shape)

        return from_numpy(self._run("reduce", arr.nbytes, go,
                                    detail=_detail(arr, op=op, root=root, strategy=strat)), dev)

    def broadcast(self, x=None, root: int = 0, strategy=None):
        """Root's ``x`` on every rank; others pass None or a like-shaped array (checked)."""
        if _captured(x):
            return capture.host_op(x.device, lambda t: self.broadcast(t, root, strategy), x)
        if x is None and capture.recording(self.device):
            capture.refuse("broadcast(None) on a non-root rank", "its result would be a "
                           "constant of the capture; pass a tensor of the expected shape")
        root = self._check_rank(root, "root")
        if strategy is None and (out := on_devices(self, "broadcast", x, root=root)) is not None:
            return out
        arr, dev = to_numpy(x) if x is not None else (None, None)
        if self.rank == root and arr is None:
            raise ValueError(f"broadcast: the root (rank {root}) must pass the data")
        strat = self.config.select_broadcast(0, self.world_size, strategy)

        def go(tag, dl):
            if strat.kind == "native":
                src = np.asarray(arr, order="C") if self.rank == root else None
                out = self._t.native_broadcast(src, root, dl)
            elif strat.kind == "direct":
                out = C.direct_broadcast(self._t, arr, root, tag, dl)
            else:
                out = C.tree_broadcast(self._t, arr, root, strat.arity, tag, dl)
            if arr is not None and (out.shape != arr.shape or out.dtype != arr.dtype):
                raise CollectiveError(f"broadcast: root sent {out.dtype} {out.shape}, rank "
                                      f"{self.rank} expected {arr.dtype} {arr.shape}")
            return out

        return from_numpy(self._run("broadcast", None, go,
                                    detail=f"root {root} strategy {strat!r}"), dev)

    def all_gather(self, x, axis: int = 0, strategy=None):
        """Every rank's ``x`` concatenated along ``axis`` in rank order (sizes there may differ)."""
        if _captured(x):
            return capture.host_op(x.device, lambda t: self.all_gather(t, axis, strategy), x)
        if strategy is None and is_tensor(x) and \
                (out := on_devices(self, "all_gather", x, axis=axis)) is not None:
            return out
        arr, dev = to_numpy(x)
        return from_numpy(self._along_axis(
            "all_gather", np.atleast_1d(arr), axis, strategy, "",
            lambda front, dl: self._t.native_all_gather(front, dl),
            lambda front, tag, dl: C.ring_all_gather(self._t, front, tag, dl)), dev)

    def reduce_scatter(self, x, op: str = "sum", axis: int = 0, strategy=None):
        """This rank's part along ``axis`` (numpy.array_split rule) of the reduction of ``x``."""
        if _captured(x):
            return capture.host_op(x.device,
                                   lambda t: self.reduce_scatter(t, op, axis, strategy), x)
        if strategy is None and is_tensor(x) and \
                (out := on_devices(self, "reduce_scatter", x, op=op, axis=axis)) is not None:
            return out
        arr, dev = to_numpy(x)
        check_op(op, arr.dtype)
        if arr.ndim == 0:
            raise ValueError("reduce_scatter needs an array with at least one dimension")
        return from_numpy(self._along_axis(
            "reduce_scatter", arr, axis, strategy, f"op {op} ",
            lambda front, dl: self._t.native_reduce_scatter(front, op, dl),
            lambda front, tag, dl: C.ring_reduce_scatter(self._t, front, op, tag, dl)), dev)

    def _along_axis(self, name: str, arr, axis: int, strategy, detail: str, native, ring):
        """All-gather / reduce-scatter by ``native`` or ``ring`` on ``axis`` moved to the front."""
        if strategy is None:
            kind = self.config.local_all_reduce.kind
            use_native = kind == "native" or (kind == "auto" and
                                              getattr(self._t, "prefers_native", False))
        elif str(strategy).lower() in ("ring", "native"):
            use_native = str(strategy).lower() == "native"
        else:
            raise ValueError(f"{name} strategy must be 'ring' or 'native', got {strategy!r}")
        if not -arr.ndim <= axis < arr.ndim:
            raise ValueError(f"axis {axis} out of range for an array of {arr.ndim} dimensions")
        axis %= arr.ndim
        front = np.ascontiguousarray(np.moveaxis(arr, axis, 0))
        # dim 0 of an all-gather may differ between ranks: compare the rest
        shape = front.shape if name == "reduce_scatter" else ("*",) + front.shape[1:]
        out = self._run(name, arr.nbytes,
                        lambda tag, dl: native(front, dl) if use_native else ring(front, tag, dl),
                        detail=f"axis {axis} shape {shape} dtype {arr.dtype} {detail}strategy "
                               f"{'native' if use_native else 'ring'}")
        return np.ascontiguousarray(np.moveaxis(out, 0, axis))

    def barrier(self) -> None:
        """Return once every rank of the group has called barrier()."""
        self._run("barrier", 0, lambda tag, dl: self._t.native_barrier(dl))

    def isend(self, x, dst: int, tag: int = 0) -> Work:
        """Start sending ``x`` to ``dst`` (under MPI keep ``x`` unchanged until ``wait()``)."""
        if _captured(x):
            capture.host_op(x.device, lambda t: self.isend(t, dst, tag).wait(), x)
            return Work(self, lambda dl: None, time.monotonic() + self.config.timeout)
        if is_tensor(x) and getattr(self._t, "send_device", None) is not None and \
                (s := movable_slice(x)) is not None:
            return self._isend_device(x, s, dst, tag)
        arr, _ = to_numpy(x)
        dst = self._check_rank(dst, "dst")
        tag = self._check_tag(tag)
        arr = np.ascontiguousarray(arr)
        with self._lock:
            self._check_usable()
            deadline = time.monotonic() + self.config.timeout
            t0 = time.perf_counter()
            try:
                reqs = self._t.send_array(dst, tag, arr, deadline)
            except CollectiveError as e:
                self._fail(e)
                raise
            self._record("send", arr.nbytes, time.perf_counter() - t0)
        return Work(self, lambda dl: self._t.wait_all(reqs, dl), deadline)

    def _isend_device(self, x, s, dst: int, tag: int) -> Work:
        """A device tensor straight from mapped staging into the transport (processes)."""
        dst = self._check_rank(dst, "dst")
        tag = self._check_tag(tag)
        with self._lock:
            self._check_usable()
            deadline = time.monotonic() + self.config.timeout
            t0 = time.perf_counter()
            try:
                reqs = self._t.send_device(s, tuple(x.shape), dst, tag, deadline)
            except CollectiveError as e:
                self._fail(e)
                raise
            except BaseException as e:
                raise self._failed_inside("send", e) from e
            self._record("send", s.nbytes, time.perf_counter() - t0)
        return Work(self, lambda dl, _x=x: self._t.wait_all(reqs, dl), deadline)

    def send(self, x, dst: int, tag: int = 0) -> None:
        """Send ``x`` to rank ``dst``; returns once it is delivered or buffered."""
        self.isend(x, dst, tag).wait()

    def recv(self, src: int, tag: int = 0, device=None):
        """Receive the array rank ``src`` sent with ``tag``; a Tensor on ``device`` if given."""
        if device is not None and capture.recording(device):
            return capture.host_op(device, lambda: self.recv(src, tag, device))
        src = self._check_rank(src, "src")
        tag = self._check_tag(tag)
        if device is not None and getattr(self._t, "recv_device", None) is not None:
            def go(_t, dl):
                t = self._t.recv_device(src, tag, device, dl)
                return SimpleNamespace(tensor=t, nbytes=t.numel() * t.dtype.itemsize)
            return self._run("recv", None, go, collective=False).tensor
        out = self._run("recv", None, lambda _t, dl: self._t.recv_array(src, tag, dl),
                        collective=False)
        return from_numpy(out, device)

    def _check_tag(self, tag) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= self.max_user_tag:
            raise ValueError(f"tag must be an int in [0, {self.max_user_tag}], got {tag!r}")
        return int(tag)

    def all_gather_object(self, obj) -> list:
        """Every rank's picklable ``obj``, in rank order."""
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = self.all_gather(np.array([data.size], dtype=np.int64))
        flat = self.all_gather(data)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return [pickle.loads(flat[bounds[i]:bounds[i + 1]].tobytes())
                for i in range(self.world_size)]

    def split(self, color: int | None, key: int | None = None, name: str | None = None):
        """MPI_Comm_split: ranks of one ``color`` form a group ordered by (key, rank)."""
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise ValueError(f"color must be an int >= 0 or None, got {color!r}")
        with self._lock:
            me = [-1 if color is None else int(color), self.rank if key is None else int(key),
                  self.rank]
            table = self.all_gather(np.array([me], dtype=np.int64))
            self._splits += 1
            members = [] if color is None else [  # ordered by (key, rank)
                r for _, r in sorted((int(k), int(r)) for c, k, r in table if c == color)]
            sub = self._t.split(("split", self._splits, color), color, members)
        if sub is None:
            return None
        cfg = self.config.with_(num_devices=len(members), num_nodes=None, global_all_reduce=None,
                                global_reduce=None, global_broadcast=None)
        child = ProcessGroup(sub, cfg, self.device, name or f"{self.name}/{color}",
                             [self.ranks[m] for m in members])
        self._children.append(child)
        return child

    def new_group(self, ranks, name: str | None = None):
        """A group of ``ranks`` in that order (None outside it); every rank calls it."""
        ranks = [self._check_rank(r, "ranks[i]") for r in ranks]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"new_group: ranks must be distinct, got {ranks}")
        inside = self.rank in ranks
        return self.split(0 if inside else None, ranks.index(self.rank) if inside else None, name)

    def _hierarchical_all_reduce(self, arr, op):
        """Multi-node: reduce in each node, all-reduce among node leaders, broadcast in nodes."""
        cfg = self.config
        per = cfg.num_devices
        if per * cfg.num_nodes != self.world_size:
            raise ValueError(f"CollectiveConfig says {cfg.num_nodes} nodes x {per} devices = "
                             f"{per * cfg.num_nodes} ranks, but the group has {self.world_size}")
        if self._hier is None:
            node, local = divmod(self.rank, per)
            local_g = self.split(node, local, f"{self.name}/node{node}")
            leaders = self.split(0 if local == 0 else None, node, f"{self.name}/leaders")
            if leaders is not None:
                leaders.config = leaders.config.with_(
                    local_all_reduce=cfg.global_all_reduce, local_reduce=cfg.global_reduce,
                    local_broadcast=cfg.global_broadcast)
            self._hier = (local_g, leaders)
        local_g, leaders = self._hier
        inner = "sum" if op == "mean" else op

        def go(tag, dl):
            part = local_g.reduce(arr, 0, inner)
            if leaders is not None:
                part = leaders.all_reduce(part, inner)
                if op == "mean":
                    np.divide(part, self.world_size, out=part)
            return local_g.broadcast(part if local_g.rank == 0 else None, 0)

        return self._run("all_reduce", arr.nbytes, go,
                         detail=_detail(arr, op=op, strategy="hierarchical"))

    def stats(self) -> dict:
        """Calls, payload bytes and seconds per operation and in total, plus the transport's."""
        ops = {k: {"calls": v[0], "bytes": v[1], "seconds": v[2]} for k, v in self._ops.items()}
        totals = [sum(v[i] for v in self._ops.values()) for i in range(3)]
        return dict(zip(("operations", "bytes", "seconds"), totals), by_op=ops, **self._t.stats)


def _captured(x) -> bool:
    """``x`` is a tensor on a device this thread is capturing (wr.jit)."""
    return x is not None and is_tensor(x) and capture.recording(x.device)


def _detail(arr, **fields) -> str:
    """What ranks must agree on for a collective over ``arr`` (compared before data moves)."""
    return " ".join([f"shape {arr.shape} dtype {arr.dtype}"]
                    + [f"{k} {v!r}" if k == "strategy" else f"{k} {v}" for k, v in fields.items()])


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
