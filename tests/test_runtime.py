"""Runtime: adapter selection and dedupe, WGRUMUS_* parsing, command batching, the buffer pool,
adapter limits, and errors that name the problem."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.runtime import adapters as ad
from wgrumus.runtime.context import parse_device_count
from wgrumus.runtime.device import ARENA_SLOTS, MAX_WG_PER_DIM, Device, groups_1d
from wgrumus.runtime.pool import BufferPool, bucket_size


class FakeAdapter:
    """Only the ``info`` that dedupe reads (real adapters cannot be made up on CI)."""

    def __init__(self, device, backend, vendor_id=0x10DE, device_id=0x2330, kind="DiscreteGPU"):
        self.info = {"device": device, "backend_type": backend, "vendor_id": vendor_id,
                     "device_id": device_id, "adapter_type": kind}

    def __repr__(self):
        return f"{self.info['device']}/{self.info['backend_type']}"


def test_dedupe_prefers_vulkan_over_gl_for_the_same_gpu():
    vk = FakeAdapter("NVIDIA H100 80GB HBM3", "Vulkan")
    gl = FakeAdapter("NVIDIA H100 80GB HBM3/PCIe/SSE2", "OpenGL", device_id=0)
    cpu_vk = FakeAdapter("llvmpipe (LLVM 15)", "Vulkan", 65541, 0, "CPU")
    cpu_gl = FakeAdapter("llvmpipe (LLVM 15)", "OpenGL", 65541, 0, "CPU")
    assert ad.dedupe([gl, cpu_gl, vk, cpu_vk]) == [vk, cpu_vk]
    # a GPU only GL can see is kept
    other_gl = FakeAdapter("AMD Radeon", "OpenGL", 0x1002, 0, "IntegratedGPU")
    assert ad.dedupe([gl, other_gl, vk]) == [vk, other_gl]


def test_dedupe_keeps_identical_gpus_of_one_backend():
    gpus = [FakeAdapter("NVIDIA H200", "Vulkan", device_id=0x2335) for _ in range(8)]
    gl = FakeAdapter("NVIDIA H200/PCIe/SSE2", "OpenGL", device_id=0)
    out = ad.dedupe(gpus + [gl])
    assert len(out) == 8 and all(a in gpus for a in out)


def test_real_adapters_deduped_and_described():
    found = ad.enumerate_adapters()
    assert found
    keys = [(a.info["device"], a.info["backend_type"]) for a in found]
    assert len(set(keys)) == len(keys)
    names = {ad._name(a.info) for a in found}
    for a in found:  # no GL adapter survives next to a better backend of the same GPU
        if a.info["backend_type"] == "OpenGL":
            assert sum(ad._name(b.info) == ad._name(a.info) for b in found) == 1
    assert len(names) >= 1
    assert "[0]" in ad.describe(found)


def test_wgrumus_adapter_by_index_name_and_bad_values():
    def names(adapters):
        return [(a.info["device"], a.info["backend_type"]) for a in adapters]
    found = names(ad.enumerate_adapters())
    assert names(ad.select_adapters("0")) == found[:1]
    assert found[0] in names(ad.select_adapters(found[0][0][:5].upper()))
    assert names(ad.select_adapters("")) == found
    with pytest.raises(wr.NoAdapterError, match=r"no adapter matches 'nosuchgpu'.*\[0\]"):
        ad.select_adapters("nosuchgpu")
    with pytest.raises(wr.NoAdapterError, match=r"index 99 out of range.*\[0\]"):
        ad.select_adapters("99")


def test_identical_adapters_keep_their_own_index():
    """Identical GPUs have equal names and ids: each device still carries its adapter's place in
    the enumeration (what `wgrumus devices` shows), here two selected copies of one adapter."""
    from wgrumus.runtime.context import MultiGpuContext
    one = ad.enumerate_adapters()[0]
    sel = ad.select_adapters("0,0")
    assert sel.indices == [0, 0]
    ctx = MultiGpuContext(ad.Selection([one, one], [0, 1]), count=4)
    assert [d.adapter_index for d in ctx.devices] == [0, 1, 0, 1]
    assert [d.logical for d in ctx.devices] == [0, 0, 1, 1]


def test_bad_wgrumus_adapter_env_in_a_fresh_process():
    env = dict(os.environ, WGRUMUS_ADAPTER="nosuchgpu")
    r = subprocess.run([sys.executable, "-c", "import wgrumus as wr; wr.devices()"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "NoAdapterError" in r.stderr and "nosuchgpu" in r.stderr and "[0]" in r.stderr


def test_wgrumus_devices_parsing():
    assert parse_device_count("") is None and parse_device_count("  ") is None
    assert parse_device_count("3") == 3 and parse_device_count(" 8 ") == 8
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(wr.WgrumusError, match="WGRUMUS_DEVICES"):
            parse_device_count(bad)


def test_devices_from_env(devs):
    assert len(devs) == int(os.environ["WGRUMUS_DEVICES"])
    assert [d.index for d in devs] == list(range(len(devs)))
    assert len({id(d.wgpu) for d in devs}) == len(devs)  # separate wgpu devices
    d = devs[0]
    assert d.name and isinstance(d.adapter_info, dict) and d.limits["max-buffer-size"] > 0
    assert wr.MultiGpuContext.get()[1] is devs[1] and len(wr.MultiGpuContext.get()) == len(devs)
    with pytest.raises(wr.WgrumusError, match="out of range"):
        wr.zeros(2, device=len(devs))
    with pytest.raises(TypeError, match=r"device='cuda': .*wr.Device or an index into wr.devices"):
        wr.zeros(2, device="cuda")
    with pytest.raises(TypeError, match="Device or device index"):
        wr.zeros(2, device=1.0)


def test_command_batching(dev):
    x = wr.ones(1024, device=dev)
    dev.synchronize()
    s0, d0 = dev.submits, dev.dispatches
    for _ in range(300):
        x = x * 1.0001 + 0.5
    # one submit per ARENA_SLOTS dispatches, not one per op
    assert dev.submits - s0 <= 600 // ARENA_SLOTS + 1
    y = x.numpy()  # readback submits the rest
    assert dev.dispatches - d0 == 600 and dev.submits - s0 <= 600 // ARENA_SLOTS + 2
    assert np.isfinite(y).all()
    dev.synchronize()


def test_pool_reuses_buffers_in_a_loop(dev):
    def step():
        a = wr.randn(256, 64, device=dev, seed=1)
        b = (a * 2.0).exp().sum(axis=1)
        return b.numpy()
    for _ in range(3):
        step()
    gc.collect()
    base = dev.pool.stats()["buffers_created"]
    for _ in range(50):
        step()
    assert dev.pool.stats()["buffers_created"] == base


def test_pool_hands_out_the_oldest_free_buffer_whatever_the_release_order(dev):
    pool = BufferPool(dev.wgpu)
    bufs = [pool.acquire(1000) for _ in range(3)]
    for i in (2, 0, 1):
        pool.release(bufs[i])
    assert [pool.acquire(1000) for _ in range(3)] == bufs


def test_a_repeated_training_step_reuses_its_bind_groups(dev):
    """The same step gets the same buffers each time, so it creates no new bind groups."""
    net = wr.nn.Sequential(wr.nn.Linear(16, 32, device=dev, seed=1), wr.nn.GELU(),
                           wr.nn.Linear(32, 4, device=dev, seed=2))
    opt = wr.optim.AdamW(net.parameters(), lr=1e-3)
    x = wr.randn(8, 16, device=dev, seed=3)
    y = wr.tensor(np.arange(8, dtype=np.int32) % 4, device=dev)

    def step():
        loss = wr.nn.functional.cross_entropy(net(x), y)
        opt.step(wr.autograd.backward(loss))
        return loss.item()
    for _ in range(3):
        step()
    before = len(dev._bind_groups)
    for _ in range(5):
        step()
    assert len(dev._bind_groups) == before


def test_checked_pass_recording_gives_the_same_results(dev, monkeypatch):
    """WGRUMUS_CHECKED_PASS=1 records through wgpu-py's API instead of the C calls."""
    monkeypatch.setenv("WGRUMUS_CHECKED_PASS", "1")
    checked = Device(99, dev.adapter)
    assert checked.raw_pass is None and dev.raw_pass is not None
    a = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((17, 9)).astype(np.float32)
    out = []
    for d in (dev, checked):
        ta, tb = wr.tensor(a, device=d), wr.tensor(b, device=d)
        out.append(((ta @ tb).relu().softmax(axis=1) + ta.sum(axis=1, keepdims=True)).numpy())
    np.testing.assert_allclose(out[0], out[1], rtol=1e-6, atol=1e-6)
    want = np.maximum(a @ b, 0)
    want = np.exp(want - want.max(1, keepdims=True))
    np.testing.assert_allclose(out[0], want / want.sum(1, keepdims=True) + a.sum(1, keepdims=True),
                               rtol=1e-4, atol=1e-4)


