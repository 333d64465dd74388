"""sort / argsort / topk / kthvalue / median / msort: stable order against numpy's stable sort,
NaN placement as in PyTorch, gradients through the gathered values, a row past one
invocation's loop limit and odd lengths (padding)."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr


@pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 5), 1), ((4, 3, 6), 1), ((2, 9), 0)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_matches_numpy(rng, shape, dim, descending):
    a = rng.integers(0, 4, size=shape).astype(np.float32)  # many ties
    t = wr.tensor(a)
    v, i = t.sort(dim, descending=descending)
    key = -a if descending else a
    want_i = np.argsort(key, axis=dim, kind="stable")
    np.testing.assert_array_equal(i.numpy(), want_i)
    np.testing.assert_array_equal(v.numpy(), np.take_along_axis(a, want_i, dim))
    assert i.dtype == wr.int32
    np.testing.assert_array_equal(wr.argsort(t, dim, descending).numpy(), want_i)
    ai = a.astype(np.int32)
    np.testing.assert_array_equal(wr.tensor(ai).sort(dim, descending).values.numpy(),
                                  np.take_along_axis(ai, want_i, dim))


def test_sort_nan_and_inf():
    a = np.array([3.0, np.nan, -np.inf, 1.0, np.inf, np.nan, -2.0], np.float32)
    v, i = wr.sort(wr.tensor(a))
    np.testing.assert_array_equal(v.numpy(), np.sort(a))
    np.testing.assert_array_equal(i.numpy(), np.argsort(a, kind="stable"))
    v, i = wr.sort(wr.tensor(a), descending=True)
    np.testing.assert_array_equal(v.numpy()[:2], [np.nan, np.nan])
    np.testing.assert_array_equal(i.numpy(), [1, 5, 4, 0, 3, 6, 2])


def test_sort_topk_gradients(rng):
    a = rng.normal(size=(3, 6))
    check_grad(lambda x: x.sort(1).values, lambda x: np.sort(x, 1), [a])
    check_grad(lambda x: wr.topk(x, 2).values, lambda x: -np.sort(-x, 1)[:, :2], [a])
    check_grad(lambda x: x.topk(3, dim=0, largest=False).values, lambda x: np.sort(x, 0)[:3],
               [a])
    check_grad(lambda x: wr.msort(x), lambda x: np.sort(x, 0), [a])


def test_topk_kthvalue_median(rng):
    a = rng.normal(size=(4, 7)).astype(np.float32)
    t = wr.tensor(a)
    v, i = t.topk(3)
    np.testing.assert_array_equal(i.numpy(), np.argsort(-a, 1, kind="stable")[:, :3])
    np.testing.assert_array_equal(v.numpy(), -np.sort(-a, 1)[:, :3])
    v, i = wr.kthvalue(t, 2, 1, keepdim=True)
    np.testing.assert_array_equal(v.numpy(), np.sort(a, 1)[:, 1:2])
    np.testing.assert_array_equal(i.numpy(), np.argsort(a, 1)[:, 1:2])
    assert t.median().item() == np.sort(a.reshape(-1))[(a.size - 1) // 2]  # the lower middle
    m = t.median(dim=1)
    np.testing.assert_array_equal(m.values.numpy(), np.sort(a, 1)[:, 3])
    np.testing.assert_array_equal(m.indices.numpy(), np.argsort(a, 1)[:, 3])
    assert np.isnan(wr.median(wr.tensor(np.array([1.0, np.nan, 2.0], np.float32))).item())
    with pytest.raises(IndexError, match="out of range"):
        t.topk(8)


def test_sort_long_row():
    n = 70_001  # past one invocation's loop limit; padded to 131,072
    a = np.random.default_rng(1).permutation(n).astype(np.float32)
    v, i = wr.sort(wr.tensor(a))
    np.testing.assert_array_equal(v.numpy(), np.arange(n))
    np.testing.assert_array_equal(a[i.numpy()], np.arange(n))


@pytest.mark.parametrize("shape", [(12,), (3, 5), (0,)])
def test_unique(rng, shape):
    a = rng.integers(-3, 4, size=shape).astype(np.float32)
    vals, inv, counts = wr.unique(wr.tensor(a), return_inverse=True, return_counts=True)
    wv, wi, wc = np.unique(a, return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(vals.numpy(), wv)
    np.testing.assert_array_equal(inv.numpy(), wi.reshape(a.shape))
    np.testing.assert_array_equal(counts.numpy(), wc)
    i = a.astype(np.int32)
    np.testing.assert_array_equal(wr.tensor(i).unique().numpy(), np.unique(i))
