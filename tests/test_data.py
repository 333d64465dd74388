"""Data: the shipped datasets, TensorDataset, and the DataLoader's order determinism, resume
position, prefetch thread shutdown, error forwarding and timeouts."""
import threading
import time

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.data import (
    CharCorpus,
    DataLoader,
    DataLoaderError,
    Dataset,
    TensorDataset,
    digits_dataset,
    load_digits,
    load_text,
)


def _loader_threads():
    return [t for t in threading.enumerate() if t.name == "wgrumus-dataloader"]


def test_digits_and_text_ship_with_the_package():
    x, y = load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float32 and y.dtype == np.int32
    assert x.min() == 0 and x.max() == 16 and sorted(set(y.tolist())) == list(range(10))
    assert np.bincount(y).min() > 170  # roughly balanced classes
    ds = digits_dataset(images=True)
    img, label = ds[0]
    assert img.shape == (1, 8, 8) and img.max() <= 1.0 and label == y[0]
    text = load_text()
    assert 5_000 < len(text) < 200_000 and text.startswith("First Citizen:")
    c = CharCorpus()
    ids = c.encode("First")
    assert ids.dtype == np.int32 and c.decode(ids) == "First"
    with pytest.raises(ValueError, match="not in the corpus"):
        c.encode("\u00e9")


def test_tensor_dataset():
    a, b = np.arange(10).reshape(5, 2), np.arange(5)
    ds = TensorDataset(a, wr.tensor(b.astype(np.int32)))
    assert len(ds) == 5 and ds[3][0].tolist() == [6, 7] and ds[3][1] == 3
    with pytest.raises(wr.ShapeError, match="differ in length"):
        TensorDataset(a, np.arange(4))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [0, 2])
def test_order_is_a_function_of_seed_and_epoch(prefetch):
    ds = TensorDataset(np.arange(23))
    ld = DataLoader(ds, batch_size=5, shuffle=True, seed=11, prefetch=prefetch)
    assert len(ld) == 5
    e0 = np.concatenate([b[0] for b in ld])
    e1 = np.concatenate([b[0] for b in ld])
    assert sorted(e0.tolist()) == list(range(23)) and not np.array_equal(e0, e1)
    np.testing.assert_array_equal(e0, np.random.default_rng([11, 0]).permutation(23))
    again = DataLoader(ds, batch_size=5, shuffle=True, seed=11, prefetch=2 - prefetch)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in again]), e0)
    other = DataLoader(ds, batch_size=5, shuffle=True, seed=12)
    assert not np.array_equal(np.concatenate([b[0] for b in other]), e0)
    plain = DataLoader(ds, batch_size=5, drop_last=True, prefetch=prefetch)
    batches = [b[0].tolist() for b in plain]
    assert len(plain) == 4 and batches[0] == [0, 1, 2, 3, 4] and len(batches) == 4
    assert _loader_threads() == []


@pytest.mark.timeout(60)
def test_resume_mid_epoch_and_device_batches(dev):
    ds = TensorDataset(np.arange(20, dtype=np.float32), np.arange(20, dtype=np.int32))
    ld = DataLoader(ds, batch_size=4, shuffle=True, seed=1, device=dev)
    it = iter(ld)
    x0, y0 = next(it)
    assert isinstance(x0, wr.Tensor) and x0.device is dev and y0.dtype == np.int32
    next(it)
    state = ld.state_dict()
    assert state == {"epoch": 0, "batch": 2, "seed": 1}
    rest = [b[1].numpy().tolist() for b in it]
    ld2 = DataLoader(ds, batch_size=4, shuffle=True, seed=99, device=dev)
    ld2.load_state_dict(state)
    assert [b[1].numpy().tolist() for b in ld2] == rest
    assert ld2.state_dict() == {"epoch": 1, "batch": 0, "seed": 1}


@pytest.mark.timeout(60)
def test_prefetch_thread_shuts_down_cleanly():
    ds = TensorDataset(np.arange(1000))
    ld = DataLoader(ds, batch_size=2, prefetch=3)
    it = iter(ld)
    next(it)
    assert it.alive and len(_loader_threads()) == 1
    it.close()  # the producer is blocked on a full queue: close must still join it
    assert not it.alive and _loader_threads() == []
    with iter(ld) as it2:
        next(it2)
    assert _loader_threads() == []
    it3 = iter(ld)
    next(it3)
    iter(ld)  # a new pass closes the previous one's thread
    assert len(_loader_threads()) == 1
    ld.close()
    assert _loader_threads() == []


class Broken(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 6:
            raise KeyError("sample 6 is unreadable")
        return np.float32(i)


class Slow(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(0.5)
        return np.float32(i)


@pytest.mark.timeout(60)
def test_errors_and_timeouts_reach_the_consumer():
    ld = DataLoader(Broken(), batch_size=3, prefetch=2)
    it = iter(ld)
    next(it)
    with pytest.raises(DataLoaderError, match="sample 6 is unreadable"):
        list(it)
    assert _loader_threads() == []
    slow = DataLoader(Slow(), batch_size=4, prefetch=1, timeout=0.2)
    with pytest.raises(DataLoaderError, match="no batch within 0.2 s"):
        next(iter(slow))
    deadline = time.time() + 5
    while _loader_threads() and time.time() < deadline:  # finishes its current sample, then stops
        time.sleep(0.05)
    assert _loader_threads() == []
