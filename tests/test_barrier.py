"""CollectiveBarrier: rounds, reduction, validation, timeouts and abort."""
import random
import threading
import time

import numpy as np
import pytest

from wgrumus.distributed import CollectiveBarrier, CollectiveError


def run_threads(n, fn):
    """Run fn(rank) on n threads; return (results, errors) indexed by rank."""
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            errors[r] = e

    ts = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not any(t.is_alive() for t in ts), "a participant hung"
    return results, errors


@pytest.mark.timeout(20)
@pytest.mark.parametrize("op,expect", [("sum", 6.0), ("mean", 1.5), ("max", 3.0), ("min", 0.0)])
def test_reduce_ops(op, expect):
    b = CollectiveBarrier(4, timeout=5)
    res, errs = run_threads(4, lambda r: b.reduce(np.full((2, 3), r, np.float32), op, rank=r))
    assert errs == [None] * 4
    for out in res:
        assert out.shape == (2, 3) and out.dtype == np.float32
        assert (out == expect).all()
    # one result, shared and read-only: computed once, not copied per rank
    assert all(out is res[0] for out in res)
    assert not res[0].flags.writeable


@pytest.mark.timeout(20)
@pytest.mark.parametrize("ranked", [True, False])
def test_large_chunked_reduction_is_rank_ordered_and_exact(ranked):
    n, size = 3, 1_500_000  # 6 MB: several chunks, reduced in parallel by all participants
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    b = CollectiveBarrier(n, timeout=10, chunk_bytes=1 << 18)
    res, errs = run_threads(n, lambda r: b.reduce(xs[r], "mean", rank=r if ranked else None))
    assert errs == [None] * n
    if ranked:  # rank order: ((x0 + x1) + x2) / 3, bit for bit
        expect = ((xs[0] + xs[1]) + xs[2]) / np.float32(3)
        assert np.array_equal(res[0], expect)
    else:
        np.testing.assert_allclose(res[0], sum(xs) / 3, rtol=1e-5, atol=1e-6)
    assert all(out is res[0] for out in res)


@pytest.mark.timeout(60)
def test_ten_thousand_rounds_with_random_delays_never_mix_rounds():
    n, rounds = 4, 10_000
    b = CollectiveBarrier(n, timeout=20)
    ops = ("sum", "max", "mean")

    def worker(r):
        rng = random.Random(r)
        bad = []
        for i in range(rounds):
            if rng.random() < 0.03:
                time.sleep(rng.random() * 1e-3)
            op = ops[i % 3]
            out = b.reduce(np.array([i, r], dtype=np.float64), op, rank=r)
            expect = {"sum": [n * i, 6], "max": [i, 3], "mean": [i, 1.5]}[op]
            if out.tolist() != expect:
                bad.append((i, out.tolist(), expect))
        return bad

    res, errs = run_threads(n, worker)
    assert errs == [None] * n
    assert res == [[]] * n
    assert b.generation == rounds


@pytest.mark.timeout(20)
def test_fast_participant_reentering_gets_its_own_round():
    # Rank 0 loops as fast as it can while the others are slow to wake up and read.
    b = CollectiveBarrier(3, timeout=5)

    def worker(r):
        outs = []
        for i in range(200):
            if r and i % 7 == 0:
                time.sleep(0.001)
            outs.append(float(b.reduce(np.array([float(i)]), "sum", rank=r)[0]))
        return outs

    res, errs = run_threads(3, worker)
    assert errs == [None] * 3
    assert all(out == [3.0 * i for i in range(200)] for out in res)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("bad", ["shape", "dtype", "op", "kind"])
def test_mismatch_raises_collective_error_everywhere(bad):
    b = CollectiveBarrier(3, timeout=5)

    def worker(r):
        x = np.zeros(4, np.float32)
        if r == 2 and bad == "shape":
            x = np.zeros(5, np.float32)
        if r == 2 and bad == "dtype":
            x = np.zeros(4, np.float64)
        if r == 2 and bad == "kind":
            return b.gather(x, rank=r)
        return b.reduce(x, "max" if (r == 2 and bad == "op") else "sum", rank=r)

    # The two consistent ranks may arrive after the odd one; everyone must raise.
    t0 = time.monotonic()
    _, errs = run_threads(3, worker)
    assert time.monotonic() - t0 < 4
    assert all(isinstance(e, CollectiveError) for e in errs), errs
    with pytest.raises(CollectiveError):  # broken for good
        b.reduce(np.zeros(4, np.float32), rank=0)


