"""Rank functions for tests/test_processes.py (importable by the spawned ranks)."""
import os
import signal
import time

import numpy as np

import wgrumus as wr


def collectives(g):
    """Every collective and send/recv pattern; the results compared with the threads backend."""
    r, n = g.rank, g.world_size
    rng = np.random.default_rng(r)
    out = {}
    x = rng.standard_normal((5, 3)).astype(np.float32)
    for op in ("sum", "mean", "max", "min"):
        out[f"all_reduce_{op}"] = g.all_reduce(x, op)
    big = rng.standard_normal(700_001).astype(np.float32)  # several slots in the tests' layout
    out["all_reduce_big"] = g.all_reduce(big, "sum")
    out["all_reduce_int"] = g.all_reduce(np.arange(7, dtype=np.int64) * (r + 1), "sum")
    out["reduce"] = g.reduce(x, root=n - 1, op="sum")
    out["broadcast"] = g.broadcast(x if r == 1 else None, root=1)
    out["all_gather"] = g.all_gather(np.full((r + 1, 2), r, np.float32))
    out["reduce_scatter"] = g.reduce_scatter(np.arange(4 * n, dtype=np.float32) + r, "sum")
    out["gather_native"] = g.all_gather(np.full((r + 2,), r, np.int32), strategy="native")
    out["scatter_native"] = g.reduce_scatter(np.ones((n + 1, 2)) * r, "sum", strategy="native")
    out["ring"] = g.all_reduce(x, "sum", strategy="ring")
    # point to point: both directions started before either receives, tags out of order,
    # a message much larger than a ring
    peer = (r + 1) % n
    prev = (r - 1) % n
    works = [g.isend(np.full(3, 10 * r + t, np.float64), peer, tag=t) for t in range(3)]
    works.append(g.isend(np.arange(1_500_000, dtype=np.float32) + r, peer, tag=7))
    out["recv_order"] = [g.recv(prev, tag=t) for t in (2, 0, 1)]
    out["recv_big"] = g.recv(prev, tag=7)
    for w in reversed(works):
        w.wait()
    # asynchronous all-reduces completed out of order
    a = g.all_reduce_async(np.full(4, r + 1.0), "sum")
    b = g.all_reduce_async(np.full(2, 2.0 * r), "max")
    out["async"] = [b.wait(), a.wait()]
    ta = g.all_reduce_async(wr.tensor(np.full(3, r + 1.0, np.float32), device=g.device), "sum")
    tb = g.all_reduce_async(wr.tensor(np.arange(5, dtype=np.float32) * r, device=g.device),
                            "max")
    out["async_device"] = [tb.wait().numpy(), ta.wait().numpy()]
    # device tensors: all-reduce through the staging engine, send/recv onto a device
    t = wr.tensor(x + r, device=g.device)
    out["device_all_reduce"] = g.all_reduce(t, "sum").numpy()
    g.send(t, peer, tag=11)
    out["device_recv"] = g.recv(prev, tag=11, device=g.device).numpy()
    sub = g.new_group([q for q in range(n) if q % 2 == 0])
    if sub is not None:
        out["subgroup"] = sub.all_reduce(np.full(3, r + 1.0), "sum")
        out["subgroup_p2p"] = sub.all_gather(np.array([r]))
    g.barrier()
    return out


def killed_mid_collective(g):
    if g.rank == 1:
        g.all_reduce(np.ones(4), "sum")
        os.kill(os.getpid(), signal.SIGKILL)
    g.all_reduce(np.ones(4), "sum")
    g.all_reduce(np.ones(4), "sum")  # rank 1 never arrives
    return "unreachable"


def hangs(g):
    if g.rank == 1:
        time.sleep(1000)
    g.all_reduce(np.ones(4), "sum")
    return "unreachable"


def raises(g):
    g.barrier()
    if g.rank == 0:
        raise ValueError("bad batch on rank 0")
    g.all_reduce(np.ones(4), "sum")
    return "unreachable"


