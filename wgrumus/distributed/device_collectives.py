"""The thread backend's collectives on device tensors, through the pipelined staging engine
instead of a numpy round trip. The ranks first agree in one round: the engine runs only when every
rank passed a movable tensor; otherwise all take the host path together."""
from __future__ import annotations

import numpy as np

from . import staged_collectives
from .errors import CollectiveError
from .host_reduce import check_op
from .transport import split_bounds


def movable_slice(x):
    """x's BufferSlice when the engine can move it (contiguous, aligned, runtime device)."""
    from ..runtime.device import Device
    if not (hasattr(x, "buffer_slice") and isinstance(getattr(x, "device", None), Device)):
        return None
    try:
        return x.buffer_slice() if x.is_contiguous() else None
    except ValueError:  # offset or size not a multiple of 4 bytes
        return None


def on_devices(group, name: str, x, **kw):
    """The result Tensor of collective ``name`` through the engine, or None for the host path."""
    barrier = getattr(getattr(group._t, "world", None), "barrier", None)
    if barrier is None or group.config.num_nodes is not None or group.world_size == 1:
        return None
    s = movable_slice(x) if x is not None else None
    if s is not None and kw.get("op") is not None:
        check_op(kw["op"], s.dtype)  # bad input raises before any rank waits on this one
    mine = (name, s is not None, str(s.dtype) if s else None, tuple(x.shape) if s else None)
    try:
        everyone = barrier.gather(mine, rank=group.rank, tag="device-collective")
    except CollectiveError as e:
        group._fail(e)
        raise
    names = {e[0] for e in everyone}
    if len(names) > 1:
        err = CollectiveError(f"ranks called different collectives at once: "
                              f"{', '.join(f'rank {r}: {e[0]}' for r, e in enumerate(everyone))}")
        group._fail(err)
        raise err
    if not all(e[1] for e in everyone):
        return None
    if len({e[2] for e in everyone}) > 1:
        return _mismatch(group, name, everyone)
    shapes = [e[3] for e in everyone]
    shape = shapes[group.rank]
    if name in ("reduce_scatter", "all_gather") and (not shape or kw["axis"] % len(shape)):
        return None  # along another axis than dim 0: the host path
    # what must be equal on every rank: the shape (all_gather: all but dim 0, which must exist)
    alike = {(len(sh) > 0, sh[1:]) if name == "all_gather" else sh for sh in shapes}
    if len(alike) > 1:
        return _mismatch(group, name, everyone)
    fn = {"all_reduce": _all_reduce, "reduce_scatter": _reduce_scatter,
          "all_gather": _all_gather, "broadcast": _broadcast}[name]
    plan = fn(group, s, shapes, **kw)
    if plan is None:
        return None
    out, work = plan

    def go(_tag, _deadline):
        work(barrier)
        return out

    return group._run(name, s.nbytes, go)


def _mismatch(group, name, everyone):
    err = CollectiveError(f"{name}: ranks passed different tensors: " + ", ".join(
        f"rank {r}: {e[2]} {e[3]}" for r, e in enumerate(everyone)))
    group._fail(err)
    raise err


def _empty_like(s, shape):
    """A new tensor of ``shape`` on ``s``'s device and dtype, and its BufferSlice."""
    from ..tensor import Tensor
    out = Tensor.empty(shape, s.device, s.dtype)
    return out, out.buffer_slice()


def _aligned(bounds, isz) -> bool:
    return all(b * isz % 4 == 0 for b in bounds)


def _all_reduce(group, s, shapes, op):
    out, dst = _empty_like(s, shapes[0])
    return out, lambda barrier: staged_collectives.all_reduce(s, barrier, group.rank, op, dst=dst)


def _rows(shape):
    return shape[0], int(np.prod(shape[1:], dtype=np.int64))


def _reduce_scatter(group, s, shapes, op, axis):
    shape = shapes[group.rank]
    rows, per = _rows(shape)
    b = split_bounds(rows, group.world_size)
    parts = [i * per for i in b]
    if not _aligned(parts, s.dtype.itemsize):
        return None
    r = group.rank
    out, dst = _empty_like(s, (b[r + 1] - b[r],) + shape[1:])
    return out, lambda barrier: staged_collectives.reduce_scatter(s, dst, barrier, r, parts, op)


def _all_gather(group, s, shapes, axis):
    shape = shapes[group.rank]
    per = _rows(shape)[1]
    parts = np.concatenate([[0], np.cumsum([sh[0] * per for sh in shapes])]).tolist()
    if not _aligned(parts, s.dtype.itemsize):
        return None
    out, dst = _empty_like(s, (sum(sh[0] for sh in shapes),) + shape[1:])
    return out, lambda barrier: staged_collectives.all_gather(s, dst, barrier, group.rank, parts)


def _broadcast(group, s, shapes, root):
    out, dst = _empty_like(s, shapes[root])
    if group.rank == root:  # the root's result is a device copy of its input
        def work(barrier):
            if s.nbytes:
                s.device.copy(s.buffer, s.offset, dst.buffer, dst.offset, s.nbytes)
            staged_collectives.broadcast(s, barrier, group.rank, root)
        return out, work
    return out, lambda barrier: staged_collectives.broadcast(dst, barrier, group.rank, root)