@pytest.mark.timeout(20)
def test_missing_rank_is_named_after_timeout():
    b = CollectiveBarrier(4, timeout=0.3)
    t0 = time.monotonic()
    _, errs = run_threads(3, lambda r: b.reduce(np.ones(3), rank=[0, 1, 3][r]))
    elapsed = time.monotonic() - t0
    assert 0.25 < elapsed < 3
    for e in errs:
        assert isinstance(e, CollectiveError)
        assert e.missing == (2,)
        assert "rank(s) 2 did not arrive" in str(e)
    # the late rank fails at once instead of waiting for a round that cannot complete
    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match="rank.s. 2"):
        b.reduce(np.ones(3), rank=2)
    assert time.monotonic() - t0 < 0.1


@pytest.mark.timeout(20)
def test_missing_participant_without_ranks_reports_count():
    b = CollectiveBarrier(3, timeout=0.2)
    _, errs = run_threads(2, lambda r: b.reduce(np.ones(3)))
    assert all(isinstance(e, CollectiveError) and "1 of 3 participants" in str(e) for e in errs)


@pytest.mark.timeout(20)
def test_abort_wakes_every_waiter():
    b = CollectiveBarrier(4, timeout=30)
    boom = RuntimeError("device lost")
    threading.Timer(0.1, b.abort, args=(boom,)).start()
    t0 = time.monotonic()
    _, errs = run_threads(3, lambda r: b.reduce(np.ones(3), rank=r))
    assert time.monotonic() - t0 < 5
    for e in errs:
        assert isinstance(e, CollectiveError) and "device lost" in str(e)
        assert e.__cause__ is boom or e.__cause__.__cause__ is boom


@pytest.mark.timeout(20)
def test_mark_gone_fails_waiters_immediately():
    b = CollectiveBarrier(3, timeout=30)
    threading.Timer(0.1, b.mark_gone, args=(1,)).start()
    t0 = time.monotonic()
    _, errs = run_threads(2, lambda r: b.wait(rank=[0, 2][r]))
    assert time.monotonic() - t0 < 5
    assert all(isinstance(e, CollectiveError) and e.missing == (1,) for e in errs)


@pytest.mark.timeout(20)
def test_gather_wait_and_single_participant():
    b = CollectiveBarrier(3, timeout=5)
    res, errs = run_threads(3, lambda r: (b.gather({"r": r}, rank=r), b.wait(rank=r)))
    assert errs == [None] * 3
    assert all(g == [{"r": 0}, {"r": 1}, {"r": 2}] for g, _ in res)
    assert len({gen for _, gen in res}) == 1

    solo = CollectiveBarrier(1)
    x = np.arange(4, dtype=np.float32)
    out = solo.reduce(x, "mean")
    assert np.array_equal(out, x) and out is not x


def test_argument_errors():
    b = CollectiveBarrier(2, timeout=1)
    with pytest.raises(TypeError, match="floating"):
        b.reduce(np.ones(3, np.int32), "mean", rank=0)
    with pytest.raises(ValueError, match="unknown reduce op"):
        b.reduce(np.ones(3), "prod", rank=0)
    with pytest.raises(ValueError, match="rank"):
        b.reduce(np.ones(3), rank=2)
    with pytest.raises(ValueError):
        CollectiveBarrier(0)
    assert not b.broken  # argument errors do not break the barrier


@pytest.mark.timeout(20)
@pytest.mark.parametrize("size", [5, 400_000])  # one chunk under the lock / parallel chunks
def test_out_gives_private_results_and_allows_in_place(size):
    n = 3
    b = CollectiveBarrier(n, timeout=5, chunk_bytes=1 << 16)
    xs = [np.full(size, r + 1, np.float32) for r in range(n)]

    def worker(r):
        if r == 0:
            return b.reduce(xs[r], "sum", rank=r)  # no out: the shared read-only result
        if r == 1:
            return b.reduce(xs[r], "sum", rank=r, out=xs[r])  # in place
        out = np.empty(size, np.float32)
        return b.reduce(xs[r], "sum", rank=r, out=out)

    res, errs = run_threads(n, worker)
    assert errs == [None] * n
    assert all((o == 6).all() for o in res)
    assert res[1] is xs[1] and res[2].flags.writeable and not res[0].flags.writeable
    assert (xs[0] == 1).all() and (xs[2] == 3).all()  # other inputs untouched

    # everyone in place: no shared array at all
    ys = [np.full(size, r, np.float64) for r in range(n)]
    res, errs = run_threads(n, lambda r: b.reduce(ys[r], "mean", rank=r, out=ys[r]))
    assert errs == [None] * n and all(o is y and (y == 1).all() for o, y in zip(res, ys))
    with pytest.raises(ValueError, match="out must be"):
        b.reduce(ys[0], rank=0, out=np.empty(size, np.float32))


@pytest.mark.timeout(20)
def test_helper_threads_join_large_reductions():
    n, size = 2, 1_000_000
    xs = [np.random.default_rng(r).standard_normal(size) for r in range(n)]
    b = CollectiveBarrier(n, timeout=5, chunk_bytes=1 << 16, helpers=3)
    assert b.helpers == 3
    for _ in range(3):
        res, errs = run_threads(n, lambda r: b.reduce(xs[r], "sum", rank=r))
        assert errs == [None] * n
        assert np.array_equal(res[0], xs[0] + xs[1])


@pytest.mark.timeout(20)
def test_every_rank_gets_its_own_output_in_place_and_rank_ordered():
    n, size = 3, 700_000  # several chunks
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    expect = (xs[0] + xs[1]) + xs[2]
    bufs = [x.copy() for x in xs]
    b = CollectiveBarrier(n, timeout=10, chunk_bytes=1 << 18)
    res, errs = run_threads(n, lambda r: b.reduce(bufs[r], "sum", rank=r, out=bufs[r]))
    assert errs == [None] * n
    for r in range(n):
        assert res[r] is bufs[r] and np.array_equal(bufs[r], expect)


@pytest.mark.timeout(30)
def test_no_thread_writes_an_output_after_its_owner_has_raised(monkeypatch):
    """An output may be mapped staging memory that its owner frees once reduce() raised: an
    abort mid-reduction must not leave helper threads writing into it afterwards."""
    import wgrumus.distributed.host_reduce as host_reduce
    real = host_reduce.reduce_into

    def slow_reduce(out, inputs, op, divisor):
        time.sleep(0.05)
        real(out, inputs, op, divisor)
    monkeypatch.setattr(host_reduce, "reduce_into", slow_reduce)
    n, size = 2, 1 << 20
    outs = [np.zeros(size, np.float32) for _ in range(n)]
    b = CollectiveBarrier(n, timeout=10, chunk_bytes=1 << 16, helpers=4)  # 64 slow chunks
    threading.Timer(0.12, lambda: b.abort(RuntimeError("injected"))).start()
    _, errs = run_threads(n, lambda r: b.reduce(np.ones(size, np.float32), "sum", rank=r,
                                                out=outs[r]))
    assert all(isinstance(e, CollectiveError) for e in errs)
    snapshot = [o.copy() for o in outs]
    assert 0 < snapshot[0].sum() < 2 * size  # it did stop mid-way
    time.sleep(0.3)  # several chunk times
    assert all(np.array_equal(o, s) for o, s in zip(outs, snapshot))


def _helper_threads():
    return {t for t in threading.enumerate() if t.name.startswith("wgrumus-reduce")}


@pytest.mark.timeout(90)
def test_helper_threads_are_the_barriers_own_and_end_with_it(monkeypatch):
    """Helpers reduce chunks of large rounds; they are daemon threads of their barrier that end
    when it is closed, broken or dropped: none is left after many barriers came and went."""
    import gc

    import wgrumus.distributed.host_reduce as host_reduce
    monkeypatch.setattr(host_reduce, "HELPER_BYTES", 1 << 16)  # 1 MiB rounds take 3 helpers
    real = host_reduce.reduce_into
    names = set()

    def slow_reduce(out, inputs, op, divisor):
        names.add(threading.current_thread().name)
        time.sleep(0.002)  # every thread gets chunks, even on a loaded machine
        real(out, inputs, op, divisor)
    monkeypatch.setattr(host_reduce, "reduce_into", slow_reduce)
    before = _helper_threads()
    xs = [np.full(1 << 18, r + 1, np.float32) for r in range(2)]
    for i in range(30):
        b = CollectiveBarrier(2, timeout=10, chunk_bytes=1 << 16, helpers=3)
        outs = [np.empty_like(x) for x in xs]
        for _ in range(3):
            _, errs = run_threads(2, lambda r, b=b, outs=outs: b.exchange(
                xs[r].size, np.float32, r, xs[r], 0, outs[r], 0, "sum"))
            assert errs == [None, None] and all((o == 3).all() for o in outs)
        mine = _helper_threads() - before
        assert mine and all(t.daemon for t in mine)
        if i % 3 == 0:
            b.close()
            assert not any(t.is_alive() for t in mine)  # close() joins them
        elif i % 3 == 1:
            b.abort(RuntimeError("injected"))
        else:
            del b
            gc.collect()
    assert any(n.startswith("wgrumus-reduce") for n in names)
    deadline = time.monotonic() + 10
    while _helper_threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _helper_threads() - before


