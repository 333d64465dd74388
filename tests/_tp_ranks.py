"""Rank functions of tests/test_tp_overlap.py (importable by processes the launcher starts)."""
import time

import numpy as np

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus.distributed import CollectiveError
from wgrumus.runtime.tuning import TUNING

X = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)


def mlp(g, chunks: int = 1, overlap: bool = True):
    """Column (fc1) -> GELU -> row (fc2) forward and backward: (output, d input, d fc1.weight
    shard, d fc2.weight shard), under ``TUNING.tp_chunks = chunks`` and ``tp_overlap``."""
    TUNING.tp_chunks, TUNING.tp_overlap = chunks, overlap
    col = dist.ColumnParallelLinear(4, 8, g, seed=1)
    row = dist.RowParallelLinear(8, 4, g, seed=2)
    x = wr.tensor(X, device=g.device, requires_grad=True)
    y = row(col(x, "gelu"))
    (y * y).sum().backward()
    return y.numpy(), x.grad.numpy(), col.weight.grad.numpy(), row.weight.grad.numpy()


def fails_in_async_all_reduce(g, fault: str = "raise"):
    """Rank 1 fails inside its column-parallel backward's asynchronous all-reduce, after the
    forward went through: ``raise`` an exception there, or ``stall`` past the timeout. Every
    rank returns (the CollectiveError's text, seconds from the backward's start to it)."""
    col = dist.ColumnParallelLinear(4, 8, g, seed=1)
    row = dist.RowParallelLinear(8, 4, g, seed=2)
    x = wr.tensor(X, device=g.device, requires_grad=True)
    (row(col(x, "gelu")) ** 2).sum().backward()  # kernels compiled outside the timed window
    y = row(col(x, "gelu"))
    if g.rank == 1:
        _inject(g, fault)
    t0 = time.monotonic()
    try:
        (y * y).sum().backward()
    except CollectiveError as e:
        return str(e), time.monotonic() - t0
    return "no error", time.monotonic() - t0


def _inject(g, fault: str) -> None:
    """Make this rank's next device all-reduce fail mid-way: the thread backend's CommThread
    step, or the processes backend's first shared-memory round (the download is issued)."""
    def fail(*args, **kw):
        if fault == "stall":
            time.sleep(g.timeout + 2)
        raise RuntimeError(f"injected failure in rank {g.rank}'s all-reduce")
    world = getattr(g._t, "world", None)
    if world is not None:
        world.comm_thread(g.rank, g.device)._all_reduce = fail
    else:
        g._t.reduce_chunk = fail