def test_buffers_of_tensors_dying_in_reference_cycles_stay_usable(dev):
    class Holder:
        pass
    for _ in range(20):
        h = Holder()
        h.me = h  # a cycle: only the cyclic collector frees it
        h.t = wr.ones(1000, device=dev) * 3.0
        del h
    gc.collect()
    for _ in range(30):  # reuse every pooled buffer; a released one would abort wgpu-native
        np.testing.assert_allclose((wr.ones(1000, device=dev) + 1.0).numpy(), 2.0)


def test_bucket_sizes():
    assert bucket_size(1) == 256 and bucket_size(257) == 512 and bucket_size(4096) == 4096
    for n in (5000, 123_457, 10_000_000):
        b = bucket_size(n)
        assert n <= b < 1.26 * n + 256 and b % 4 == 0
    assert bucket_size(1000, limit=1024) == 1024
    lim = (1 << 31) - 1
    assert bucket_size(lim - 100, limit=lim) <= lim and bucket_size(lim - 100, limit=lim) % 4 == 0


def test_alloc_beyond_limit_names_the_limit(dev):
    n = dev.max_binding // 4 + 1
    with pytest.raises(wr.AdapterLimitError, match="max-storage-buffer-binding-size"):
        wr.empty(n, device=dev)
    with pytest.raises(wr.AdapterLimitError, match="max-storage-buffer-binding-size"):
        wr.zeros(n, device=dev)


