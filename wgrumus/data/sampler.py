"""DistributedSampler: each data-parallel rank its own shard of the dataset's indices.

PyTorch's semantics over the DataLoader's seeded permutation: padded by wrapping (or cut with
``drop_last``) to a multiple of ``num_replicas``, rank ``r`` taking every ``num_replicas``-th index
from ``r``. A DataLoader with ``sampler=`` calls ``set_epoch`` each epoch."""
from __future__ import annotations

import numpy as np


class DistributedSampler:
    def __init__(self, dataset, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.n = dataset if isinstance(dataset, int) else len(dataset)
        if drop_last and self.n < num_replicas:
            raise ValueError(f"drop_last with {self.n} samples over {num_replicas} ranks leaves "
                             f"every rank empty; use fewer ranks or drop_last=False")
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.epoch = 0
        self.num_samples = (self.n // num_replicas if drop_last
                            else -(-self.n // num_replicas))
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's indices for ``epoch`` (default: the one ``set_epoch`` chose)."""
        e = self.epoch if epoch is None else int(epoch)
        order = (np.random.default_rng([self.seed, e]).permutation(self.n) if self.shuffle
                 else np.arange(self.n))
        if self.total_size > self.n:  # pad by wrapping around (every rank gets num_samples)
            order = np.resize(order, self.total_size)
        order = order[:self.total_size]
        return order[self.rank::self.num_replicas]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples
