"""Device staging paths: mapped uploads (chunked), zero-copy and chunked downloads, the
bind-group cache and parameter packing. Chunk sizes are shrunk so small arrays take every path."""
import gc
import struct

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.runtime import device as dm
from wgrumus.runtime import staging as sm


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(sm, "WRITE_CHUNK", 1 << 16)
    monkeypatch.setattr(sm, "READ_CHUNK", 1 << 16)
    monkeypatch.setattr(sm, "ZERO_COPY_MIN", 1 << 12)
    monkeypatch.setattr(sm, "PAR_COPY_MIN", 1 << 12)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 3, 1000, 1 << 14, (1 << 16) + 5, 300_001])
def test_round_trip_every_path(dev, rng, small_chunks, n):
    a = rng.standard_normal(n).astype(np.float32)
    t = wr.tensor(a, device=dev)
    np.testing.assert_array_equal(t.numpy(), a)
    out = np.empty(n, np.float32)
    dev.read_array(t._storage.buffer, 0, n, np.float32, out=out)
    np.testing.assert_array_equal(out, a)
    if n > 1:  # odd element offset
        np.testing.assert_array_equal(t[1:].numpy(), a[1:])
    b = rng.standard_normal(n).astype(np.float32)
    dev.write(t._storage.buffer, b)
    np.testing.assert_array_equal(t.numpy(), b)


@pytest.mark.timeout(60)
def test_upload_is_ordered_with_recorded_ops(dev, rng, small_chunks):
    """A mapped upload is recorded into the batch: ops recorded before it see the old data."""
    a = wr.tensor(np.ones(50_000, np.float32), device=dev)
    before = a * 2.0  # recorded, not yet submitted
    dev.write(a._storage.buffer, np.full(50_000, 5.0, np.float32))
    after = a * 2.0
    assert before.numpy()[0] == 2.0 and after.numpy()[0] == 10.0


@pytest.mark.timeout(60)
def test_zero_copy_array_lives_as_long_as_its_views(dev, rng, small_chunks):
    a = rng.standard_normal(40_000).astype(np.float32)
    t = wr.tensor(a, device=dev)
    r = t.numpy()
    assert r.flags.writeable
    view = r[10:].reshape(-1, 2)
    del r
    gc.collect()
    for _ in range(3):  # reuse of staging buffers must not touch the live view
        wr.tensor(rng.standard_normal(40_000).astype(np.float32), device=dev).numpy()
    np.testing.assert_array_equal(view.reshape(-1), a[10:])
    view[0, 0] = 7.0  # writable, and private to the caller
    np.testing.assert_array_equal(t.numpy()[10], a[10])


def test_two_step_upload_commit_and_cancel(dev, rng):
    x = rng.standard_normal(1000).astype(np.float32)
    t = wr.zeros(1000, device=dev)
    up = dev.write_start(x.nbytes)
    up.view(np.float32)[:] = x
    up.commit(t._storage.buffer, t.offset)
    np.testing.assert_array_equal(t.numpy(), x)
    with pytest.raises(RuntimeError, match="already committed"):
        up.commit(t._storage.buffer)
    dev.write_start(16).cancel()  # given up: nothing is copied
    np.testing.assert_array_equal(t.numpy(), x)
    for bad in (0, 6):
        with pytest.raises(ValueError, match="multiple of 4"):
            dev.write_start(bad)


def test_bind_groups_are_cached(dev):
    x = wr.ones((256,), device=dev)
    y = x + 1.0
    n = len(dev._bind_groups)
    for _ in range(5):
        y = x + 1.0  # same input buffer; outputs recycle the same pooled buffer
        del y
    assert len(dev._bind_groups) <= n + 2
    np.testing.assert_array_equal((x + 1.0).numpy(), np.full(256, 2.0, np.float32))


def test_pack_params():
    buf = bytearray(dm.SLOT)
    dm.pack_words(buf, 0, [1, -1, 2.5, np.float32(0.5), np.int64(7)])
    assert struct.unpack_from("<IIffI", buf) == (1, 0xFFFFFFFF, 2.5, 0.5, 7)
    dm.pack_words(buf, 0, [3, 4])
    assert struct.unpack_from("<II", buf) == (3, 4)
    with pytest.raises(wr.runtime.errors.KernelError):
        dm.pack_words(buf, 0, list(range(65)))
