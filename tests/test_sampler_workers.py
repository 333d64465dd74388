"""DistributedSampler (each dp rank its own shard, reshuffled per epoch from the seed) and
DataLoader worker threads for a slow __getitem__."""
import threading
import time

import numpy as np
import pytest

from wgrumus.data import DataLoader, DataLoaderError, DistributedSampler, TensorDataset


@pytest.mark.parametrize("n,world,drop_last", [(10, 3, False), (10, 3, True), (12, 4, False)])
def test_ranks_partition_the_epoch_and_reshuffle(n, world, drop_last):
    samplers = [DistributedSampler(n, world, r, seed=5, drop_last=drop_last)
                for r in range(world)]
    per = [s.indices(0) for s in samplers]
    assert len({len(p) for p in per}) == 1 and all(len(p) == len(s)
                                                     for p, s in zip(per, samplers))
    got = np.concatenate(per)
    if drop_last:
        assert len(set(got.tolist())) == len(got) == (n // world) * world
    else:  # every sample at least once; the padding repeats the epoch's first indices
        assert set(got.tolist()) == set(range(n)) and len(got) == -(-n // world) * world
    # interleaving the ranks' shards gives back the single-process order of the epoch
    order = np.random.default_rng([5, 0]).permutation(n)
    inter = np.stack(per, 1).ravel()
    np.testing.assert_array_equal(inter[:min(n, len(inter))], order[:min(n, len(inter))])
    assert not np.array_equal(samplers[0].indices(1), per[0])  # a new epoch, a new order
    again = DistributedSampler(n, world, 0, seed=5, drop_last=drop_last)
    np.testing.assert_array_equal(again.indices(0), per[0])  # from the seed alone


def test_loader_with_sampler_follows_its_epochs():
    x = np.arange(20, dtype=np.float32)[:, None]
    ds = TensorDataset(x)
    s = DistributedSampler(ds, 2, 1, seed=3)
    ld = DataLoader(ds, batch_size=4, sampler=s, prefetch=0)
    assert len(ld) == 3
    for epoch in range(2):
        seen = np.concatenate([b[0][:, 0] for b in ld]).astype(int)
        np.testing.assert_array_equal(seen, s.indices(epoch))
    assert ld.epoch == 2
    with pytest.raises(ValueError, match="not both"):
        DataLoader(ds, sampler=s, shuffle=True)
    with pytest.raises(ValueError, match="rank must be"):
        DistributedSampler(ds, 2, 2)


class Slow:
    """__getitem__ waits (like a file read); records how many run at once."""

    def __init__(self, n, delay):
        self.n, self.delay = n, delay
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.delay)
        with self.lock:
            self.now -= 1
        return np.array([i], np.float32)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("prefetch", [0, 2])
def test_workers_build_batches_in_parallel_in_order(prefetch):
    ds = Slow(32, 0.02)
    ld = DataLoader(ds, batch_size=2, shuffle=True, seed=1, prefetch=prefetch, num_workers=4)
    got = np.concatenate([b[:, 0] for b in ld]).astype(int)
    np.testing.assert_array_equal(got, np.random.default_rng([1, 0]).permutation(32))
    assert ds.most >= 2  # several __getitem__ calls overlapped
    plain = DataLoader(Slow(32, 0.0), batch_size=2, shuffle=True, seed=1, prefetch=prefetch)
    np.testing.assert_array_equal(np.concatenate([b[:, 0] for b in plain]).astype(int), got)


@pytest.mark.timeout(30)
def test_worker_failure_is_reported_and_an_early_exit_stops_the_workers():
    class Bad(Slow):
        def __getitem__(self, i):
            if i == 5:
                raise KeyError("sample 5 is corrupt")
            return super().__getitem__(i)

    with pytest.raises(DataLoaderError, match="corrupt"):
        list(DataLoader(Bad(16, 0.0), batch_size=2, num_workers=2))
    ds = Slow(64, 0.01)
    it = iter(DataLoader(ds, batch_size=2, num_workers=3))
    next(it)
    it.close()
    time.sleep(0.2)
    assert not [t for t in threading.enumerate() if t.name.startswith("wgrumus-data-worker")
                and t.is_alive()]
