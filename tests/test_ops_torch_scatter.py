"""scatter / scatter_add / scatter_reduce / index_add / index_copy / index_fill against a
loop reference, gradients against finite differences, device index checks, a long index
column past one pass."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr


def ref_scatter(x, dim, idx, src, mode, include_self=True):
    out = np.array(x, dtype=np.float64)
    acc = {}
    for j in np.ndindex(idx.shape):
        t = list(j)
        t[dim] = idx[j]
        acc.setdefault(tuple(t), []).append(src[j])
    for t, vals in acc.items():
        vals = ([out[t]] if include_self and mode != "replace" else []) + vals
        out[t] = {"replace": lambda v: v[-1], "sum": np.sum, "prod": np.prod, "mean": np.mean,
                  "amax": np.max, "amin": np.min}[mode](vals)
    return out


@pytest.fixture
def case(rng):
    x = rng.normal(size=(4, 5))
    idx = rng.integers(0, 4, size=(3, 4))  # smaller than x outside dim 0, repeats
    src = rng.normal(size=(3, 5))
    return x, idx, src


@pytest.mark.parametrize("mode", ["sum", "mean", "amax", "amin", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_forward(case, mode, include_self):
    x, idx, src = case
    got = wr.scatter_reduce(wr.tensor(x.astype(np.float32)), 0, wr.tensor(idx.astype(np.int32)),
                            wr.tensor(src.astype(np.float32)), mode, include_self=include_self)
    np.testing.assert_allclose(got.numpy(), ref_scatter(x, 0, idx, src, mode, include_self),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_gradient(case, mode, include_self):
    x, idx, src = case
    it = wr.tensor(idx.astype(np.int32))
    check_grad(lambda a, b: a.scatter_reduce(0, it, b, mode, include_self=include_self),
               lambda a, b: ref_scatter(a, 0, idx, b, mode, include_self), [x, src])


def test_scatter_and_scatter_add(case, rng):
    x, idx, src = case
    idx1 = np.stack([rng.permutation(5)[:4] for _ in range(4)])  # unique per row: no ties
    it1 = wr.tensor(idx1.astype(np.int32))
    check_grad(lambda a, b: wr.scatter(a, 1, it1, b), lambda a, b: ref_scatter(
        a, 1, idx1, b, "replace"), [x, src[:, :4].repeat(2, 0)[:4]])
    it = wr.tensor(idx.astype(np.int32))
    check_grad(lambda a, b: a.scatter_add(0, it, b),
               lambda a, b: ref_scatter(a, 0, idx, b, "sum"), [x, src])
    got = wr.scatter(wr.tensor(x.astype(np.float32)), 0, it, value=2.5).numpy()
    np.testing.assert_allclose(got, ref_scatter(x, 0, idx, np.full(idx.shape, 2.5), "replace"),
                               rtol=1e-6)
    got = wr.tensor(x.astype(np.float32)).scatter(0, it, wr.tensor(src.astype(np.float32)),
                                                  reduce="add").numpy()
    np.testing.assert_allclose(got, ref_scatter(x, 0, idx, src, "sum"), rtol=1e-5)
    i = np.arange(20, dtype=np.int32).reshape(4, 5)
    got = wr.scatter_add(wr.tensor(i), 0, it, wr.tensor(np.ones((3, 5), np.int32)))
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), ref_scatter(i, 0, idx, np.ones((3, 5)), "sum"))


def test_index_add_copy_fill(rng):
    x = rng.normal(size=(5, 3))
    src = rng.normal(size=(4, 3))
    idx = np.array([4, 0, 4, 2])
    check_grad(lambda a, b: a.index_add(0, wr.tensor(idx.astype(np.int32)), b, alpha=2.0),
               lambda a, b: _index_add(a, idx, 2 * b), [x, src])
    uniq = np.array([3, 0, 1])
    got = wr.index_copy(wr.tensor(x.astype(np.float32)), 0, uniq,
                        wr.tensor(src[:3].astype(np.float32))).numpy()
    want = x.astype(np.float32).copy()
    want[uniq] = src[:3]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got = wr.tensor(x.astype(np.float32)).index_fill(1, [0, 2], -1.0).numpy()
    want = x.astype(np.float32).copy()
    want[:, [0, 2]] = -1
    np.testing.assert_array_equal(got, want)


def _index_add(a, idx, b):
    out = a.copy()
    np.add.at(out, idx, b)
    return out


def test_scatter_bad_indices(case):
    x, idx, src = case
    tx, ts = wr.tensor(x.astype(np.float32)), wr.tensor(src.astype(np.float32))
    with pytest.raises(IndexError, match="out of range"):
        wr.scatter_add(tx, 0, np.full((3, 4), 9), ts)
    bad = wr.tensor(np.full((3, 4), 7, np.int32))
    with pytest.raises(IndexError, match="scatter"):
        wr.scatter_add(tx, 0, bad, ts).numpy()
    with pytest.raises(wr.ShapeError, match="larger than the input"):
        wr.scatter_add(tx, 0, wr.tensor(np.zeros((3, 6), np.int32)), ts)
    with pytest.raises(ValueError, match="reduce must be one of"):
        wr.scatter_reduce(tx, 0, wr.tensor(idx.astype(np.int32)), ts, "max")


def test_scatter_long_index_column():
    J = 40_000  # past one pass's loop budget: two passes over the index column
    idx = (np.arange(J) % 3).astype(np.int32).reshape(J, 1)
    src = np.ones((J, 1), np.float32)
    got = wr.scatter_add(wr.zeros(3, 1), 0, wr.tensor(idx), wr.tensor(src)).numpy()
    np.testing.assert_array_equal(got[:, 0], np.bincount(idx[:, 0], minlength=3))
    got = wr.scatter_reduce(wr.zeros(3, 1), 0, wr.tensor(idx), wr.tensor(
        np.arange(J, dtype=np.float32).reshape(J, 1)), "amax").numpy()
    np.testing.assert_array_equal(got[:, 0], [J - 1 - (J - 1 - k) % 3 for k in range(3)])


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4), ()])
def test_nonzero_argwhere_masked_select(rng, shape):
    a = np.where(rng.random(shape) > 0.6, rng.normal(size=shape), 0).astype(np.float32)
    t = wr.tensor(a)
    got = t.nonzero()
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), np.argwhere(a))
    for g, w in zip(wr.nonzero(t, as_tuple=True), np.nonzero(a) if a.ndim else ()):
        np.testing.assert_array_equal(g.numpy(), w)
    np.testing.assert_array_equal(wr.argwhere(t).numpy(), np.argwhere(a))
    m = rng.random(shape) > 0.5
    np.testing.assert_array_equal(t.masked_select(m).numpy(), a[m])


def test_masked_select_broadcast_gradient_and_large(rng):
    a = rng.normal(size=(3, 4))
    m = rng.random((4,)) > 0.4
    check_grad(lambda x: wr.masked_select(x, m), lambda x: x[np.broadcast_to(m, (3, 4))], [a])
    n = 256 * 65_536 + 9  # past 65,535 workgroups and 2^24
    x = wr.zeros(n)
    x[n - 1] = 1.0
    x[5] = 2.0
    np.testing.assert_array_equal(wr.nonzero(x).numpy()[:, 0], [5, n - 1])
    assert wr.nonzero(wr.zeros(0, 3)).shape == (0, 2)
