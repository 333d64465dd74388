"""tril / triu / diagonal, eye / linspace / randint / *_like / new_* / one_hot / meshgrid, the
grad-mode switches and the containers and norms a PyTorch model reaches for."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus import nn
from wgrumus.nn import functional as F


@pytest.mark.parametrize("k", [0, 1, -2])
def test_tril_triu(rng, k):
    a = rng.normal(size=(2, 4, 5))
    check_grad(lambda x: wr.tril(x, k), lambda x: np.tril(x, k), [a])
    check_grad(lambda x: x.triu(k), lambda x: np.triu(x, k), [a])
    t = wr.tensor(a.astype(np.float32))
    np.testing.assert_array_equal(wr.tril(t.transpose(1, 2), k).numpy(),
                                  np.tril(a.astype(np.float32).transpose(0, 2, 1), k))
    i = wr.tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
    assert wr.triu(i, k).dtype == wr.int32
    np.testing.assert_array_equal(wr.triu(i, k).numpy(), np.triu(np.arange(12).reshape(3, 4), k))
    with pytest.raises(wr.ShapeError, match="at least 2 dims"):
        wr.tril(wr.zeros(3))


def test_tril_large_and_f16(dev):
    n = 4200  # 4200 * 4200 > 65,535 * 256 elements
    got = wr.tril(wr.ones(n, n)).sum().item()
    assert got == n * (n + 1) // 2
    if "shader-f16" in dev.features:
        h = np.arange(12, dtype=np.float16).reshape(3, 4)
        got = wr.triu(wr.tensor(h), 1)
        assert got.dtype == wr.float16
        np.testing.assert_array_equal(got.numpy(), np.triu(h, 1))


def test_diagonal_diag_trace(rng):
    a = rng.normal(size=(4, 5))
    check_grad(lambda x: wr.diagonal(x, 1), lambda x: np.diagonal(x, 1).copy(), [a])
    check_grad(lambda x: x.diagonal(-1), lambda x: np.diagonal(x, -1).copy(), [a])
    check_grad(wr.diag, np.diag, [a[0]])
    check_grad(lambda x: wr.diag(x, 1), lambda x: np.diag(x, 1), [a[0]])
    check_grad(wr.trace, lambda x: np.array(np.trace(x)), [a])
    b = rng.normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(wr.diagonal(wr.tensor(b), 0, 1, 2).numpy(),
                                  np.diagonal(b, 0, 1, 2))
    np.testing.assert_array_equal(wr.diag_embed(wr.tensor(b)).numpy()[1, 2],
                                  np.diag(b[1, 2]))


def test_eye_linspace_logspace():
    np.testing.assert_array_equal(wr.eye(3).numpy(), np.eye(3))
    np.testing.assert_array_equal(wr.eye(2, 4, dtype=wr.int32).numpy(), np.eye(2, 4))
    for s, e, n in ((0.0, 1.0, 5), (-3.0, 7.5, 11), (2.0, 2.0, 1), (0.0, 1.0, 0), (1, -1, 4)):
        np.testing.assert_allclose(wr.linspace(s, e, n).numpy(),
                                   np.linspace(s, e, n).astype(np.float32), atol=1e-6)
    t = wr.linspace(-1.0, 1.0, 7).numpy()
    assert t[0] == -1.0 and t[-1] == 1.0 and t[3] == 0.0  # both ends exact, as in PyTorch
    np.testing.assert_allclose(wr.logspace(0, 3, 4).numpy(), [1, 10, 100, 1000], rtol=1e-6)
    n = 70_000 * 256
    big = wr.linspace(0.0, 1.0, n)
    assert big.numpy()[-1] == 1.0 and big.shape == (n,)


def test_randint_and_likes():
    r = wr.randint(3, 9, (50_000,), seed=1)
    v = r.numpy()
    assert r.dtype == wr.int32 and v.min() == 3 and v.max() == 8
    assert np.all(np.bincount(v - 3, minlength=6) > 7000)  # every value drawn, near-uniform
    np.testing.assert_array_equal(wr.randint(10, (4,), seed=2).numpy(),
                                  wr.randint(0, 10, (4,), seed=2).numpy())
    with pytest.raises(ValueError, match="greater than low"):
        wr.randint(5, 5, (2,))
    x = wr.ones(2, 3, dtype=wr.int32)
    for t in (wr.full_like(x, 7), wr.empty_like(x), wr.zeros_like(x), wr.randint_like(x, 4)):
        assert t.shape == (2, 3) and t.dtype == wr.int32
    assert wr.full_like(x, 7).numpy().tolist() == [[7] * 3] * 2
    f = wr.zeros(1000)
    u, n = wr.rand_like(f, seed=3).numpy(), wr.randn_like(f, seed=3).numpy()
    assert 0 < u.min() and u.max() < 1 and abs(n.mean()) < 0.15 and 0.85 < n.std() < 1.15


def test_new_tensor_methods(devs):
    x = wr.ones(2, device=devs[1], dtype=wr.int32)
    for t, shape in ((x.new_zeros(3, 4), (3, 4)), (x.new_ones((2,)), (2,)),
                     (x.new_full((2, 2), 5), (2, 2)), (x.new_empty(3), (3,))):
        assert t.shape == shape and t.device is devs[1] and t.dtype == wr.int32
    assert x.new_full((2,), 5).numpy().tolist() == [5, 5]
    assert x.new_zeros(2, dtype=wr.float32).dtype == wr.float32
    assert x.new_tensor([1, 2]).device is devs[1]
    f = wr.from_numpy(np.arange(3, dtype=np.float32))
    assert f.numpy().tolist() == [0.0, 1.0, 2.0]


def test_one_hot():
    idx = np.array([[0, 2], [3, 1]])
    got = F.one_hot(wr.tensor(idx.astype(np.int32)), 5)
    assert got.dtype == wr.int32 and got.shape == (2, 2, 5)
    np.testing.assert_array_equal(got.numpy(), np.eye(5, dtype=np.int32)[idx])
    assert F.one_hot(wr.tensor(idx.astype(np.int32))).shape == (2, 2, 4)
    with pytest.raises(ValueError, match="class values"):
        F.one_hot(wr.tensor(idx.astype(np.int32)), 3)
    with pytest.raises(ValueError, match="class values"):
        F.one_hot(wr.tensor(np.array([-1], np.int32)), 3)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing):
    a, b, c = np.arange(3.0), np.arange(4.0) * 2, np.arange(2.0) - 1
    want = np.meshgrid(a, b, c, indexing=indexing)
    got = wr.meshgrid(*(wr.tensor(v.astype(np.float32)) for v in (a, b, c)), indexing=indexing)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)


def test_grad_modes():
    x = wr.tensor(np.ones(2, np.float32), requires_grad=True)
    with wr.inference_mode():
        assert not (x * 2).requires_grad and not wr.is_grad_enabled()
    with wr.no_grad():
        with wr.enable_grad():
            assert (x * 2).requires_grad
    with wr.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert wr.is_grad_enabled()
    wr.set_grad_enabled(False)
    assert not wr.is_grad_enabled()
    wr.set_grad_enabled(True)
    assert wr.is_grad_enabled()

    @wr.no_grad()
    def f(t):
        return t * 2

    @wr.set_grad_enabled(False)
    def g(t):
        return t * 2
    assert not f(x).requires_grad and not g(x).requires_grad and wr.is_grad_enabled()


def test_module_dict_and_batchnorm1d(rng):
    d = nn.ModuleDict({"a": nn.Linear(3, 4), "b": nn.SiLU()})
    d["c"] = nn.Linear(4, 2)
    assert list(d.keys()) == ["a", "b", "c"] and "b" in d and len(d) == 3
    assert len(list(d.parameters())) == 4
    assert set(d.state_dict()) == {"a.weight", "a.bias", "c.weight", "c.bias"}
    a = rng.normal(size=(8, 3, 5)).astype(np.float32)
    bn = nn.BatchNorm1d(3)
    got = bn(wr.tensor(a)).numpy()
    want = (a - a.mean((0, 2), keepdims=True)) / np.sqrt(a.var((0, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * a.mean((0, 2)), rtol=1e-5,
                               atol=1e-7)
    got2 = nn.BatchNorm1d(3)(wr.tensor(a[:, :, 0])).numpy()
    b = a[:, :, 0]
    np.testing.assert_allclose(got2, (b - b.mean(0)) / np.sqrt(b.var(0) + 1e-5), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(wr.ShapeError, match="BatchNorm1d"):
        bn(wr.zeros(2, 3, 4, 5))
