"""Strategies, config, tree topology, and every collective over the threads backend, including
injected faults (a rank raises, exits, or never arrives)."""
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wgrumus import distributed as dist
from wgrumus.distributed import (
    AllReduceStrategy,
    BroadcastStrategy,
    CollectiveConfig,
    CollectiveError,
    ReduceStrategy,
)
from wgrumus.distributed.collectives import child_ranks, compute_role, parent_rank

STRATEGIES = ["ring", "tree", "tree:3", "centralized", "native"]


def data(rank, shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed * 1000 + rank)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def reference(xs, op):
    acc = np.stack([x.astype(np.float64) for x in xs])
    return {"sum": acc.sum(0), "mean": acc.mean(0), "max": acc.max(0), "min": acc.min(0)}[op]


# ------------------------------------------------------------------------- config and topology
def test_config_validation_rules():
    cfg = CollectiveConfig()
    assert cfg.validate() is cfg
    with pytest.raises(ValueError, match="num_devices"):
        CollectiveConfig(num_devices=0).validate()
    cfg = CollectiveConfig(num_nodes=2)
    with pytest.raises(ValueError, match="global strategies"):
        cfg.validate()
    cfg = cfg.with_(global_all_reduce=AllReduceStrategy.Ring,
                    global_reduce=ReduceStrategy.Tree(2),
                    global_broadcast=BroadcastStrategy.Tree(2))
    cfg.validate()
    with pytest.raises(ValueError, match="tree_arity"):
        CollectiveConfig(tree_arity=1).validate()
    with pytest.raises(ValueError, match="num_nodes"):
        CollectiveConfig(num_nodes=0).validate()
    CollectiveConfig.multi_node(4, 2).validate()
    assert CollectiveConfig.single_node(8).local_all_reduce == AllReduceStrategy.Ring


def test_strategy_selection_follows_pmetal():
    cfg = CollectiveConfig(tree_threshold_bytes=1024, tree_arity=2)
    assert cfg.select_all_reduce(512, 4) == AllReduceStrategy.Tree(2)
    assert cfg.select_all_reduce(2048, 4) == AllReduceStrategy.Ring
    assert cfg.select_all_reduce(2048, 2) == AllReduceStrategy.Tree(2)
    assert CollectiveConfig.single_node(4).select_all_reduce(1, 4) == AllReduceStrategy.Ring


def test_strategy_values():
    assert AllReduceStrategy.parse("tree:4") == AllReduceStrategy.Tree(4)
    assert AllReduceStrategy.parse("ring") is AllReduceStrategy.Ring
    assert repr(AllReduceStrategy.Tree(3)) == "AllReduceStrategy.Tree(3)"
    assert repr(BroadcastStrategy.Direct) == "BroadcastStrategy.Direct"
    assert ReduceStrategy.Tree(2) != AllReduceStrategy.Tree(2)
    with pytest.raises(ValueError):
        AllReduceStrategy.Tree(1)
    with pytest.raises(ValueError, match="unknown"):
        AllReduceStrategy.parse("butterfly")
    assert CollectiveConfig(local_all_reduce="native").local_all_reduce == AllReduceStrategy.Native


def test_tree_roles_seven_nodes():
    assert compute_role(0, 7, 2) == dist.TreeRole("root", 2)
    assert compute_role(1, 7, 2) == dist.TreeRole("internal", 2)
    assert compute_role(3, 7, 2) == dist.TreeRole("leaf", 0)
    assert parent_rank(3, 2) == 1 and parent_rank(1, 2) == 0 and parent_rank(0, 2) is None
    assert child_ranks(0, 7, 2) == [1, 2] and child_ranks(1, 7, 2) == [3, 4]
    assert dist.tree_depth(7, 2) == 2 and dist.tree_depth(1, 2) == 0


@given(st.integers(1, 40), st.integers(2, 5))
def test_tree_topology_is_consistent(world, arity):
    seen = set()
    for r in range(world):
        role, parent, kids = compute_role(r, world, arity), parent_rank(r, arity), \
            child_ranks(r, world, arity)
        assert role.num_children == len(kids)
        assert (role.kind == "root") == (r == 0) and (parent is None) == (r == 0)
        assert role.kind != "internal" or kids
        for c in kids:
            assert r < c < world and parent_rank(c, arity) == r
            seen.add(c)
    assert seen == set(range(1, world))


