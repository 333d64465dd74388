"""The pipelined staging engine under CommThread and the thread backend's device collectives:
per-request map tracking (out-of-order waits, no wgpu-py promise), a rank failing mid-chunk,
10,000 mixed-size all-reduces with random delays, ProcessGroup's all_reduce / reduce_scatter /
all_gather / broadcast of device tensors, and the fallback over wgpu-py's promises."""
import threading
import time

import numpy as np
import pytest
from test_comm import download, upload

import wgrumus as wr
from wgrumus.distributed import CollectiveBarrier, CollectiveError, staged_collectives
from wgrumus.distributed.comm import BufferSlice, CommThread, async_allreduce
from wgrumus.runtime.native import MAP_READ, api
from wgrumus.runtime.staging import Staging, StagingBuffer, staging_of


@pytest.fixture(scope="module")
def devices(devs):
    return devs[:3]


def host_threads(monkeypatch, kind):
    """kind "helpers": every exchange round of 1 KiB and more is split over the participants
    and helper threads (at most two), and participants poll before blocking (a large host's
    setting); the barrier's ``helpers`` argument is returned."""
    if kind == "helpers":
        from wgrumus.distributed import barrier as barrier_mod
        from wgrumus.distributed import host_reduce
        monkeypatch.setattr(barrier_mod, "SPIN_S", 100e-6)
        monkeypatch.setattr(host_reduce, "PARALLEL_MIN_BYTES", 1024)
        monkeypatch.setattr(host_reduce, "SPLIT_MIN_BYTES", 256)
        monkeypatch.setattr(host_reduce, "HELPER_BYTES", 1024)
    return 2 if kind == "helpers" else None


def run_ranks(n, fn, join=60):
    out, errs, took = [None] * n, [None] * n, [None] * n

    def body(r):
        t0 = time.monotonic()
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            errs[r] = e
        took[r] = time.monotonic() - t0

    ts = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(join)
    assert not any(t.is_alive() for t in ts), "a rank hung"
    return out, errs, took


def test_native_api_is_used_in_the_tested_range():
    import wgpu

    from wgrumus._deps import wgpu_in_range
    if wgpu_in_range(wgpu.__version__):
        assert api().native, "wgpu-py in the tested range but the C API was not loaded"


