"""ProcessGroup.all_reduce_async: device tensors over the thread backend's CommThreads (results
equal to the blocking all_reduce bit for bit, inputs unchanged), arrays on the group's background
thread, and a failing rank making every other rank's wait raise CollectiveError in time."""
import functools
import time

import _process_ranks as ranks
import numpy as np
import pytest
from test_processes import clean_shm  # noqa: F401  (the fixture)

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus.distributed import CollectiveError
from wgrumus.runtime.native import MAP_READ
from wgrumus.runtime.staging import staging_of

pytestmark = pytest.mark.timeout(60)


def data(rank, shape, seed=0):
    return np.random.default_rng(seed * 100 + rank).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_device_tensors_match_blocking_all_reduce(devs, op):
    shapes = [(5,), (300, 7), (1 << 16) + 3]  # the last: more chunks than one round

    def fn(g):
        xs = [wr.tensor(data(g.rank, s, i), device=g.device) for i, s in enumerate(shapes)]
        works = [g.all_reduce_async(x, op) for x in xs]  # all in flight at once
        got = [w.wait(10).numpy() for w in works]
        assert works[0].wait() is works[0].wait()  # waiting again returns the same result
        ref = [g.all_reduce(x, op).numpy() for x in xs]
        unchanged = all(np.array_equal(x.numpy(), data(g.rank, s, i))
                        for i, (x, s) in enumerate(zip(xs, shapes)))
        on_device = all(w.wait().device is g.device for w in works)
        return got, ref, unchanged, on_device, g.stats()["by_op"]["all_reduce"]["calls"]

    out = dist.spawn(fn, 3, devices=devs[:3], timeout=20)
    for i, s in enumerate(shapes):
        stack = np.stack([data(r, s, i) for r in range(3)])
        want = {"sum": stack.sum(0), "mean": stack.mean(0), "max": stack.max(0)}[op]
        for got, ref, unchanged, on_device, calls in out:
            np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
            assert np.array_equal(got[i], ref[i])  # same bits as the blocking call
            assert np.array_equal(got[i], out[0][0][i])  # and on every rank
            assert unchanged and on_device and calls == 2 * len(shapes)  # async + blocking


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_the_download_is_issued_at_the_call(devs, backend, request):
    """The data sent is x at the call, even when the communication thread gets to it only after
    x was overwritten; no staging buffer stays mapped."""
    if backend == "processes":
        request.getfixturevalue("clean_shm")
    out = dist.spawn(ranks.sends_x_as_at_the_call, 2, backend=backend,
                     devices=devs[:2] if backend == "threads" else None, timeout=30)
    for (first, second), mapped in out:
        assert (first == 2.0).all() and (second == 3.0).all() and mapped == 0


def _check_f16(out, world):
    """Each result is the float32 sum (mean) of the float16 inputs rounded once, within one
    float16 step (WGSL may round either way), and the same bits on every rank."""
    for i in range(len(out[0][0])):
        wide = np.stack([o[0][i] for o in out]).astype(np.float32).sum(0)
        for k, want in enumerate((wide, wide / world)):
            got = out[0][1][i][k]
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float16), rtol=1e-3,
                                       atol=1e-7)
            assert all(np.array_equal(o[1][i][k], got) for o in out)


@pytest.mark.parametrize("backend,world,on_device", [
    ("threads", 2, True), ("threads", 3, True), ("threads", 4, True), ("threads", 5, False),
    ("processes", 2, True), ("processes", 3, True)])
