"""Runs under ``mpiexec -n N python tests/_mpi_worker.py SCENARIO [ARGS]`` for tests/test_mpi.py.

Every rank prints ``OK <rank>`` when its checks pass, or ``COLLECTIVE_ERROR <rank> <seconds>
<message>`` when a collective failed in a fault scenario.
"""
import hashlib
import os
import sys
import time

import numpy as np

from wgrumus import distributed as dist
from wgrumus.distributed import CollectiveError, ProcessGroupManager, ThreeDParallelismConfig
from wgrumus.distributed.transport import node_shm

node_shm.CHUNK = 1 << 20  # small shared windows (a container's /dev/shm), many chunks

STRATEGIES = ["ring", "tree", "tree:3", "centralized", "native"]


def data(rank, shape, dtype=np.float32):
    rng = np.random.default_rng(rank)
    return rng.standard_normal(shape).astype(dtype)


def check_same_everywhere(g, arr, what):
    digest = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
    digests = g.all_gather_object(digest)
    assert len(set(digests)) == 1, f"{what}: ranks disagree bitwise"


def collectives(g):
    n, r = g.world_size, g.rank
    xs = [data(q, (37, 3)) for q in range(n)]  # 111 elements: uneven chunks
    for s in STRATEGIES:
        for op in ("sum", "mean", "max"):
            got = g.all_reduce(xs[r], op, strategy=s)
            ref = {"sum": np.sum, "mean": np.mean, "max": np.max}[op](
                np.stack(xs).astype(np.float64), axis=0)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"{s} {op}")
            check_same_everywhere(g, got, f"all_reduce {s} {op}")
    big = data(r, (1 << 20,))  # 4 MB: MPI rendezvous protocol, polled to completion
    for s in ("ring", "native"):
        got = g.all_reduce(big, "sum", strategy=s)
        check_same_everywhere(g, got, f"big {s}")
    for s in ("direct", "tree", "native"):
        red = g.reduce(xs[r], root=n - 1, strategy=s)
        assert (red is not None) == (r == n - 1)
        bc = g.broadcast(xs[1] if r == 1 else None, root=1, strategy=s)
        assert np.array_equal(bc, xs[1])
    for s in ("ring", "native"):
        ag = g.all_gather(np.full((r + 1, 2), r, np.int64), strategy=s)
        assert ag[:, 0].tolist() == [q for q in range(n) for _ in range(q + 1)]
        rs = g.reduce_scatter(np.ones((2 * n + 1, 2), np.float64), strategy=s)
        assert rs.shape[0] == len(np.array_split(np.arange(2 * n + 1), n)[r]) and (rs == n).all()
    if n > 1:
        if r == 0:
            g.send(np.arange(5, dtype=np.int16), 1, tag=4)
        if r == 1:
            got = g.recv(0, tag=4)
            assert got.dtype == np.int16 and got.tolist() == list(range(5))
    g.barrier()
    assert g.stats()["by_op"]["all_reduce"]["calls"] == 3 * len(STRATEGIES) + 2


def groups(g):
    cfg = ThreeDParallelismConfig(dp=1, tp=2, pp=2)
    pgm = ProcessGroupManager(cfg, g)
    m = pgm.mapping
    assert pgm.tp_group.ranks == tuple(m.tp_group_ranks())
    assert pgm.tp_group.world_size == 2 and pgm.pp_group.world_size == 2
    got = pgm.all_reduce_tp(np.array([float(g.rank)]))
    assert got[0] == sum(m.tp_group_ranks())
    assert pgm.all_gather_tp(np.array([g.rank])).tolist() == m.tp_group_ranks()
    if m.is_first_stage:
        pgm.send_to_next_stage(np.full(4, g.rank, np.float32))
        grad = pgm.recv_from_next_stage()
        assert grad.tolist() == [g.rank + 100.0] * 4
    else:
        act = pgm.recv_from_prev_stage()
        pgm.send_to_prev_stage(act + 100)


PRIMS = {
    "all_reduce_ring": lambda g: g.all_reduce(np.ones(1000, np.float32), strategy="ring"),
    "all_reduce_native": lambda g: g.all_reduce(np.ones(1000, np.float32), strategy="native"),
    "all_gather": lambda g: g.all_gather(np.ones(10)),
    "reduce_scatter_native": lambda g: g.reduce_scatter(np.ones(12), strategy="native"),
    "barrier": lambda g: g.barrier(),
    "recv": lambda g: g.recv((g.rank + 1) % g.world_size),
    "all_reduce_async": lambda g: g.all_reduce_async(np.ones(1000, np.float32)).wait(),
    "all_reduce_shared": lambda g: g.all_reduce(np.ones(5 << 20, np.float32), strategy="native"),
    "all_reduce_shared_device": lambda g: g.all_reduce(_device_ones(5 << 20)),
}


