"""CommThread / async_allreduce on real wgpu devices (any adapter, llvmpipe included): several
logical devices on one adapter, one comm thread each, all-reducing device buffers in place."""
import os
import threading
import time

import numpy as np
import pytest

from wgrumus.distributed import CollectiveBarrier, CollectiveError
from wgrumus.distributed.comm import AllReduceHandle, BufferSlice, CommThread, async_allreduce

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # quiets Mesa's warning on headless machines


@pytest.fixture(scope="module")
def devices():
    wgpu = pytest.importorskip("wgpu")
    from wgrumus.runtime.device import Device
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # noqa: BLE001 - any failure means: no adapter here
        pytest.skip(f"no WebGPU adapter: {e}")
    if adapter is None:
        pytest.skip("no WebGPU adapter")
    return [Device(i, adapter, logical=i) for i in range(3)]


def upload(dev, arr):
    buf = dev.alloc(arr.nbytes)
    dev.write(buf, arr)
    return buf


def download(dev, buf, nbytes, dtype=np.float32):
    return np.frombuffer(dev.read(buf, 0, nbytes), dtype=dtype)


def run_ranks(devices, fn):
    out, errs = [None] * len(devices), [None] * len(devices)

    def body(r):
        try:
            out[r] = fn(r, devices[r])
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(len(devices))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out, errs


@pytest.mark.timeout(60)
def test_chunked_all_reduce_in_place_matches_rank_order_reduction(devices):
    n_elems = 300_001 * 2  # 2.4 MB: three 1 MB chunks and a ragged tail
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(n_elems).astype(np.float32) for _ in devices]
    barrier = CollectiveBarrier(len(devices), timeout=20)

    def rank(r, dev):
        buf = upload(dev, xs[r])
        with CommThread(dev, chunk_bytes=1 << 20) as comm:
            h = async_allreduce(comm, BufferSlice(dev, buf, 0, xs[r].nbytes, np.float32),
                                barrier, "mean")
            assert isinstance(h, AllReduceHandle)
            h.wait(30)
        return download(dev, buf, xs[r].nbytes)

    out, errs = run_ranks(devices, rank)
    assert errs == [None] * 3, errs
    want = ((xs[0] + xs[1]) + xs[2]) / np.float32(3)
    for got in out:
        assert np.array_equal(got, want)


@pytest.mark.timeout(60)
def test_many_rounds_and_sub_slices(devices):
    barrier = CollectiveBarrier(len(devices), timeout=20)
    rounds = 12

    def rank(r, dev):
        base = np.full(64, -1.0, np.float32)
        buf = upload(dev, base)
        comm = CommThread(dev, chunk_bytes=256)
        try:
            for i in range(rounds):
                dev.write(buf, np.full(32, i * 10 + r, np.float32), 64)  # elements 16..47
                h = async_allreduce(comm, BufferSlice(dev, buf, 64, 128, np.float32), barrier,
                                    "sum")
                h.wait(20)
                got = download(dev, buf, 256)
                assert (got[16:48] == 3 * i * 10 + 3).all(), (i, got[16:48])
                assert (got[:16] == -1).all() and (got[48:] == -1).all()
        finally:
            comm.close()
        return True

    out, errs = run_ranks(devices, rank)
    assert errs == [None] * 3, errs


@pytest.mark.timeout(60)
def test_compute_thread_is_not_blocked(devices):
    barrier = CollectiveBarrier(2, timeout=20)
    d0, d1 = devices[0], devices[1]
    b0, b1 = upload(d0, np.ones(1024, np.float32)), upload(d1, np.full(1024, 3, np.float32))
    with CommThread(d0, rank=0) as c0, CommThread(d1, rank=1) as c1:
        t0 = time.monotonic()
        h0 = async_allreduce(c0, BufferSlice(d0, b0, 0, 4096, np.float32), barrier)
        assert time.monotonic() - t0 < 0.5  # returned while rank 1 has not even submitted
        time.sleep(0.05)
        assert not h0.done()
        h1 = async_allreduce(c1, BufferSlice(d1, b1, 0, 4096, np.float32), barrier)
        h0.wait(20), h1.wait(20)
    assert (download(d0, b0, 4096) == 2).all() and (download(d1, b1, 4096) == 2).all()


@pytest.mark.timeout(60)
def test_missing_device_fails_the_others_within_timeout(devices):
    barrier = CollectiveBarrier(3, timeout=0.3)
    d0 = devices[0]
    buf = upload(d0, np.ones(16, np.float32))
    with CommThread(d0, rank=0) as c0:
        h = async_allreduce(c0, BufferSlice(d0, buf, 0, 64, np.float32), barrier)
        with pytest.raises(CollectiveError, match=r"rank\(s\) 1, 2 did not arrive"):
            h.wait(10)
        # the comm thread survives and reports the broken barrier on the next request
        h2 = async_allreduce(c0, BufferSlice(d0, buf, 0, 64, np.float32), barrier)
        with pytest.raises(CollectiveError):
            h2.wait(10)
    assert (download(d0, buf, 64) == 1).all()  # nothing was written back


def test_argument_errors(devices):
    d0, d1 = devices[0], devices[1]
    buf = upload(d0, np.ones(16, np.float32))
    with pytest.raises(ValueError, match="multiples of 4"):
        BufferSlice(d0, buf, 2, 64, np.float32)
    with CommThread(d0, rank=0) as c0:
        with pytest.raises(ValueError, match="lives on"):
            c0.submit(BufferSlice(d1, buf, 0, 64, np.float32), CollectiveBarrier(2))
        with CommThread(d0, rank=5) as c5, pytest.raises(ValueError, match="rank"):
            c5.submit(BufferSlice(d0, buf, 0, 64, np.float32), CollectiveBarrier(2))
        with pytest.raises(TypeError, match="floating"):
            c0.submit(BufferSlice(d0, buf, 0, 64, np.int32), CollectiveBarrier(2), "mean")
        with pytest.raises(TypeError, match="BufferSlice"):
            async_allreduce(c0, object(), CollectiveBarrier(2))