# ------------------------------------------------------------------------- all-reduce
@pytest.mark.timeout(30)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_all_reduce_matches_numpy_and_is_identical_on_every_rank(world, strategy):
    shape = (7, 3)  # 21 elements: chunks are uneven for every world size here

    def fn(g):
        out = {}
        for op in ("sum", "mean", "max", "min"):
            x = data(g.rank, shape)
            before = x.copy()
            out[op] = g.all_reduce(x, op, strategy=strategy)
            assert np.array_equal(x, before), "input was modified"
        return out

    res = dist.spawn(fn, world, timeout=10)
    for op in ("sum", "mean", "max", "min"):
        want = reference([data(r, shape) for r in range(world)], op)
        for r in range(world):
            got = res[r][op]
            assert got.shape == shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert got.tobytes() == res[0][op].tobytes(), f"rank {r} differs bitwise ({op})"


@pytest.mark.timeout(30)
@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 5), n=st.integers(0, 40), strategy=st.sampled_from(STRATEGIES),
       dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64]))
def test_all_reduce_property(world, n, strategy, dtype):
    res = dist.spawn(lambda g: g.all_reduce(data(g.rank, (n,), dtype), "sum", strategy=strategy),
                     world, timeout=10)
    want = reference([data(r, (n,), dtype) for r in range(world)], "sum")
    for got in res:
        assert got.dtype == dtype and got.shape == (n,)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        assert got.tobytes() == res[0].tobytes()


@pytest.mark.timeout(30)
def test_results_are_private_and_writeable():
    def fn(g):
        outs = [g.all_reduce(np.ones(5, np.float32), strategy=s) for s in STRATEGIES]
        outs.append(g.broadcast(np.ones(5) if g.rank == 0 else None))
        outs.append(g.all_gather(np.ones(2)))
        for o in outs:
            o += g.rank  # would corrupt other ranks if shared
        g.barrier()
        return outs

    res = dist.spawn(fn, 3, timeout=10)
    for r, outs in enumerate(res):
        assert outs[0][0] == 3 + r and outs[-2][0] == 1 + r


@pytest.mark.timeout(30)
def test_hierarchical_multi_node_all_reduce():
    cfg = CollectiveConfig.multi_node(num_devices=2, num_nodes=2)

    def fn(g):
        return g.all_reduce(np.full(4, g.rank + 1, np.float32), "mean"), g.stats()

    res = dist.spawn(fn, 4, timeout=10, config=cfg)
    for out, _ in res:
        assert np.array_equal(out, np.full(4, 2.5, np.float32))


# ------------------------------------------------------------------------- other collectives
@pytest.mark.timeout(30)
@pytest.mark.parametrize("strategy", ["direct", "tree", "tree:3", "native"])
def test_reduce_and_broadcast(strategy):
    world, root = 5, 3

    def fn(g):
        red = g.reduce(data(g.rank, (6,)), root=root, op="sum", strategy=strategy)
        src = data(99, (2, 3), np.float64) if g.rank == root else None
        bc = g.broadcast(src, root=root, strategy=strategy)
        templ = g.broadcast(np.zeros(2, np.int64) + g.rank if g.rank == 1 else
                            np.zeros(2, np.int64), root=1, strategy=strategy)
        return red, bc, templ

    res = dist.spawn(fn, world, timeout=10)
    want = reference([data(r, (6,)) for r in range(world)], "sum")
    for r, (red, bc, templ) in enumerate(res):
        if r == root:
            np.testing.assert_allclose(red, want, rtol=1e-5)
        else:
            assert red is None
        assert np.array_equal(bc, data(99, (2, 3), np.float64)) and bc.dtype == np.float64
        assert templ.tolist() == [1, 1]