@pytest.mark.timeout(60)
def test_maps_complete_and_are_waited_out_of_order(devices):
    """Downloads queued back to back, each with its own map request, waited in a shuffled order
    (later chunks first), with write maps (no copy to wait for) resolving in between."""
    dev = devices[0]
    st = Staging(dev)
    pending = api().pending  # other tests' idle upload buffers may still be re-mapping
    k, n = 6, 1 << 16
    data = np.arange(k * n // 4, dtype=np.uint32)
    buf = upload(dev, data)
    reads = []
    for i in range(k):
        r = st.reader(n)
        st.submit([(buf, i * n, r.buffer, 0, n)], [r])
        reads.append(r)
    w = st.writer(n, time.monotonic() + 10)  # a map with no copy to wait for, in between
    for i in [5, 0, 3, 1, 4, 2]:
        reads[i].wait(time.monotonic() + 10)
        got = reads[i].array(np.uint32, n)
        assert np.array_equal(got, data[i * n // 4:(i + 1) * n // 4]), i
        del got
        reads[i].unmap()
        st.give_back(reads[i])
    w.unmap()
    assert st.mapped_buffers() == 0
    assert api().pending <= pending


@pytest.mark.timeout(60)
def test_engine_waits_on_its_own_map_requests_not_wgpu_py_promises(devices, monkeypatch):
    """wgpu-py resolves its promises on a poll thread that waits for *all* submitted work (and
    holds the device's fence meanwhile); the engine must not depend on it: no poll token is
    taken while two ranks all-reduce 64 KiB in 4 KiB chunks."""
    if not api().native:
        pytest.skip("wgpu-py outside the tested range: the engine uses its promises")
    from wgpu.backends.wgpu_native import _poller
    tokens = []
    real = _poller.PollThread.get_token
    monkeypatch.setattr(_poller.PollThread, "get_token",
                        lambda self: tokens.append(1) or real(self))
    xs = [np.full(16384, r + 1, np.float32) for r in range(2)]
    bufs = [upload(d, x) for d, x in zip(devices, xs)]
    for d in devices[:2]:
        d.synchronize()
    barrier = CollectiveBarrier(2, timeout=20)
    tokens.clear()

    def rank(r):
        with CommThread(devices[r], rank=r, chunk_bytes=4096) as comm:
            async_allreduce(comm, BufferSlice(devices[r], bufs[r], 0, 65536, np.float32),
                            barrier, "sum").wait(30)

    _, errs, _ = run_ranks(2, rank)
    assert errs == [None, None], errs
    assert tokens == []
    monkeypatch.undo()
    for d, b in zip(devices, bufs):
        assert (download(d, b, 65536) == 3).all()


@pytest.mark.timeout(60)
def test_map_waits_never_block_in_the_device_poll(devices, monkeypatch):
    """A blocking wgpuDevicePoll holds the device's fence lock, which every submit to that
    device needs: with blocking waits off (a GPU's default) a map wait polls without blocking
    (so a compute thread's submits never stall behind a comm thread's wait), with the same
    results."""
    if not api().native:
        pytest.skip("wgpu-py outside the tested range: the engine uses its promises")
    from wgrumus.runtime import native
    from wgrumus.runtime.tuning import TUNING

    def refuse(*a):
        raise AssertionError("blocking wgpuDevicePoll")
    monkeypatch.setattr(TUNING, "blocking_waits", False)
    monkeypatch.setattr(native._Native, "wait_index", refuse)
    dev = devices[0]
    st = Staging(dev)
    data = np.arange(4096, dtype=np.uint32)
    buf = upload(dev, data)
    for _ in range(20):
        r = st.reader(data.nbytes)
        st.submit([(buf, 0, r.buffer, 0, data.nbytes)], [r])
        assert r.req.status is None and r.req.index is not None  # nothing polled it yet
        r.wait(time.monotonic() + 10)
        assert np.array_equal(r.array(np.uint32, data.nbytes), data)
        r.unmap()
        st.give_back(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", ["participants", "helpers"])
def test_a_rank_failing_mid_chunk_fails_everyone_and_leaves_nothing_mapped(devices,
                                                                           monkeypatch, threads):
    nelem, chunk = 64 * 1024, 16 * 1024  # 16 chunks per all-reduce
    xs = [np.full(nelem, r + 1, np.float32) for r in range(3)]
    bufs = [upload(d, x) for d, x in zip(devices, xs)]
    barrier = CollectiveBarrier(3, timeout=20, helpers=host_threads(monkeypatch, threads))
    failing = staging_of(devices[1])
    calls = {"n": 0}
    real_writer = Staging.writer

    def writer(self, nbytes, deadline, **kw):
        if self is failing:
            calls["n"] += 1
            if calls["n"] == 5:  # rank 1, chunk 4: downloads of later chunks are in flight
                raise RuntimeError("injected failure on rank 1")
        return real_writer(self, nbytes, deadline, **kw)

    monkeypatch.setattr(Staging, "writer", writer)

    def rank(r):
        with CommThread(devices[r], rank=r, chunk_bytes=chunk) as comm:
            h = async_allreduce(comm, BufferSlice(devices[r], bufs[r], 0, nelem * 4,
                                                  np.float32), barrier, "sum")
            h.wait(30)

    _, errs, took = run_ranks(3, rank)
    assert isinstance(errs[1], RuntimeError) and "injected" in str(errs[1])
    for r in (0, 2):
        assert isinstance(errs[r], CollectiveError), errs[r]
        assert "injected" in str(errs[r])
        assert took[r] < barrier.timeout  # woken by the abort, not by the timeout
    for d in devices:
        assert staging_of(d).mapped_buffers() == 0
    assert api().pending == 0
    monkeypatch.undo()
    # every device still works: a fresh all-reduce over the same buffers is exact
    barrier = CollectiveBarrier(3, timeout=20)
    for d, b, x in zip(devices, bufs, xs):
        d.write(b, x)

    def again(r):
        with CommThread(devices[r], rank=r, chunk_bytes=chunk) as comm:
            async_allreduce(comm, BufferSlice(devices[r], bufs[r], 0, nelem * 4, np.float32),
                            barrier, "sum").wait(30)
        return download(devices[r], bufs[r], nelem * 4)

    out, errs, _ = run_ranks(3, again)
    assert errs == [None] * 3, errs
    for got in out:
        assert (got == 6).all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,threads,early_cap", [
    (2, "participants", None), (3, "participants", None), (3, "helpers", None),
    (3, "participants", 2048)])
def test_ten_thousand_mixed_all_reduces_with_random_delays_are_exact(devices, world, threads,
                                                                     early_cap, monkeypatch):
    """10,000 all-reduces between 2 ranks (1,000 between 3; sizes 4 B .. 6 KiB in 1 KiB chunks,
    so up to 6 chunks each), ranks pausing at random; integer-valued float32 and int32 sums must
    be exact. ``early_cap``: the downloads issued at the call capped at 2 KiB a device, so most
    calls issue some of their chunks or none and the engine issues the rest."""
    if early_cap is not None:
        monkeypatch.setattr(staged_collectives, "EARLY_BYTES", early_cap)
    count = 10_000 if world == 2 else 1_000
    rng = np.random.default_rng(world)
    sizes = rng.integers(1, 1536, count) * 4  # bytes
    dtypes = [np.float32 if i % 3 else np.int32 for i in range(count)]
    offs = np.concatenate([[0], np.cumsum(sizes)])
    total = int(offs[-1])
    inputs = [rng.integers(-1000, 1000, total // 4).astype(np.int32) for _ in range(world)]
    barrier = CollectiveBarrier(world, timeout=30, helpers=host_threads(monkeypatch, threads))

    def rank(r):
        dev = devices[r]
        host = inputs[r].copy()
        f = host.view(np.float32)  # float ops get integer-valued floats, exact in a sum
        for i, dt in enumerate(dtypes):
            if dt is np.float32:
                lo, hi = offs[i] // 4, offs[i + 1] // 4
                f[lo:hi] = inputs[r][lo:hi].astype(np.float32)
        buf = upload(dev, host)
        delays = np.random.default_rng(100 + r)
        handles = []
        with CommThread(dev, rank=r, chunk_bytes=1024, depth=32) as comm:
            for i, dt in enumerate(dtypes):
                if delays.random() < 0.002:
                    time.sleep(delays.random() * 0.01)
                s = BufferSlice(dev, buf, int(offs[i]), int(sizes[i]), dt)
                handles.append(async_allreduce(comm, s, barrier, "sum"))
                if len(handles) > 64:
                    handles.pop(0).wait(60)
            for h in handles:
                h.wait(60)
        assert staged_collectives.early_bytes(dev) == 0
        return np.frombuffer(dev.read(buf, 0, total), np.int32).copy()

    out, errs, _ = run_ranks(world, rank, join=110)
    assert errs == [None] * world, errs
    want = np.sum(inputs, axis=0, dtype=np.int32)
    for got in out:
        for i, dt in enumerate(dtypes):
            lo, hi = offs[i] // 4, offs[i + 1] // 4
            if dt is np.float32:
                assert np.array_equal(got[lo:hi].view(np.float32), want[lo:hi]), i
            else:
                assert np.array_equal(got[lo:hi], want[lo:hi]), i


def test_early_downloads_stay_under_their_cap_and_are_taken_once(devices, monkeypatch):
    """Downloads issued at the call count against EARLY_BYTES per device until taken or
    released; a call past the cap issues fewer chunks or none, and the engine finishes it."""
    monkeypatch.setattr(staged_collectives, "EARLY_BYTES", 3 * 1024)
    dev = devices[0]
    x = np.arange(1024, dtype=np.float32)
    buf = upload(dev, x)
    whole = BufferSlice(dev, buf, 0, 4096, np.float32)
    part = BufferSlice(dev, buf, 0, 2048, np.float32)
    a = staged_collectives.EarlyDownload(whole, chunk_bytes=1024)  # 3 of its 4 chunks fit
    b = staged_collectives.EarlyDownload(part, chunk_bytes=1024)  # none fits
    assert (a.issued, b.issued, staged_collectives.early_bytes(dev)) == (3, 0, 3072)
    a.release()
    c = staged_collectives.EarlyDownload(part, chunk_bytes=1024)
    assert c.issued == 2 and staged_collectives.early_bytes(dev) == 2048
    barrier = CollectiveBarrier(1, timeout=10)
    for e, s in ((b, part), (c, part)):
        staged_collectives.all_reduce(s, barrier, 0, "sum", chunk_bytes=4096, early=e)
    assert staged_collectives.early_bytes(dev) == 0
    with pytest.raises(RuntimeError, match="already taken"):
        c.take()
    stray = staged_collectives.EarlyDownload(part)
    with pytest.raises(ValueError, match="another buffer slice"):
        staged_collectives.all_reduce(whole, barrier, 0, "sum", early=stray)
    assert staged_collectives.early_bytes(dev) == 2048  # refused before it was taken over
    stray.release()
    assert staged_collectives.early_bytes(dev) == 0
    assert np.array_equal(download(dev, buf, 4096), x)  # one participant: sums are the input
    assert staging_of(dev).mapped_buffers(MAP_READ) == 0


@pytest.fixture
def small_chunks(monkeypatch):
    """256-byte chunks, so the small tensors below cross many chunk boundaries mid-piece."""
    from wgrumus.distributed import staged_collectives
    monkeypatch.setattr(staged_collectives, "CHUNK_BYTES", 256)


def _no_host_round_trip(monkeypatch):
    """The engine path never reads a tensor into numpy (the host path does, via read_array)."""
    from wgrumus.runtime.device import Device

    def refuse(*a, **k):
        raise AssertionError("device collective read the tensor through read_array")

    monkeypatch.setattr(Device, "read_array", refuse)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_process_group_device_collectives_run_on_the_engine(devices, small_chunks, monkeypatch,
                                                           world):
    import wgrumus as wr
    from wgrumus import distributed as dist
    rng = np.random.default_rng(world)
    xs = [rng.integers(-50, 50, (37, 5)).astype(np.float32) for _ in range(world)]
    ints = [rng.integers(-9, 9, (11,)).astype(np.int32) for _ in range(world)]
    pieces = [rng.standard_normal((3 * r + 2, 5)).astype(np.float32) for r in range(world)]

    def fn(g):
        r = g.rank
        t = wr.tensor(xs[r], device=g.device)
        ti = wr.tensor(ints[r], device=g.device, dtype=np.int32)
        tp = wr.tensor(pieces[r], device=g.device)
        g.barrier()
        if r == 0:
            _no_host_round_trip(monkeypatch)
        g.barrier()
        outs = {"sum": g.all_reduce(t, "sum"), "mean": g.all_reduce(t, "mean"),
                "max": g.all_reduce(t, "max"), "isum": g.all_reduce(ti, "sum"),
                "rs": g.reduce_scatter(t, "sum"), "ag": g.all_gather(tp),
                "bc": g.broadcast(t, root=world - 1),
                "empty": g.all_reduce(wr.tensor(np.zeros((0, 3), np.float32), device=g.device))}
        return {k: (type(v).__name__, v.device is g.device, v) for k, v in outs.items()}

    out = dist.spawn(fn, world, devices=devices[:world], timeout=60)
    monkeypatch.undo()
    out = [{k: (a, b, v.numpy()) for k, (a, b, v) in res.items()} for res in out]
    total = np.sum(xs, axis=0, dtype=np.float32)
    bounds = np.array_split(np.arange(37), world)
    for r, res in enumerate(out):
        assert all(kind == "Tensor" and same for kind, same, _ in res.values()), res
        assert np.array_equal(res["sum"][2], total)
        mean = xs[0].copy()
        for x in xs[1:]:
            mean += x
        assert np.array_equal(res["mean"][2], mean / np.float32(world))
        assert np.array_equal(res["max"][2], np.max(xs, axis=0))
        assert np.array_equal(res["isum"][2], np.sum(ints, axis=0, dtype=np.int32))
        assert np.array_equal(res["rs"][2], total[bounds[r]])
        assert np.array_equal(res["ag"][2], np.concatenate(pieces))
        assert np.array_equal(res["bc"][2], xs[world - 1])
        assert res["empty"][2].shape == (0, 3)
    from wgrumus.runtime.native import MAP_READ, MAP_WRITE
    for d in devices[:world]:  # only idle upload buffers stay mapped (to be filled)
        st = staging_of(d)
        assert st.mapped_buffers(MAP_READ) == 0
        assert st.mapped_buffers(MAP_WRITE) <= st.idle_buffers(MAP_WRITE)


@pytest.mark.timeout(60)
def test_process_group_rank_passing_an_array_among_tensors_fails_clearly(devices):
    import wgrumus as wr
    from wgrumus import distributed as dist

    def fn(g):
        x = np.ones(4, np.float32)
        return g.all_reduce(x if g.rank == 1 else wr.tensor(x, device=g.device))

    with pytest.raises(CollectiveError, match="called"):
        dist.spawn(fn, 2, devices=devices[:2], timeout=10)


@pytest.mark.timeout(60)
def test_process_group_unaligned_tensors_take_the_host_path_together(devices):
    """float16 rows of odd length cannot be cut at 4-byte boundaries: every rank agrees to use
    the host path, and the results are the same."""
    import wgrumus as wr
    from wgrumus import distributed as dist
    xs = [np.arange(15, dtype=np.float16).reshape(5, 3) + r for r in range(2)]

    def fn(g):
        t = wr.tensor(xs[g.rank], device=g.device, dtype=np.float16)
        return g.reduce_scatter(t, "sum").numpy(), g.all_gather(t).numpy()

    out = dist.spawn(fn, 2, devices=devices[:2], timeout=20)
    total = xs[0] + xs[1]
    assert np.array_equal(out[0][0], total[:3]) and np.array_equal(out[1][0], total[3:])
    assert all(np.array_equal(o[1], np.concatenate(xs)) for o in out)


@pytest.mark.timeout(60)
def test_barrier_exchange_rounds_split_over_helper_threads():
    """exchange() with large pieces (cut into pieces for participants and 2 helper threads):
    a reduce-scatter-like round writes each rank its own range; a gather-like round assembles
    disjoint pieces; pieces that do not tile the space fail every participant."""
    n, world = 1 << 19, 3  # 2 MiB of float32: split into many pieces
    rng = np.random.default_rng(1)
    xs = [rng.integers(-99, 99, n).astype(np.float32) for _ in range(world)]
    cuts = [0, 100_003, 300_001, n]
    barrier = CollectiveBarrier(world, timeout=20, helpers=2)

    def rank(r):
        mine = np.empty(cuts[r + 1] - cuts[r], np.float32)
        barrier.exchange(n, np.float32, r, xs[r], 0, mine, cuts[r], op="sum")
        full = np.empty(n, np.float32)
        barrier.exchange(n, np.float32, r, xs[r][cuts[r]:cuts[r + 1]], cuts[r], full, 0)
        return mine, full

    out, errs, _ = run_ranks(world, rank)
    assert errs == [None] * world, errs
    total = xs[0] + xs[1] + xs[2]
    want_full = np.concatenate([xs[r][cuts[r]:cuts[r + 1]] for r in range(world)])
    for r, (mine, full) in enumerate(out):
        assert np.array_equal(mine, total[cuts[r]:cuts[r + 1]])
        assert np.array_equal(full, want_full)

    def overlapping(r):
        barrier.exchange(8, np.float32, r, np.zeros(4, np.float32), 0 if r < 2 else 4, None)

    _, errs, _ = run_ranks(world, overlapping)
    assert all(isinstance(e, CollectiveError) and "cover" in str(e) for e in errs), errs


@pytest.mark.timeout(60)
def test_engine_over_wgpu_py_promises_outside_the_tested_range(devices, monkeypatch):
    """Where the C API is not used (another wgpu-py), the same engine runs on wgpu-py's own
    map promises: slower, same results."""
    from wgrumus.runtime import native, staging
    monkeypatch.setattr(staging, "api", native._WgpuPy)
    monkeypatch.setattr(staging, "_STAGING", staging.weakref.WeakKeyDictionary())
    xs = [np.arange(16384, dtype=np.float32) * (r + 1) for r in range(2)]
    bufs = [upload(d, x) for d, x in zip(devices, xs)]
    barrier = CollectiveBarrier(2, timeout=20)

    def rank(r):
        with CommThread(devices[r], rank=r, chunk_bytes=4096) as comm:
            async_allreduce(comm, BufferSlice(devices[r], bufs[r], 0, 65536, np.float32),
                            barrier, "sum").wait(30)
        assert not staging.staging_of(devices[r]).api.native
        return download(devices[r], bufs[r], 65536)

    out, errs, _ = run_ranks(2, rank)
    assert errs == [None, None], errs
    for got in out:
        assert np.array_equal(got, xs[0] + xs[1])


@pytest.mark.timeout(60)
def test_upload_buffers_rotate_past_the_downloads_in_flight(devices, monkeypatch):
    """An upload buffer given back waits for a submission that also carries a download k chunks
    ahead: writer(spare=k) takes a fresh buffer while at most k idle ones are not ready, and
    takes (and waits for) the oldest once more than k wait."""
    st = Staging(devices[0])
    n = 4096
    given = [st.writer(n, time.monotonic() + 10) for _ in range(3)]
    for w in given:
        w.unmap()
        st.submit([], [w])  # map requested, resolved only by a later poll or wait
        st.give_back(w)
    monkeypatch.setattr(StagingBuffer, "ready", lambda self: False)  # their copies still run
    fresh = st.writer(n, time.monotonic() + 10, spare=3)
    monkeypatch.undo()
    assert all(fresh is not w for w in given) and fresh.mapped
    oldest = st.writer(n, time.monotonic() + 10, spare=2)
    assert oldest is given[0] and oldest.mapped
    st.discard([fresh, oldest])
    assert st.mapped_buffers() == 0


@pytest.mark.timeout(60)
def test_device_reads_and_uploads_wait_without_blocking_polls(devices, monkeypatch):
    """Reads (``.numpy()``, synchronize) and staged uploads wait through the same non-blocking
    polls: no blocking wgpuDevicePoll and no wgpu-py promise (its poll thread blocks in one)."""
    if not api().native:
        pytest.skip("wgpu-py outside the tested range: reads use its promises")
    from wgpu.backends.wgpu_native import _api

    from wgrumus.runtime import native
    from wgrumus.runtime.tuning import TUNING

    def refuse(*a, **k):
        raise AssertionError("a blocking wait")
    monkeypatch.setattr(TUNING, "blocking_waits", False)
    monkeypatch.setattr(native._Native, "wait_index", refuse)
    monkeypatch.setattr(_api.GPUBuffer, "map_async", refuse)
    dev = devices[0]
    rng = np.random.default_rng(0)
    for n in (3, 1 << 18, 1 << 20):  # queue writes, then mapped uploads and zero-copy reads
        x = rng.standard_normal(n).astype(np.float32)
        t = wr.tensor(x, device=dev)
        np.testing.assert_array_equal((t * 2).numpy(), 2 * x)
        dev.synchronize()