def _device_ones(n):
    import wgrumus as wr
    return wr.tensor(np.ones(n, np.float32))


def shared(g):
    """Native all-reduces from 256 KiB go through the node's shared window (all ranks of these
    tests run on one host), in 1 MiB chunks: results against numpy, the same bits everywhere."""
    n, r = g.world_size, g.rank
    cases = [(((3 << 20) + 7,), np.float32), ((70_001, 3), np.float64),
             (((3 << 20) + 3,), np.int32)]
    for shape, dtype in cases:
        xs = [(data(q, shape) * 100 + (1 << 24 if dtype == np.int32 else 0)).astype(dtype)
              for q in range(n)]
        ops = ("sum", "max", "min") + (("mean",) if dtype != np.int32 else ())
        for op in ops:
            got = g.all_reduce(xs[r], op, strategy="native")
            assert got.shape == shape and got.dtype == dtype
            wide = np.stack(xs).astype(np.int64 if dtype == np.int32 else np.float64)
            ref = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op](wide, 0)
            if dtype == np.int32:
                assert np.array_equal(got, ref), op  # values past 2^24: exact
            else:
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4, err_msg=op)
            check_same_everywhere(g, got, f"shared {dtype.__name__} {op}")
    assert isinstance(g._t._node_ar, node_shm.NodeAllReduce)
    import wgrumus as wr  # device tensors: pipelined staging with the window as host step
    dev = wr.devices()[r % len(wr.devices())]
    x = data(r, ((2 << 20) + 5,))
    for op in ("sum", "mean", "max"):
        t = wr.tensor(x, device=dev)
        got = g.all_reduce(t, op)
        assert got.device is dev and got.shape == x.shape
        assert np.array_equal(got.numpy(), g.all_reduce(x, op)), op  # the host path's bits
        check_same_everywhere(g, got.numpy(), f"shared device {op}")
        assert np.array_equal(t.numpy(), x)  # the input is left alone
    got = g.all_reduce_async(wr.tensor(x, device=dev), "sum").wait()
    np.testing.assert_allclose(got.numpy(), sum(data(q, x.shape) for q in range(n)), rtol=1e-5)
    if "shader-f16" in dev.features:  # float16: gathered through the window, summed on device
        from wgrumus.distributed import staged_collectives as sc
        added, add = [], sc._DeviceSum.add
        sc._DeviceSum.add = lambda self, c: (added.append(c), add(self, c))
        h = x[:(2 << 20) + 4].astype(np.float16)
        got = g.all_reduce(wr.tensor(h, device=dev), "sum").numpy()
        assert added, "the float16 all-reduce did not sum on the device"
        wide = sum(data(q, x.shape)[:h.size].astype(np.float16).astype(np.float32)
                   for q in range(n))
        np.testing.assert_allclose(got.astype(np.float32), wide.astype(np.float16), rtol=1e-3)
        check_same_everywhere(g, got, "shared device float16")


def async_collectives(g):
    """all_reduce_async on the group's background thread: several in flight, device tensors
    and arrays, the same bits as the blocking all_reduce."""
    import wgrumus as wr
    dev = wr.devices()[g.rank % len(wr.devices())]
    xs = [data(g.rank, (n,)) for n in (7, 1 << 16)]
    works = [g.all_reduce_async(wr.tensor(x, device=dev), "mean") for x in xs]
    works.append(g.all_reduce_async(xs[0], "sum"))
    got = [w.wait(20) for w in works]
    assert got[0].device is dev and isinstance(got[2], np.ndarray)
    for i, x in enumerate(xs):
        assert np.array_equal(got[i].numpy(), g.all_reduce(x, "mean"))
        check_same_everywhere(g, got[i].numpy(), f"async {i}")
    assert np.array_equal(got[2], g.all_reduce(xs[0], "sum"))


def zero_d(g):
    """0-d arrays keep their shape in every strategy (issue 15, item 6)."""
    for s in STRATEGIES + ["auto"]:
        got = g.all_reduce(np.float32(g.rank + 1), strategy=s)
        assert got.shape == () and got == sum(range(1, g.world_size + 1)), (s, got)
    for s in ("direct", "tree", "native", "auto"):
        red = g.reduce(np.float64(2), root=0, strategy=s)
        assert red is None if g.rank else (red.shape == () and red == 2 * g.world_size), (s, red)
        bc = g.broadcast(np.int32(7) if g.rank == 0 else None, root=0, strategy=s)
        assert bc.shape == () and bc == 7, (s, bc)


MISMATCHES = {  # a collective in which rank 1 differs from the others
    "op": lambda g, s: g.all_reduce(np.ones(4, np.float32), "max" if g.rank == 1 else "sum",
                                    strategy=s),
    "reduce_root": lambda g, s: g.reduce(np.ones(3), root=int(g.rank == 1), strategy=s),
    "broadcast_root": lambda g, s: g.broadcast(np.ones(3), root=int(g.rank == 1), strategy=s),
    "collective": lambda g, s: (g.barrier() if g.rank == 1
                                else g.all_reduce(np.ones(2), strategy=s)),
}


