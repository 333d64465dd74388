"""Concurrency (issue 10, item 5): wgpu objects used from several threads at once (compute
threads, comm threads, the data-loader thread) under load, and the parallel tests re-run with
seeded random delays at the points where threads meet. The 50-repeat campaign is
``python benchmarks/reliability.py --campaign concurrency --runs 50``."""
import sys
import threading
import time

import numpy as np
import pytest
from _util import load_benchmark

import wgrumus as wr
from wgrumus import distributed as dist

rel = load_benchmark("reliability")


@pytest.mark.timeout(120)
def test_compute_comm_and_loader_threads_at_once(devs):
    """Three compute threads (own device each), three comm threads all-reducing, and a data
    loader prefetching device batches, all at the same time; every result checked."""
    from wgrumus.data import DataLoader, TensorDataset
    baseline = set(threading.enumerate())
    rounds, errors = 12, []
    rng = np.random.default_rng(0)
    A = rng.standard_normal((24, 24)).astype(np.float32)

    def compute(dev, seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(rounds):
                x = r.standard_normal((16, 24)).astype(np.float32)
                y = (wr.tensor(x, device=dev) @ wr.tensor(A, device=dev)).relu().sum(axis=1)
                np.testing.assert_allclose(y.numpy(), np.maximum(x @ A, 0).sum(1), rtol=1e-4,
                                           atol=1e-4)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(("compute", dev.index, e))

    comm_devs = devs[3:6]
    bar = dist.CollectiveBarrier(len(comm_devs), timeout=30)
    comms = [dist.CommThread(d, rank=k) for k, d in enumerate(comm_devs)]

    def reduce(k):
        try:
            for i in range(rounds):
                x = wr.tensor(np.full(1000, float(k + i), np.float32), device=comm_devs[k])
                got = dist.async_allreduce(comms[k], x, bar, op="sum").wait(30).numpy()
                np.testing.assert_array_equal(got, sum(q + i for q in range(len(comm_devs))))
        except BaseException as e:  # noqa: BLE001
            errors.append(("comm", k, e))

    X = np.arange(64 * 6, dtype=np.float32).reshape(64, 6)
    loader = DataLoader(TensorDataset(X), batch_size=8, shuffle=True, prefetch=2,
                        device=devs[6], seed=3)

    def consume():
        try:
            for _ in range(2):
                seen = []
                for (b,) in loader:
                    seen.append((b * 2.0).numpy() / 2.0)
                np.testing.assert_array_equal(np.sort(np.concatenate(seen), 0), X)
        except BaseException as e:  # noqa: BLE001
            errors.append(("loader", 0, e))

    threads = [threading.Thread(target=compute, args=(devs[k], k), name=f"t-compute{k}")
               for k in range(3)]
    threads += [threading.Thread(target=reduce, args=(k,), name=f"t-reduce{k}")
                for k in range(len(comm_devs))]
    threads.append(threading.Thread(target=consume, name="t-loader"))
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    for c in comms:
        c.close(10)
    loader.close()
    assert not [t.name for t in threads if t.is_alive()], "a thread hung"
    assert not errors, errors
    assert rel.leftover_threads(baseline) == []


@pytest.mark.timeout(170)
@pytest.mark.parametrize("seed", [11, 12])
def test_parallel_tests_pass_with_random_delays(seed):
    """A jittered re-run of the data-parallel, comm and pipeline tests that involve many threads
    (faults, overlap, equivalence) in a child pytest with the reliability plugin."""
    rec = rel.concurrency_run(seed, ["tests/test_comm.py", "tests/test_data_parallel.py",
                                     "tests/test_pipeline.py"],
                              extra=["-k", "fault or failing or first_bucket or stuck or "
                                           "equivalence_with_one_device and AdamW"], wall=160)
    assert rec["ok"], rec["tail"]
    assert rec["jitter_points"] == len(rel.JITTER_POINTS), rec  # every point really patched
    assert rec["counts"].get("passed", 0) >= 5, rec


def test_jitter_is_seeded_and_restores_nothing_it_should_not():
    """install_jitter wraps functions, keeps their behaviour, and skips unknown points."""
    import types
    mod = types.ModuleType("fake_jitter_target")

    class K:
        def f(self, x):
            return x + 1
    mod.K = K
    sys.modules["fake_jitter_target"] = mod
    saved = rel.JITTER_POINTS
    try:
        rel.JITTER_POINTS = ["fake_jitter_target:K.f", "fake_jitter_target:K.missing",
                             "no_such_module_xyz:A.b"]
        patched = rel.install_jitter(1, max_delay=0.001, prob=1.0)
        assert patched == ["fake_jitter_target:K.f"]
        t0 = time.perf_counter()
        assert K().f(1) == 2
        assert time.perf_counter() - t0 > 0  # it ran through the wrapper
        assert rel.install_jitter(1) == []  # never wrapped twice
    finally:
        rel.JITTER_POINTS = saved
        del sys.modules["fake_jitter_target"]