@pytest.mark.timeout(30)
def test_broadcast_checks_template_shape():
    def fn(g):
        return g.broadcast(np.zeros(3) if g.rank == 0 else np.zeros(4), root=0)

    with pytest.raises(CollectiveError, match="expected"):
        dist.spawn(fn, 2, timeout=5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("strategy", ["ring", "native"])
def test_all_gather_uneven_and_axis(strategy):
    def fn(g):
        a = g.all_gather(np.full((g.rank + 1, 2), g.rank, np.int32), strategy=strategy)
        b = g.all_gather(np.full((2, g.rank + 1), g.rank, np.float32), axis=1, strategy=strategy)
        c = g.all_gather(np.float32(g.rank), strategy=strategy)  # scalars gather to a vector
        return a, b, c

    res = dist.spawn(fn, 3, timeout=10)
    for a, b, c in res:
        assert a[:, 0].tolist() == [0, 1, 1, 2, 2, 2] and a.shape == (6, 2)
        assert b.shape == (2, 6) and b[0].tolist() == [0, 1, 1, 2, 2, 2]
        assert c.tolist() == [0, 1, 2]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("strategy", ["ring", "native"])
def test_reduce_scatter_array_split_rule_roundtrips_through_all_gather(strategy):
    world, rows = 3, 7  # 7 rows over 3 ranks: 3, 2, 2

    def fn(g):
        x = data(g.rank, (rows, 4), np.float64)
        part = g.reduce_scatter(x, "sum", strategy=strategy)
        mean_t = g.reduce_scatter(x, "mean", axis=1, strategy=strategy)
        return part, g.all_gather(part, strategy=strategy), mean_t

    res = dist.spawn(fn, world, timeout=10)
    full = reference([data(r, (rows, 4), np.float64) for r in range(world)], "sum")
    assert [p.shape[0] for p, _, _ in res] == [3, 2, 2]
    assert [m.shape for _, _, m in res] == [(7, 2), (7, 1), (7, 1)]
    for r, (part, whole, _) in enumerate(res):
        np.testing.assert_allclose(whole, full, rtol=1e-12)
        np.testing.assert_allclose(part, np.array_split(full, world)[r], rtol=1e-12)


@pytest.mark.timeout(30)
def test_send_recv_tags_match_out_of_order_and_p2p_keeps_collectives_aligned():
    def fn(g):
        if g.rank == 0:
            g.send(np.arange(3), 1, tag=7)
            g.send(np.ones((2, 2), np.float16), 1, tag=3)
        got = None
        if g.rank == 1:
            b = g.recv(0, tag=3)
            a = g.recv(0, tag=7)
            got = (a, b)
        total = g.all_reduce(np.array([1.0]))  # tags of collectives unaffected by p2p
        return got, total

    res = dist.spawn(fn, 2, timeout=5)
    a, b = res[1][0]
    assert a.tolist() == [0, 1, 2] and b.dtype == np.float16 and b.shape == (2, 2)
    assert res[0][1][0] == 2.0
    with pytest.raises(ValueError, match="tag"):
        dist.spawn(lambda g: g.send(np.ones(1), 1 - g.rank, tag=-1), 2, timeout=2)


@pytest.mark.timeout(30)
def test_stats_are_measured():
    n = 4
    nbytes = 1000 * 4

    def fn(g):
        g.all_reduce(np.ones(1000, np.float32), strategy="ring")
        g.barrier()
        return g.stats()

    for s in dist.spawn(fn, n, timeout=10):
        assert s["operations"] == 2 and s["by_op"]["all_reduce"]["calls"] == 1
        assert s["by_op"]["all_reduce"]["bytes"] == nbytes
        assert s["seconds"] > 0
        # ring: 2(n-1) messages of 1/n of the data each
        assert s["messages_sent"] == 2 * (n - 1)
        assert s["bytes_sent"] == 2 * (n - 1) * nbytes // n


@pytest.mark.timeout(30)
def test_spawn_results_devices_and_errors():
    assert dist.spawn(lambda g: (g.rank, g.world_size, g.device), 3,
                      devices=["d0", "d1", "d2"]) == [(0, 3, "d0"), (1, 3, "d1"), (2, 3, "d2")]
    with pytest.raises(ValueError, match="devices"):
        dist.spawn(lambda g: None, 3, devices=["d0"])
    with pytest.raises(ValueError, match="backend"):
        dist.spawn(lambda g: None, 2, backend="nccl")
    with pytest.raises(ValueError, match="spawn"):
        dist.init_process_group("threads")


class FakeTensor:
    """Stands in for wgrumus.Tensor in the duck-typed path (numpy() + device)."""

    def __init__(self, arr, device):
        self.arr, self.device = np.asarray(arr, np.float32), device

    def numpy(self):
        return self.arr.copy()


@pytest.mark.timeout(30)
def test_tensor_in_tensor_out(monkeypatch):
    from wgrumus.distributed import interop
    monkeypatch.setattr(interop, "tensor", lambda a, device=None: FakeTensor(a, device))

    def fn(g):
        t = FakeTensor(np.full(4, g.rank + 1.0), f"dev{g.rank}")
        return g.all_reduce(t), g.all_gather(t), g.reduce_scatter(t)

    for r, outs in enumerate(dist.spawn(fn, 2, timeout=5)):
        assert all(isinstance(o, FakeTensor) and o.device == f"dev{r}" for o in outs)
        assert outs[0].arr.tolist() == [3.0] * 4 and outs[1].arr.shape == (8,)


# ------------------------------------------------------------------------- injected faults
PRIMITIVES = {
    "all_reduce_ring": lambda g: g.all_reduce(np.ones(64, np.float32), strategy="ring"),
    "all_reduce_tree": lambda g: g.all_reduce(np.ones(64, np.float32), strategy="tree"),
    "all_reduce_centralized": lambda g: g.all_reduce(np.ones(64), strategy="centralized"),
    "all_reduce_native": lambda g: g.all_reduce(np.ones(64, np.float32), strategy="native"),
    "reduce": lambda g: g.reduce(np.ones(8), root=0),  # spawn's default: native
    "reduce_tree": lambda g: g.reduce(np.ones(8), root=0, strategy="tree"),
    "broadcast": lambda g: g.broadcast(np.ones(8) if g.rank == 0 else None, root=0),
    "broadcast_tree": lambda g: g.broadcast(np.ones(8) if g.rank == 0 else None, root=0,
                                            strategy="tree"),
    "all_gather": lambda g: g.all_gather(np.ones(8)),
    "all_gather_ring": lambda g: g.all_gather(np.ones(8), strategy="ring"),
    "reduce_scatter": lambda g: g.reduce_scatter(np.ones(8)),
    "reduce_scatter_ring": lambda g: g.reduce_scatter(np.ones(8), strategy="ring"),
    "barrier": lambda g: g.barrier(),
    "recv": lambda g: g.recv((g.rank + 1) % g.world_size),
}
TIMEOUT = 0.4
# Rooted operations wait only on the ranks their data passes through (as in MPI): a rank outside
# the faulty rank's path may return, and then its next collective raises.
ROOTED = {"reduce_tree", "broadcast_tree"}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", ["raise", "exit", "never_arrives"])
@pytest.mark.parametrize("prim", list(PRIMITIVES))
def test_faulty_rank_makes_every_other_rank_raise(prim, fault):
    world, bad = 4, 2
    seen: dict = {}
    lock = threading.Lock()
    all_others_done = threading.Event()

    def fn(g):
        if g.rank == bad:
            if fault == "raise":
                raise KeyError("injected")
            if fault == "never_arrives":
                all_others_done.wait(10)  # stuck in user code until the others gave up
            return "left"
        t0 = time.monotonic()
        try:
            PRIMITIVES[prim](g)
            outcome = "returned"
            if prim in ROOTED:
                g.barrier()
        except CollectiveError as e:
            outcome = e
        with lock:
            seen[g.rank] = (outcome, time.monotonic() - t0)
            if len(seen) == world - 1:
                all_others_done.set()
        if isinstance(outcome, CollectiveError):
            raise outcome

    with pytest.raises((CollectiveError, KeyError)) as info:
        dist.spawn(fn, world, timeout=TIMEOUT)
    if fault == "raise":
        assert info.type is KeyError  # the root cause is re-raised, not a consequence
    assert sorted(seen) == [r for r in range(world) if r != bad]
    for rank, (outcome, elapsed) in seen.items():
        assert isinstance(outcome, CollectiveError), (rank, outcome)
        assert elapsed < TIMEOUT + 1.0
        if fault != "never_arrives":
            assert elapsed < TIMEOUT  # failure is known at once, not discovered by timeout


@pytest.mark.timeout(30)
def test_group_is_broken_after_a_failure():
    def fn(g):
        if g.rank == 1:
            return None
        with pytest.raises(CollectiveError):
            g.all_reduce(np.ones(4))
        t0 = time.monotonic()
        with pytest.raises(CollectiveError, match="broken"):
            g.barrier()
        assert time.monotonic() - t0 < 0.1
        return "ok"

    assert dist.spawn(fn, 2, timeout=1)[0] == "ok"


@pytest.mark.timeout(30)
def test_spawn_abandons_rank_stuck_outside_collectives():
    release = threading.Event()

    def fn(g):
        if g.rank == 0:
            raise RuntimeError("first")
        release.wait(5)

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="first") as info:
        dist.spawn(fn, 2, timeout=0.3)
    release.set()
    assert time.monotonic() - t0 < 3
    assert any("still running" in n for n in getattr(info.value, "__notes__", []))