@pytest.mark.timeout(30)
def test_idle_helpers_end_and_rounds_go_on(monkeypatch):
    import wgrumus.distributed.host_reduce as host_reduce
    monkeypatch.setattr(host_reduce, "HELPER_BYTES", 1 << 16)
    monkeypatch.setattr(host_reduce, "HELPER_IDLE_S", 0.05)
    before = _helper_threads()
    xs = [np.arange(1 << 18, dtype=np.float32) * (r + 1) for r in range(2)]
    b = CollectiveBarrier(2, timeout=10, chunk_bytes=1 << 16, helpers=2)
    for _ in range(3):
        res, errs = run_threads(2, lambda r: b.reduce(xs[r], "sum", rank=r))
        assert errs == [None, None] and np.array_equal(res[0], xs[0] * 3)
        deadline = time.monotonic() + 5
        while _helper_threads() - before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _helper_threads() - before  # idle past HELPER_IDLE_S: ended
    b.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spin", [0.0, 200e-6])
def test_mixed_rounds_with_helpers_polling_and_random_delays_are_exact(monkeypatch, spin):
    """Rounds of 4 B .. 2 MiB (small ones reduced by the last arrival, large ones split over
    participants and helpers), ranks pausing at random, with and without polling before
    blocking: every result exact and in rank order; then an abort mid-run stops everyone."""
    import wgrumus.distributed.barrier as barrier_mod
    import wgrumus.distributed.host_reduce as host_reduce
    monkeypatch.setattr(barrier_mod, "SPIN_S", spin)
    monkeypatch.setattr(host_reduce, "HELPER_BYTES", 1 << 18)
    n, rounds = 3, 400
    rng = np.random.default_rng(5)
    sizes = rng.choice([1, 1000, 1 << 17, 1 << 19], rounds)
    xs = [rng.integers(-999, 999, 1 << 19).astype(np.float32) for _ in range(n)]
    b = CollectiveBarrier(n, timeout=20, chunk_bytes=1 << 16, helpers=3)

    def worker(r):
        delays = random.Random(r)
        out = np.empty(1 << 19, np.float32)
        for i, size in enumerate(sizes):
            if delays.random() < 0.05:
                time.sleep(delays.random() * 1e-3)
            b.exchange(int(size), np.float32, r, xs[r][:size], 0, out[:size], 0, "sum")
            want = (xs[0][:size] + xs[1][:size]) + xs[2][:size]
            if not np.array_equal(out[:size], want):
                return i
        return None

    res, errs = run_threads(n, worker)
    assert errs == [None] * n and res == [None] * n
    threading.Timer(0.05, lambda: b.abort(RuntimeError("injected"))).start()
    _, errs = run_threads(n, lambda r: [b.exchange(1 << 19, np.float32, r, xs[r], 0, None, 0,
                                                   "sum") for _ in range(100_000)])
    assert all(isinstance(e, CollectiveError) and "injected" in str(e) for e in errs), errs


@pytest.mark.timeout(120)
def test_no_helper_thread_outlives_its_process_group(monkeypatch):
    """Groups made and ended one after another (dist.spawn, host all-reduces large enough to
    take helpers): every group's helpers end with it."""
    import wgrumus.distributed.barrier as barrier_mod
    import wgrumus.distributed.host_reduce as host_reduce
    from wgrumus import distributed as dist
    monkeypatch.setattr(barrier_mod.os, "cpu_count", lambda: 8)  # spare cores: helpers join
    monkeypatch.setattr(host_reduce, "HELPER_BYTES", 1 << 16)
    before = _helper_threads()
    seen = set()

    def fn(g):
        x = np.full(1 << 18, g.rank + 1, np.float32)
        for _ in range(3):
            out = g.all_reduce(x, "sum")
        seen.update(_helper_threads() - before)
        return float(out[0])

    for _ in range(10):
        assert dist.spawn(fn, 2, timeout=30) == [3.0, 3.0]
    assert seen  # helpers did run
    assert not _helper_threads() - before  # spawn closes its world and so its barriers
