"""The host step of the processes backend's all-reduce: reduce_into (tiled, float16 reduced in
float32 and rounded once, out only written) and the shared-slot round in both of its forms (each
rank reducing every slot into its output, or a slice each into rank 0's slot)."""
import time

import numpy as np
import pytest
from test_processes import on_one_segment

from wgrumus.distributed import CollectiveError
from wgrumus.distributed.host_reduce import REDUCE_TILE, reduce_into
from wgrumus.distributed.transport import shm_rounds

UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


def reference(inputs, op, divisor, dtype):
    """Left to right in float32 for float16 (in the dtype otherwise), rounded once."""
    wide = np.float32 if dtype == np.float16 else dtype
    r = inputs[0].astype(wide)
    for a in inputs[1:]:
        r = UFUNCS[op](r, a.astype(wide))
    if op == "mean" and divisor != 1:
        r = r / wide(divisor)
    return r.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_reduce_into_matches_reference(dtype, op, k):
    if op == "mean" and dtype == np.int32:
        pytest.skip("mean of integers is refused by check_op")
    rng = np.random.default_rng(k)
    for n in (0, 7, REDUCE_TILE, 2 * REDUCE_TILE + 5):
        ins = [(rng.standard_normal(n) * 100).astype(dtype) for _ in range(k)]
        want = reference(ins, op, k, dtype)
        out = np.full(n, 7, dtype)
        reduce_into(out, ins, op, k)
        np.testing.assert_array_equal(out, want)
        alias = [a.copy() for a in ins]  # out is the first input (a rank's slot)
        reduce_into(alias[0], alias, op, k)
        np.testing.assert_array_equal(alias[0], want)


def test_float16_is_summed_in_float32_and_rounded_once():
    # in float16 2048 + 1 rounds back to 2048 (twice); in float32 the sum is 2050, exact in f16
    ins = [np.full(3, v, np.float16) for v in (2048, 1, 1)]
    out = np.empty(3, np.float16)
    reduce_into(out, ins, "sum", 3)
    np.testing.assert_array_equal(out, np.full(3, 2050, np.float16))
    reduce_into(out, ins, "mean", 3)
    np.testing.assert_array_equal(out, np.full(3, np.float32(2050) / 3, np.float16))


def test_reduce_into_multi_dimensional_out():
    ins = [np.arange(12, dtype=np.float16).reshape(3, 4) + i for i in range(3)]
    out = np.empty((3, 4), np.float16)
    reduce_into(out, ins, "mean", 3)
    np.testing.assert_array_equal(out, reference([a.reshape(-1) for a in ins], "mean", 3,
                                                 np.float16).reshape(3, 4))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,direct", [(2, 2), (2, 0), (3, 3), (3, 2)])
def test_slot_all_reduce_both_forms(monkeypatch, world, direct):
    """Host all-reduce over 4 KB slots (many rounds a call) equals the reference for f32 mean,
    f16 sum (rounded once) and int32 max, whichever form the round takes."""
    monkeypatch.setattr(shm_rounds, "DIRECT_RANKS", direct)
    n = 3000  # 12 KB of float32: 3 rounds and a partial one
    rng = np.random.default_rng(0)
    data = {dt: [(rng.standard_normal(n) * 300).astype(dt) for _ in range(world)]
            for dt in (np.float32, np.float16, np.int32)}
    data[np.float16][0][:5] = 2048  # where float16 adds would round every step
    for r in range(1, world):
        data[np.float16][r][:5] = 1

    def fn(g):
        return [g.all_reduce(data[np.float32][g.rank], "mean"),
                g.all_reduce(data[np.float16][g.rank], "sum"),
                g.all_reduce(data[np.int32][g.rank], "max")]
    results, errors = on_one_segment(world, fn)
    assert errors == [None] * world
    want = [reference(data[np.float32], "mean", world, np.float32),
            reference(data[np.float16], "sum", world, np.float16),
            reference(data[np.int32], "max", world, np.int32)]
    for got in results:
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    if world == 3:
        assert float(results[0][1][0]) == 2050.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,direct", [(2, 2), (3, 0)])
def test_slot_all_reduce_split_over_copy_threads(monkeypatch, world, direct):
    """Pieces from PAR_MIN are copied and reduced by several threads (lowered here so small
    slots take that path): the same sums as on one thread."""
    monkeypatch.setattr(shm_rounds, "DIRECT_RANKS", direct)
    monkeypatch.setattr(shm_rounds, "PAR_MIN", 1024)
    monkeypatch.setattr(shm_rounds, "PIECE_MIN", 64)
    n = 5000
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
    results, errors = on_one_segment(world, lambda g: g.all_reduce(xs[g.rank], "sum"),
                                     slot=16384)
    assert errors == [None] * world
    want = reference(xs, "sum", world, np.float32)
    for got in results:
        np.testing.assert_array_equal(got, want)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("direct", [0, 2])
def test_slot_all_reduce_peer_failure_is_an_error(monkeypatch, direct):
    """A rank that fails between rounds, or never comes, is an error on the other rank (the
    abort word at once, the deadline at worst), whichever form the round takes."""
    monkeypatch.setattr(shm_rounds, "DIRECT_RANKS", direct)
    x = np.ones(3000, np.float32)

    def fails(g):
        g.all_reduce(x, "sum")
        if g.rank == 1:
            raise RuntimeError("boom")
        return g.all_reduce(x, "sum")
    t0 = time.monotonic()
    _, errs = on_one_segment(2, fails, timeout=30.0)
    assert time.monotonic() - t0 < 10  # the abort word, not the timeout
    assert isinstance(errs[0], CollectiveError) and "RuntimeError: boom" in str(errs[0])

    def absent(g):
        return None if g.rank == 1 else g.all_reduce(x, "sum")
    _, errs = on_one_segment(2, absent, timeout=1.0)
    assert isinstance(errs[0], CollectiveError) and errs[0].timed_out, errs


@pytest.mark.timeout(300)
def test_collectives_benchmark_shm_host_table():
    """benchmarks/collectives.py --backend shm-host times both dtypes in both round forms (and
    checks the sums itself)."""
    import json
    import sys

    from _util import ROOT, run_process
    p = run_process([sys.executable, ROOT / "benchmarks" / "collectives.py", "--backend",
                     "shm-host", "--ranks", "2", "--sizes", "65536", "--direct", "0,2",
                     "--no-reference", "--json"], 280, WGRUMUS_DEVICES="2")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["direct"], r["dtype"]) for r in rows) == [
        (0, "float16"), (0, "float32"), (2, "float16"), (2, "float32")]
    for r in rows:
        assert r["seconds"] > 0 and r["round_s"] > 0 and r["split"]["copy"] > 0
