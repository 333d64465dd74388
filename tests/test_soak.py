"""Long runs (issue 10, item 4), CI length: a few hundred data-parallel steps with the GPU buffer
pools, host RSS and thread count flat after warm-up; and the regression test of the cycle
collector handing a dead buffer back to the pool. The 10,000-step soak is
``python benchmarks/soak.py --steps 10000``."""
import sys
import threading

import numpy as np
import pytest
from _util import load_benchmark, run_process

import wgrumus as wr

soak = load_benchmark("soak")


@pytest.mark.timeout(120)
def test_short_soak_is_flat_after_warm_up(devs):
    samples = soak.soak(300, n_devices=2, every=50, warmup=100)
    verdict = soak.flatness(samples, warmup=100, rss_slack_mb=12.0)
    assert verdict["ok"], (verdict, samples)
    assert samples[-1]["buffers_created"] > 0  # the pools were really watched


def test_flatness_check_can_fail():
    base = {"loss": 1.0, "rss_mb": 100.0, "threads": 5, "live_bytes": 10, "cached_bytes": 0,
            "buffers_created": 3}
    samples = [dict(base, step=s) for s in (100, 200, 300)]
    samples[-1] = dict(samples[-1], buffers_created=4, threads=6, rss_mb=200.0, loss=0.5)
    v = soak.flatness(samples, warmup=100, rss_slack_mb=10)
    assert not v["ok"] and len(v["problems"]) == 3, v


CYCLE_PROGRAM = r"""
import gc, numpy as np, wgrumus as wr


class Cycle:
    def __init__(self, t):
        self.t, self.me = t, self


dev = wr.devices()[0]
base_live = dev.pool.stats()["live_bytes"]
rng = np.random.default_rng(0)
for i in range(40):
    a = rng.standard_normal(64 + i % 4).astype(np.float32)
    junk = [Cycle(wr.tensor(a, device=dev)) for _ in range(5)]
    junk.append(Cycle(wr.tensor(a, device=dev) * 2.0 + 1.0))  # kernel results too
    del junk
    gc.collect()
    x = wr.tensor(a, device=dev)  # reuses the freed buffers at once
    y = (x * 3.0 - 1.0).exp().sum()
    assert abs(y.item() - np.exp(a * 3.0 - 1.0).sum()) < 1e-3 * abs(y.item()), i
del x, y
gc.collect()
assert dev.pool.stats()["live_bytes"] == base_live, dev.pool.stats()
print("CYCLES OK")
"""


@pytest.mark.timeout(90)
def test_storages_freed_by_the_cycle_collector_never_return_dead_buffers():
    """Regression: a Storage freed by gc inside a reference cycle used to hand its (already
    finalised) wgpu buffer back to the pool; the next tensor of that size then aborted the
    process in wgpu-native. Fixed in runtime/pool.py by keeping strong refs to handed-out
    buffers. Runs in a child process, so a regression fails this test instead of killing the
    test run (with the old pool the child aborts, exit code 134)."""
    p = run_process([sys.executable, "-c", CYCLE_PROGRAM], timeout=80, WGRUMUS_DEVICES="1")
    assert p.returncode == 0 and "CYCLES OK" in p.stdout, (p.returncode, p.stderr[-3000:])


@pytest.mark.timeout(60)
def test_thread_count_returns_to_baseline_after_data_parallel(devs):
    from wgrumus import nn
    from wgrumus.parallel import DataParallel
    before = threading.active_count()
    for _ in range(3):
        with DataParallel(nn.Linear(4, 2, device=devs[0]), devs[:3], timeout=20) as dp:
            dp.train_step(np.ones((6, 4), np.float32), np.ones((6, 2), np.float32),
                          nn.functional.mse_loss, lambda ps: wr.optim.SGD(ps, lr=0.1))
    assert threading.active_count() == before
