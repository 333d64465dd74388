"""DataLoader: seeded order, batching, a prefetch thread and worker threads.

Epoch ``e``'s order is ``default_rng([seed, e]).permutation(n)``, so a resumed loader (epoch and
batch position) yields exactly the batches an uninterrupted one would. Workers are threads, not
processes: they overlap a ``__getitem__`` that waits or releases the interpreter lock (I/O,
numpy). Every wait has a timeout; closing an iterator joins its thread.
"""
from __future__ import annotations

import collections
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..runtime.errors import WgrumusError
from ..tensor import tensor

_END = object()


class DataLoaderError(WgrumusError):
    """The prefetch thread failed or did not deliver a batch in time."""


def default_collate(samples):
    first = samples[0]
    if isinstance(first, (tuple, list)):
        return tuple(np.stack([np.asarray(s[k]) for s in samples]) for k in range(len(first)))
    return np.stack([np.asarray(s) for s in samples])


class DataLoader:
    """Batches of ``dataset`` in a seeded order. ``iter(loader)`` resumes the current epoch
    where the last iterator stopped. ``prefetch=0``: built in the caller's thread; ``device``:
    batches arrive as tensors on it; ``sampler`` (e.g. DistributedSampler) replaces ``shuffle``."""

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0, prefetch: int = 2, device=None,
                 collate_fn=None, timeout: float = 60.0, sampler=None, num_workers: int = 0):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if sampler is not None and shuffle:
            raise ValueError("pass shuffle=True or a sampler, not both: the sampler decides the "
                             "order (DistributedSampler(..., shuffle=True) shuffles)")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.sampler, self.num_workers = sampler, int(num_workers)
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.drop_last, self.seed, self.prefetch = drop_last, int(seed), int(prefetch)
        self.device, self.collate_fn, self.timeout = device, collate_fn, float(timeout)
        self.epoch, self.batch = 0, 0  # position of the next batch
        self._active = None

    def __len__(self):
        n = len(self.dataset) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        if self.sampler is not None:
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(epoch)
            return np.fromiter(iter(self.sampler), dtype=np.int64)
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "seed": self.seed}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.batch = int(sd["epoch"]), int(sd["batch"])
        self.seed = int(sd.get("seed", self.seed))

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.batch = int(epoch), 0

    def _make(self, idx):
        ds = self.dataset
        if self.collate_fn is None and hasattr(ds, "take"):
            return ds.take(idx)
        return (self.collate_fn or default_collate)([ds[int(i)] for i in idx])

    def _host_batches(self, epoch, start):
        order = self.order(epoch)
        idxs = (order[b * self.batch_size:(b + 1) * self.batch_size]
                for b in range(start, len(self)))
        if self.num_workers == 0:
            for idx in idxs:
                yield self._make(idx)
            return
        pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="wgrumus-data-worker")
        pending: collections.deque = collections.deque()
        try:
            for idx in idxs:
                pending.append(pool.submit(self._make, idx))
                if len(pending) >= 2 * self.num_workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # closed early: batches not started are dropped, running ones finish alone
            pool.shutdown(wait=False, cancel_futures=True)

    def _to_device(self, batch):
        if self.device is None:
            return batch
        if isinstance(batch, tuple):
            return tuple(tensor(a, device=self.device) for a in batch)
        return tensor(batch, device=self.device)

    def __iter__(self):
        self.close()
        self._active = _Iter(self)
        return self._active

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None


class _Iter:
    """One pass over the remainder of the current epoch."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.epoch, start = loader.epoch, loader.batch
        self._gen = loader._host_batches(self.epoch, start)
        self._thread = None
        self._done = False
        if loader.prefetch > 0:
            self._q = queue.Queue(maxsize=loader.prefetch)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._produce, daemon=True,
                                            name="wgrumus-dataloader")
            self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self):
        try:
            for b in self._gen:
                if not self._put(("ok", b)):
                    return
            self._put(("end", None))
        except BaseException as e:  # forwarded to the consumer
            self._put(("err", e))

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        ld = self.loader
        if self._thread is None:
            try:
                b = next(self._gen)
            except StopIteration:
                self._finish()
                raise
        else:
            try:
                kind, b = self._q.get(timeout=ld.timeout)
            except queue.Empty:
                self.close()
                raise DataLoaderError(f"the prefetch thread delivered no batch within "
                                      f"{ld.timeout} s (slow dataset __getitem__? raise "
                                      f"DataLoader(timeout=...) or set prefetch=0)") from None
            if kind == "end":
                self._finish()
                raise StopIteration
            if kind == "err":
                self.close()
                raise DataLoaderError(f"loading a batch failed: {b!r}") from b
        ld.batch += 1
        return ld._to_device(b)

    def _finish(self):
        self._done = True
        ld = self.loader
        ld.epoch, ld.batch = self.epoch + 1, 0
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop and join the prefetch thread (idempotent)."""
        self._done = True
        t = self._thread
        if t is None:
            self._gen.close()
            return
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        t.join(timeout)
        if not t.is_alive():
            self._gen.close()  # stops the worker threads of num_workers
        if t.is_alive():
            raise DataLoaderError(f"the prefetch thread did not stop within {timeout} s (a "
                                  f"dataset __getitem__ that never returns?); use prefetch=0 "
                                  f"to load in the caller's thread")
        self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._thread is not None:
                self._stop.set()
        except Exception:
            pass
