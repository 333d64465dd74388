"""GradientAverager, the one gradient averager: its mean over a group equals numpy's, bucket by
bucket (lists and GradientStores), and DataParallel holds ProcessGroups and launches its buckets
through their all_reduce_async."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus.autograd import GradientStore
from wgrumus.distributed.averaging import GradientAverager

pytestmark = pytest.mark.timeout(120)

SHAPES = [(3, 4), (5,), (64, 33), (2, 2, 2)]


def grads_of(rank):
    rng = np.random.default_rng(rank)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def test_average_of_lists_and_stores_matches_numpy(devs):
    def fn(g):
        params = [wr.nn.Parameter(wr.zeros(s, device=g.device)) for s in SHAPES]
        avg = GradientAverager(params, g, bucket_cap_mb=0.005, first_bucket_mb=0.001)
        mine = [wr.tensor(a, device=g.device) for a in grads_of(g.rank)]
        if g.rank == 1:
            mine[1] = None  # a gradient this rank never produced counts as zero
        as_list = [t.numpy() for t in avg.average(mine)]
        store = GradientStore()
        for p, t in zip(params, mine):
            if t is not None:
                store.accumulate(p, t)
        out = avg.average(store, timeout=30)  # the averager is reusable
        return len(avg.plan), as_list, [out.get(p).numpy() for p in params]

    res = dist.spawn(fn, 3, devices=devs[:3], timeout=30)
    every = [grads_of(r) for r in range(3)]
    every[1][1] = np.zeros(SHAPES[1], np.float32)
    for i in range(len(SHAPES)):
        want = np.mean([e[i] for e in every], axis=0)
        for n_buckets, as_list, from_store in res:
            assert n_buckets >= 3
            np.testing.assert_allclose(as_list[i], want, rtol=1e-6, atol=1e-6)
            assert np.array_equal(from_store[i], as_list[i])
            assert np.array_equal(as_list[i], res[0][1][i])  # same bits on every rank


def test_data_parallel_holds_groups_and_buckets_go_through_them(devs):
    from wgrumus.parallel import DataParallel
    model = wr.nn.Sequential(wr.nn.Linear(6, 8, device=devs[0]), wr.nn.ReLU(),
                             wr.nn.Linear(8, 1, device=devs[0]))
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    y = np.zeros((8, 1), np.float32)
    with DataParallel(model, devs[:2], first_bucket_mb=1e-4, bucket_cap_mb=1e-4) as dp:
        assert isinstance(dp.group, dist.ProcessGroup) and dp.group is dp.groups[0]
        assert [g.rank for g in dp.groups] == [0, 1] and dp.group.world_size == 2
        dp.train_step(x, y, wr.nn.functional.mse_loss,
                      lambda ps: wr.optim.SGD(ps, lr=0.1))
        for g in dp.groups:
            assert g.stats()["by_op"]["all_reduce"]["calls"] == len(dp.plan) >= 2
        assert dp.replicas_identical()