def test_float16_is_summed_on_the_device(devs, backend, world, on_device, request, monkeypatch):
    """float16 sums and means over up to 4 ranks (DEVICE_SUM_RANKS) gather the chunks and add
    them on the device (numpy's float16 casts are slow); 5 ranks reduce on the host. The 300,000
    values cross chunks (threads: 64 KB chunks)."""
    from wgrumus.distributed import staged_collectives
    monkeypatch.setattr(staged_collectives, "CHUNK_BYTES", 64 << 10)
    if backend == "processes":
        request.getfixturevalue("clean_shm")
        out = dist.spawn(ranks.f16_all_reduce, world, backend=backend, timeout=60)
        counts = [summed for *_, summed in out]
    else:
        added, add = [], staged_collectives._DeviceSum.add
        monkeypatch.setattr(staged_collectives._DeviceSum, "add",
                            lambda self, c: (added.append(c), add(self, c)))
        out = dist.spawn(functools.partial(ranks.f16_all_reduce, spy=False), world,
                         devices=devs[:world], timeout=60)
        counts = [len(added) / world] * world
    _check_f16(out, world)
    chunks = 2 * (1 + 1 + -(-300_000 * 2 // (64 << 10)))  # sum and mean of the three sizes
    for summed in counts:
        if not on_device:
            assert summed == 0
        elif backend == "threads":
            assert summed == chunks
        else:  # (the processes move a shared-memory slot a chunk)
            assert summed >= 6


def test_arrays_run_on_the_background_thread():
    def fn(g):
        w = g.all_reduce_async(np.full((4, 3), g.rank + 1.0), "sum")
        return w.wait(10)
    for r in dist.spawn(fn, 3, timeout=20):
        assert isinstance(r, np.ndarray) and (r == 6.0).all()


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_failing_rank_makes_every_other_wait_raise(devs, when, dtype):
    """Rank 1 fails before launching (its peers' rounds never fill) or after launching its first
    collective (the second one never fills): the others' waits raise CollectiveError at once
    (the world is aborted), far below the 30 s timeout. float16: the rounds are gathers."""
    took = {}

    def fn(g):
        x = wr.tensor(data(g.rank, (1000,)).astype(dtype), device=g.device)
        if g.rank == 1:
            if when == "after":
                g.all_reduce_async(x, "sum").wait(10)
            raise RuntimeError("injected failure")
        t0 = time.monotonic()
        try:
            works = [g.all_reduce_async(x, "sum") for _ in range(2)]
            failed = []
            for w in works:  # (both waited: the failed one's downloads are freed by then)
                try:
                    w.wait(30)
                except CollectiveError as e:
                    failed.append(e)
            assert failed
        finally:
            took[g.rank] = time.monotonic() - t0
        with pytest.raises(CollectiveError, match="broken"):
            g.all_reduce_async(x, "sum")  # the group stays broken
        assert staging_of(g.device).mapped_buffers(MAP_READ) == 0  # downloads issued: freed

    with pytest.raises(RuntimeError, match="injected failure"):
        dist.spawn(fn, 3, devices=devs[:3], timeout=30)
    assert sorted(took) == [0, 2] and max(took.values()) < 10


def test_a_rank_that_never_arrives_times_out_the_wait(devs):
    def fn(g):
        x = wr.tensor(np.ones(8, np.float32), device=g.device)
        if g.rank == 0:
            t0 = time.monotonic()
            with pytest.raises(CollectiveError) as ei:
                g.all_reduce_async(x).wait(0.5)
            assert ei.value.timed_out and time.monotonic() - t0 < 5
        else:
            time.sleep(2)  # alive, but never calls the collective
        return g.rank

    assert dist.spawn(fn, 2, devices=devs[:2], timeout=20) == [0, 1]


def test_bad_input_raises_before_anything_waits(devs):
    def fn(g):
        with pytest.raises(ValueError, match="unknown reduce op"):
            g.all_reduce_async(wr.tensor(np.ones(4, np.float32), device=g.device), "avg")
        with pytest.raises(ValueError, match="asynchronous collectives run on"):
            g.all_reduce_async(wr.tensor(np.ones(4, np.float32), device=g.device))
            g.all_reduce_async(wr.tensor(np.ones(4, np.float32), device=devs[5]))
        return True
    assert dist.spawn(fn, 1, devices=devs[:1], timeout=20) == [True]
