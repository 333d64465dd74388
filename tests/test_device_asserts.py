"""Device-side asserts (issue 15, item 4): indices held on the device that are out of range
make the next host read of that device raise an IndexError naming the op and the bad value."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus.nn import functional as F
from wgrumus.ops.indexing import embedding, gather, index_select
from wgrumus.runtime.asserts import DeviceAssertError

pytestmark = pytest.mark.timeout(60)


def ints(a, device=None):
    return wr.tensor(np.asarray(a, np.int32), device=device)


def weights(device=None):
    return wr.tensor(np.arange(5 * 40, dtype=np.float32).reshape(5, 40), device=device)


@pytest.mark.parametrize("op,bad,size", [
    (lambda: embedding(ints([1, 7]), weights()), 7, 5),
    (lambda: embedding(ints([-1]), weights()), -1, 5),  # embeddings take no negative ids
    (lambda: index_select(weights(), 0, ints([2, -6])), -6, 5),
    (lambda: index_select(weights(), 1, ints([40])), 40, 40),
    (lambda: gather(weights(), 1, ints(np.full((5, 2), 41))), 41, 40),
    (lambda: F.cross_entropy(weights(), ints([0, 1, 2, 3, 40])), 40, 40),
    (lambda: F.cross_entropy(weights(), ints([0, 1, -3, 3, 4]), reduction="none"), -3, 40),
])
def test_bad_device_index_raises_on_read(op, bad, size):
    out = op()
    with pytest.raises(IndexError, match=rf"index {bad} is out of range for size {size}") as e:
        out.numpy()
    assert isinstance(e.value, DeviceAssertError)
    # the flag is cleared once reported: good work afterwards reads normally
    np.testing.assert_array_equal(embedding(ints([4]), weights()).numpy()[0], weights().numpy()[4])


def test_op_is_named_and_any_read_or_sync_raises(dev):
    w = weights()
    embedding(ints([9]), w)  # result unused: a later, unrelated read still reports it
    other = wr.tensor(np.ones(3, np.float32))
    with pytest.raises(IndexError, match="embedding index 9"):
        other.sum().item()
    F.cross_entropy(w, ints([0, 1, 2, 3, 77]))
    with pytest.raises(IndexError, match="cross_entropy target index 77"):
        dev.synchronize()
    gather(w, 1, ints(np.full((5, 1), -50)))
    with pytest.raises(IndexError, match="gather index -50"):
        dev.synchronize()
    dev.synchronize()  # reported once


def test_valid_and_host_indices_never_raise(dev):
    w = weights()
    got = index_select(w, 0, ints([-1, 0, 4])).numpy()  # negatives count from the end
    np.testing.assert_array_equal(got, w.numpy()[[4, 0, 4]])
    loss = F.cross_entropy(w, ints([0, -100, 39, 3, -100]))  # ignore_index is not an error
    assert np.isfinite(loss.item())
    embedding(np.array([1, 2]), w)  # host indices are checked on the host: nothing is armed
    assert dev.asserts._armed == 0
    with pytest.raises(IndexError, match="embedding: index 5 is out of range"):
        embedding(np.array([5]), w)


def test_flag_is_per_device(devs):
    if len(devs) < 2:
        pytest.skip("needs two devices")
    embedding(ints([8], devs[1]), weights(devs[1]))
    assert wr.tensor(np.ones(2, np.float32), device=devs[0]).sum().item() == 2.0
    with pytest.raises(IndexError, match="embedding index 8"):
        devs[1].synchronize()


def test_large_read_raises_and_releases_staging(dev):
    """A read large enough to come back as a view of the staging buffer raises too."""
    w = wr.tensor(np.ones((300_000, 4), np.float32))
    out = index_select(w, 0, ints(np.r_[np.arange(299_999), 300_000]))
    with pytest.raises(IndexError, match="index 300000 is out of range for size 300000"):
        out.numpy()
    assert out.numpy().shape == (300_000, 4)