def device_p2p(g):
    """Device tensors both ways at once, tags out of order, sizes around the chunk and the ring;
    the transfer phases recorded."""
    r, n = g.rank, g.world_size
    peer, prev = (r + 1) % n, (r - 1) % n
    sizes = [1, 1000, (1 << 18) + 3, (3 << 20) // 4 + 5]  # floats: up to 3 MB, odd chunk ends
    sent = [wr.tensor(np.arange(k, dtype=np.float32) + 1000 * r + t, device=g.device)
            for t, k in enumerate(sizes)]
    works = [g.isend(x, peer, tag=t) for t, x in enumerate(sent)]
    works.append(g.isend(wr.tensor(np.arange(6, dtype=np.int32).reshape(2, 3) * r,
                                   device=g.device), peer, tag=9))
    order = [3, 9, 0, 2, 1]
    got = {t: g.recv(prev, tag=t, device=g.device) for t in order}
    for w in works:
        w.wait()
    big = wr.tensor(np.full((5 << 20) // 4, r, np.float32), device=g.device)  # > the ring: queued
    w = g.isend(big, peer, tag=20)
    far = g.recv(prev, tag=20, device=g.device)
    w.wait()
    ph = g._t.phases.snapshot()
    return ({t: (v.numpy(), v.dtype.name if hasattr(v.dtype, "name") else str(v.dtype))
             for t, v in got.items()}, float(far.numpy().sum()), ph)


def dies_mid_transfer(g):
    """Rank 0 dies with most of a large device tensor still to send; rank 1 is receiving it."""
    if g.rank == 0:
        g.isend(wr.tensor(np.ones(6 << 20, np.float32), device=g.device), 1, tag=5)
        time.sleep(0.5)  # rank 1 is reading the first part
        os.kill(os.getpid(), signal.SIGKILL)
    return g.recv(0, tag=5, device=g.device)


def exits_quietly(g):
    if g.rank == 1:
        os._exit(0)
    g.all_reduce(np.ones(4), "sum")
    return "unreachable"


def sends_x_as_at_the_call(g):
    """An all-reduce sends ``x`` as it was when ``all_reduce_async`` returned, though ``x`` is
    then overwritten while the communication thread is still held by an earlier call (rank 1
    comes late to it): the download was issued at the call, in order with the caller's work.
    Returns (first, second) results and how many download buffers stay mapped."""
    from wgrumus.ops.elementwise import fill_
    from wgrumus.runtime.native import MAP_READ
    from wgrumus.runtime.staging import staging_of
    dev = g.device
    if g.rank == 1:
        time.sleep(0.5)
    first = g.all_reduce_async(wr.tensor(np.ones(4, np.float32), device=dev), "sum")
    x = wr.tensor(np.full(1000, g.rank + 1.0, np.float32), device=dev)
    second = g.all_reduce_async(x, "sum")
    fill_(x, 100.0)  # (breaks the call's contract on purpose: the copy must come first)
    dev.flush()
    out = first.wait().numpy(), second.wait().numpy()
    g.barrier()
    return out, staging_of(dev).mapped_buffers(MAP_READ)


def f16_all_reduce(g, spy: bool = True):
    """float16 all-reduces (sum and mean; one of several chunks): (inputs, results, how many
    chunks this process's device summed; None without ``spy``)."""
    from wgrumus.distributed import staged_collectives
    added = [] if spy else None
    if spy:  # (a process of its own)
        add = staged_collectives._DeviceSum.add
        staged_collectives._DeviceSum.add = lambda self, c: (added.append(c), add(self, c))
    rng = np.random.default_rng(g.rank)
    xs = [rng.standard_normal(n).astype(np.float16) for n in (6, 1000, 300_000)]
    got = []
    for x in xs:
        t = wr.tensor(x, device=g.device)
        got.append([g.all_reduce(t, "sum").numpy(), g.all_reduce_async(t, "mean").wait().numpy()])
    return xs, got, None if added is None else len(added)