def mismatch(g, case, strategy):
    t0 = time.monotonic()
    try:
        MISMATCHES[case](g, strategy)
    except CollectiveError as e:
        msg = str(e).replace("\n", " ")
        say(f"COLLECTIVE_ERROR {g.rank} {time.monotonic() - t0:.3f} {msg}")
        return
    say(f"RETURNED {g.rank}")


def fault(g, kind, prim, timeout):
    bad = 1
    if g.rank == bad:
        if kind == "raise":
            raise RuntimeError("injected failure")  # the excepthook tells the others
        if kind == "exit":
            sys.exit(0)
        if kind == "hard_exit":
            os._exit(3)
        if kind == "late":
            time.sleep(2 * timeout)
        if kind == "mid_chunk":  # its first chunk goes through, then it is gone
            from wgrumus.distributed.transport.node_shm import NodeAllReduce
            first = NodeAllReduce._chunk

            def chunk(self, *a):
                if self.chunks:
                    sys.exit(0)
                first(self, *a)
            NodeAllReduce._chunk = chunk
    if prim.endswith("_device"):
        _device_ones(1)  # the devices are made before the clock starts
    t0 = time.monotonic()
    try:
        PRIMS[prim](g)
    except CollectiveError as e:
        msg = str(e).replace("\n", " ")
        say(f"COLLECTIVE_ERROR {g.rank} {time.monotonic() - t0:.3f} {msg}")
        return
    say(f"RETURNED {g.rank}")


def say(line):
    sys.stdout.write(line + "\n")  # one write per line: ranks share mpiexec's stdout
    sys.stdout.flush()


def main():
    scenario = sys.argv[1]
    timeout = float(os.environ.get("WGRUMUS_TEST_TIMEOUT", "10"))
    if scenario == "shared_refused" and os.environ.get("PMI_RANK") == "1":
        os.environ["WGRUMUS_MPI_SHARED"] = "0"  # one rank says no: none may use the window
    if scenario in ("pinned", "pinned3d"):  # three adapters, no device count: a rank opens one
        os.environ.pop("WGRUMUS_DEVICES", None)
        from wgrumus.runtime import context
        fake = context.Selection([context.select_adapters()[0] for _ in range(3)], range(3))
        assert len({id(a) for a in fake}) == 3
        context.select_adapters = lambda spec=None: fake
    if scenario == "pinned3d":  # train_3d picks its devices before any group exists
        import wgrumus as wr
        from wgrumus.distributed.parallel3d import GPTConfig, train_3d
        cfg = GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=8)
        losses = train_3d(cfg, 2, 1, 1, steps=2, batch_size=4, backend="mpi", timeout=timeout)
        assert len(losses) == 2 and all(np.isfinite(losses)), losses
        g = dist.init_process_group("mpi", timeout=timeout)
        assert [d.adapter for d in wr.devices()] == [fake[g._t.local_rank % 3]], wr.devices()
        say(f"OK {g.rank}")
        return
    g = dist.init_process_group("mpi", timeout=timeout)
    assert g.backend == "mpi"
    if scenario == "collectives":
        collectives(g)
    elif scenario == "groups":
        groups(g)
    elif scenario == "spawn":
        res = dist.spawn(lambda grp: grp.rank * 10, g.world_size, backend="mpi",
                         timeout=timeout)
        assert res == [q * 10 for q in range(g.world_size)], res
    elif scenario == "shared":
        shared(g)
    elif scenario == "shared_refused":
        x = data(g.rank, (3 << 20,))
        got = g.all_reduce(x, "sum")
        np.testing.assert_allclose(got, sum(data(q, x.shape) for q in range(g.world_size)),
                                   rtol=1e-5, atol=1e-5)
        assert g._t._node_comm is None and not g._t._node_ar
    elif scenario == "pinned":
        import wgrumus as wr
        local = g._t.local_rank
        assert local == g.rank, (local, g.rank)  # one host
        assert [d.adapter for d in wr.devices()] == [fake[local % 3]], wr.devices()
        assert wr.devices()[0].host_index == wr.devices()[0].adapter_index == local % 3  # (rows)
        x = wr.tensor(np.full(4, g.rank + 1.0, np.float32))
        assert g.all_reduce(x, "sum").numpy().tolist() == [3.0] * 4
        async_collectives(g)
    elif scenario == "zero_d":
        zero_d(g)
    elif scenario == "mismatch":
        mismatch(g, sys.argv[2], sys.argv[3])
        return
    elif scenario == "fault":
        fault(g, sys.argv[2], sys.argv[3], timeout)
        return
    say(f"OK {g.rank}")


if __name__ == "__main__":
    main()
