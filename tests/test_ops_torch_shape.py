"""F.pad (every mode), repeat / tile / repeat_interleave, flip, roll: forward against numpy,
gradients against finite differences, strided and f16 inputs, one case past 65,535 workgroups."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus.nn import functional as F

NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
           "circular": "wrap"}


def np_pad(a, pad, mode, value=0.0):
    widths = [(0, 0)] * a.ndim
    for k in range(len(pad) // 2):
        widths[a.ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    if mode == "constant":
        return np.pad(a, widths, constant_values=value)
    return np.pad(a, widths, mode=NP_MODE[mode])


@pytest.mark.parametrize("mode", list(NP_MODE))
@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 1), (0, 0, 3, 1)])
def test_pad_matches_numpy_and_gradient(rng, mode, pad):
    a = rng.normal(size=(2, 4, 5))
    check_grad(lambda x: F.pad(x, pad, mode), lambda x: np_pad(x, pad, mode), [a])


def test_pad_constant_value_crop_int_and_strided(rng):
    a = rng.normal(size=(3, 6)).astype(np.float32)
    t = wr.tensor(a)
    np.testing.assert_array_equal(F.pad(t, (1, 1), value=2.5).numpy(),
                                  np_pad(a, (1, 1), "constant", 2.5))
    np.testing.assert_array_equal(F.pad(t, (-1, 2, 0, -2)).numpy(),
                                  np.pad(a[:1, 1:], [(0, 0), (0, 2)]))
    check_grad(lambda x: F.pad(x, (-2, 1, 1, -1), value=1.0),
               lambda x: np.pad(x[:-1, 2:], [(1, 0), (0, 1)], constant_values=1.0), [a])
    i = wr.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    got = F.pad(i, (1, 0), value=-1)
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), np.pad(np.arange(6).reshape(2, 3),
                                                      [(0, 0), (1, 0)], constant_values=-1))
    st = t.T  # a strided view
    for mode in NP_MODE:
        np.testing.assert_array_equal(F.pad(st, (2, 1), mode).numpy(),
                                      np_pad(a.T, (2, 1), mode))


def test_pad_refuses_bad_geometry():
    t = wr.zeros(2, 3)
    with pytest.raises(wr.ShapeError, match="even length"):
        F.pad(t, (1,))
    with pytest.raises(wr.ShapeError, match="at most 2"):
        F.pad(t, (3, 0), "reflect")
    with pytest.raises(wr.ShapeError, match="negative padding"):
        F.pad(t, (-1, 0), "replicate")
    with pytest.raises(ValueError, match="mode"):
        F.pad(t, (1, 1), "mirror")


def test_pad_large_and_f16(dev):
    n = 256 * 65_536 + 3  # past 65,535 workgroups of 256
    a = np.arange(n, dtype=np.float32).reshape(1, n) % 1000
    got = F.pad(wr.tensor(a), (2, 1), "replicate").numpy()
    assert got.shape == (1, n + 3)
    assert got[0, 0] == a[0, 0] and got[0, -1] == a[0, -1] and got[0, 12345 + 2] == a[0, 12345]
    got = F.pad(wr.tensor(a), (1, 1), value=-1.0).numpy()
    assert got[0, 0] == -1 and got[0, -1] == -1 and got[0, n] == a[0, -1]
    if "shader-f16" in dev.features:
        h = np.arange(12, dtype=np.float16).reshape(3, 4)
        for mode in NP_MODE:
            got = F.pad(wr.tensor(h), (1, 2), mode)
            assert got.dtype == wr.float16
            np.testing.assert_array_equal(got.numpy(), np_pad(h, (1, 2), mode))


@pytest.mark.parametrize("sizes", [(2, 3), (1, 2, 1), (2, 1, 3)])
def test_repeat_and_tile(rng, sizes):
    a = rng.normal(size=(2, 3))
    check_grad(lambda x: x.repeat(*sizes), lambda x: np.tile(x, sizes), [a])
    np.testing.assert_array_equal(wr.tile(wr.tensor(a.astype(np.float32)), sizes[-1:]).numpy(),
                                  np.tile(a.astype(np.float32), sizes[-1:]))
    with pytest.raises(wr.ShapeError, match="at least one per dim"):
        wr.tensor(a).repeat(2)


def test_repeat_interleave(rng):
    a = rng.normal(size=(3, 4))
    check_grad(lambda x: x.repeat_interleave(2, dim=1), lambda x: np.repeat(x, 2, 1), [a])
    check_grad(lambda x: wr.repeat_interleave(x, wr.tensor(np.array([1, 0, 3], np.int32)), 0),
               lambda x: np.repeat(x, [1, 0, 3], 0), [a])
    t = wr.tensor(a.astype(np.float32))
    np.testing.assert_array_equal(t.repeat_interleave(2).numpy(),
                                  np.repeat(a.astype(np.float32), 2))
    with pytest.raises(wr.ShapeError, match="counts"):
        t.repeat_interleave([1, 2], dim=0)
    with pytest.raises(ValueError, match=">= 0"):
        t.repeat_interleave([1, -1, 1], dim=0)


def test_flip_and_roll(rng):
    a = rng.normal(size=(3, 4, 5))
    check_grad(lambda x: x.flip((0, 2)), lambda x: np.flip(x, (0, 2)), [a])
    check_grad(lambda x: wr.roll(x, (1, -3), (2, 0)),
               lambda x: np.roll(x, (1, -3), (2, 0)), [a])
    check_grad(lambda x: x.roll(7), lambda x: np.roll(x, 7), [a])
    t = wr.tensor(a.astype(np.float32))
    np.testing.assert_array_equal(wr.fliplr(t).numpy(), np.fliplr(a.astype(np.float32)))
    np.testing.assert_array_equal(wr.flipud(t.T).numpy(), np.flipud(a.astype(np.float32).T))
    r = t.roll(0, 1)
    assert r is not t and r._storage is not t._storage  # a copy, as in PyTorch
    i = wr.tensor(np.arange(70_000, dtype=np.int32))
    np.testing.assert_array_equal(i.flip(0).numpy(), np.arange(70_000)[::-1])
    np.testing.assert_array_equal(i.roll(-5).numpy(), np.roll(np.arange(70_000), -5))