def test_groups_1d_splits_past_the_limit():
    assert groups_1d(256 * 100) == (100, 1, 1)
    for n in (MAX_WG_PER_DIM * 256 + 1, 10 ** 9):
        gx, gy, gz = groups_1d(n)
        assert gx <= MAX_WG_PER_DIM and gy <= MAX_WG_PER_DIM and gx * gy * 256 >= n


def test_synchronize_and_read_write_roundtrip(dev):
    a = np.arange(1001, dtype=np.float32)
    t = wr.tensor(a, device=dev)
    dev.synchronize()
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t[3:8].numpy(), a[3:8])  # unaligned offset read
    raw = dev.read(t._storage.buffer, 4 * 5, 4 * 3)
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), a[5:8])


def test_no_raw_wgpu_error_reaches_the_user(devs):
    """Every user mistake raises one of our errors (or a plain Python one), never wgpu's."""
    d0, d1 = devs[0], devs[1]
    big = d0.max_binding // 4 + 1
    mistakes = [
        lambda: wr.zeros(big, device=d0),
        lambda: wr.ones(3, device=d0) + wr.ones(3, device=d1),
        lambda: wr.ones(2, 3) + wr.ones(4),
        lambda: wr.ones(2, 3) @ wr.ones(2, 3),
        lambda: wr.ones(2) @ wr.tensor(1.0),
        lambda: wr.ones(2, 3).sum(axis=5),
        lambda: wr.ones(2, 3)[5],
        lambda: wr.ones(2, 3).reshape(5),
        lambda: wr.ones(2).astype(np.float64),
        lambda: wr.tensor(np.array([1 + 2j])),
        lambda: wr.arange(0, 3, 0),
        lambda: wr.ones(2, 0).max(axis=1),
        lambda: wr.ops.elementwise.map_op("a +* b", [wr.ones(2), wr.ones(2)]),
        lambda: wr.ones(2).to(len(devs)),
        lambda: wr.cat([wr.ones(2, device=d0), wr.ones(2, device=d1)]),
    ]
    for k, f in enumerate(mistakes):
        with pytest.raises(Exception) as e:
            f()
        assert not type(e.value).__module__.startswith("wgpu"), (k, e.value)
        assert isinstance(e.value, (wr.WgrumusError, TypeError, ValueError, IndexError)), (k, e)


def test_gpu_timer_measures_compute_passes(dev, monkeypatch):
    from wgrumus.runtime import GpuTimer
    if "timestamp-query" not in dev.features:
        pytest.skip("adapter without timestamp-query")
    a = wr.randn(128, 128, device=dev, seed=1)
    dev.synchronize()
    times = []
    for reps in (1, 1, 1, 60):  # the least of three single products: a loaded CPU adapter's
        with GpuTimer(dev) as t:  # spans include the time its threads are descheduled
            y = a
            for _ in range(reps):
                y = (y @ a) * 0.01
        assert t.passes >= 1 and t.untimed == 0
        times.append(t.seconds)
    assert 0 < min(times[:3]) and times[3] > 3 * min(times[:3])  # 60x the work
    assert len(t.spans) == t.passes and sum(t.spans) == pytest.approx(t.seconds)
    with GpuTimer(dev):
        with pytest.raises(RuntimeError, match="already being timed"):
            GpuTimer(dev).__enter__()
    monkeypatch.setattr(dev, "features", frozenset())
    with pytest.raises(wr.WgrumusError, match="timestamp-query"):
        GpuTimer(dev)
