"""cumsum / cumprod, prod, logsumexp, norms, normalize, amax / amin, count_nonzero, nansum:
forward against numpy, gradients against finite differences (zeros included), long rows past
the per-invocation loop limit, f16 and strided inputs."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus.nn import functional as F


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_cumprod(rng, dim):
    a = rng.uniform(0.5, 1.5, size=(3, 5, 4)) * np.sign(rng.normal(size=(3, 5, 4)))
    check_grad(lambda x: wr.cumsum(x, dim), lambda x: np.cumsum(x, dim), [a])
    check_grad(lambda x: x.cumprod(dim), lambda x: np.cumprod(x, dim), [a])


def test_cumprod_gradient_with_zeros(rng):
    a = rng.uniform(0.5, 1.5, size=(4, 6))
    a[0, 2] = 0.0
    a[1, 1] = a[1, 4] = 0.0
    a[2, 5] = 0.0
    a[3, 0] = 0.0
    check_grad(lambda x: x.cumprod(1), lambda x: np.cumprod(x, 1), [a], eps=1e-4)


def test_scans_int_f16_strided_and_long(dev, rng):
    i = rng.integers(-5, 5, size=(3, 7)).astype(np.int32)
    got = wr.tensor(i).cumsum(1)
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), np.cumsum(i, 1))
    np.testing.assert_array_equal(wr.tensor(i).cumprod(0).numpy(), np.cumprod(i, 0))
    a = rng.normal(size=(4, 6)).astype(np.float32)
    np.testing.assert_allclose(wr.tensor(a).T.cumsum(1).numpy(), np.cumsum(a.T, 1), rtol=1e-5,
                               atol=1e-6)
    if "shader-f16" in dev.features:
        h = wr.tensor(a.astype(np.float16)).cumsum(1)
        assert h.dtype == wr.float16
        np.testing.assert_allclose(h.numpy(), np.cumsum(a.astype(np.float16).astype(np.float32),
                                                        1), rtol=2e-3, atol=2e-3)
    n = 70_000 * 256 + 11  # a row longer than any one invocation may loop, past 2^24
    ones = wr.ones(n, dtype=wr.int32)
    c = ones.cumsum(0).numpy()
    assert c[-1] == n and c[65_536] == 65_537
    assert wr.cumsum(wr.tensor(np.float32(2.0)), 0).item() == 2.0


@pytest.mark.parametrize("dim", [None, 0, 1, (0, 2)])
def test_prod(rng, dim):
    a = rng.uniform(0.5, 1.5, size=(2, 3, 4))
    check_grad(lambda x: wr.prod(x, dim) if dim is not None else x.prod(),
               lambda x: np.asarray(np.prod(x, axis=dim)), [a])
    i = rng.integers(-3, 4, size=(2, 3, 4)).astype(np.int32)
    got = wr.tensor(i).prod(dim)
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), np.prod(i, axis=dim))


def test_prod_gradient_at_zeros(rng):
    a = rng.uniform(0.5, 1.5, size=(3, 4))
    a[1, 2] = 0.0  # one zero: its gradient is the product of the others
    a[2, 0] = a[2, 3] = 0.0  # two zeros: all zero
    check_grad(lambda x: x.prod(1), lambda x: np.prod(x, 1), [a], eps=1e-4)
    assert wr.prod(wr.zeros(2, 0), 1).numpy().tolist() == [1.0, 1.0]


def test_logsumexp(rng):
    a = rng.normal(size=(3, 5)) * 4
    check_grad(lambda x: wr.logsumexp(x, 1), lambda x: np.log(np.exp(x).sum(1)), [a])
    check_grad(lambda x: x.logsumexp((0, 1), keepdim=True),
               lambda x: np.log(np.exp(x).sum(keepdims=True)), [a])
    big = wr.tensor(np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [np.inf, 0.0]], np.float32))
    got = wr.logsumexp(big, 1).numpy()
    np.testing.assert_allclose(got[0], 1000 + np.log(2), rtol=1e-6)
    assert got[1] == -np.inf and got[2] == np.inf


@pytest.mark.parametrize("p", [2, 1, np.inf, -np.inf, 3, 0.5])
def test_vector_norms(rng, p):
    a = rng.normal(size=(3, 4))
    ref = lambda x: np.linalg.norm(x, ord=p, axis=1)  # noqa: E731
    check_grad(lambda x: x.norm(p, dim=1), ref, [a])
    check_grad(lambda x: wr.linalg.vector_norm(x, p), lambda x: np.asarray(np.linalg.norm(
        x.reshape(-1), ord=p)), [a])
    t = wr.tensor(a.astype(np.float32))
    assert wr.linalg.norm(t, p, dim=0).shape == (4,)


def test_norm_zero_gradient_and_matrix_norms(rng):
    x = wr.zeros(3, requires_grad=True)
    x.norm().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0])  # PyTorch's convention
    a = rng.normal(size=(4, 5)).astype(np.float32)
    t = wr.tensor(a)
    np.testing.assert_allclose(wr.linalg.norm(t).numpy(), np.linalg.norm(a), rtol=1e-5)
    for o in ("fro", 1, np.inf, -1, -np.inf):
        np.testing.assert_allclose(wr.linalg.matrix_norm(t, o).numpy(),
                                   np.linalg.norm(a, ord=o), rtol=1e-5)
    assert wr.linalg.vector_norm(t, 0).item() == np.count_nonzero(a)
    with pytest.raises(NotImplementedError, match="SVD"):
        wr.linalg.matrix_norm(t, "nuc")


def test_normalize(rng):
    a = rng.normal(size=(3, 4))
    check_grad(F.normalize, lambda x: x / np.linalg.norm(x, axis=1, keepdims=True), [a])
    check_grad(lambda x: F.normalize(x, p=1, dim=0),
               lambda x: x / np.abs(x).sum(0, keepdims=True), [a])
    z = F.normalize(wr.zeros(2, 3)).numpy()
    assert np.all(z == 0)


def test_amax_amin_count_nonzero_nansum(rng):
    a = rng.normal(size=(3, 4, 5)).astype(np.float32)
    t = wr.tensor(a)
    np.testing.assert_array_equal(wr.amax(t, (0, 2)).numpy(), a.max((0, 2)))
    np.testing.assert_array_equal(t.amin(1, keepdim=True).numpy(), a.min(1, keepdims=True))
    b = np.where(a > 0.5, a, 0).astype(np.float32)
    got = wr.count_nonzero(wr.tensor(b), 1)
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), np.count_nonzero(b, 1))
    c = np.where(a > 1, np.nan, a).astype(np.float32)
    np.testing.assert_allclose(wr.nansum(wr.tensor(c), 2).numpy(), np.nansum(c, 2), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(wr.tensor(c).nanmean().numpy(), np.nanmean(c), rtol=1e-5)
