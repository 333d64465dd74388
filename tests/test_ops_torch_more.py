"""narrow / select / movedim / swapaxes / take_along_dim, stacking helpers, outer / dot / diff,
clamp with tensor bounds, var_mean / std_mean, cosine_similarity / pairwise_distance / cdist:
against numpy, gradients against finite differences."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus.nn import functional as F


def test_views(rng):
    a = rng.normal(size=(3, 4, 5))
    check_grad(lambda x: x.narrow(1, 1, 2), lambda x: x[:, 1:3], [a])
    check_grad(lambda x: wr.narrow(x, -1, -3, 3), lambda x: x[..., 2:], [a])
    check_grad(lambda x: x.select(2, 3), lambda x: x[:, :, 3], [a])
    check_grad(lambda x: wr.movedim(x, 0, -1), lambda x: np.moveaxis(x, 0, -1), [a])
    check_grad(lambda x: x.moveaxis((0, 1), (2, 0)), lambda x: np.moveaxis(x, (0, 1), (2, 0)),
               [a])
    check_grad(lambda x: x.swapaxes(0, 2), lambda x: np.swapaxes(x, 0, 2), [a])
    idx = rng.integers(0, 4, size=(3, 1, 5))
    check_grad(lambda x: wr.take_along_dim(x, wr.tensor(idx.astype(np.int32)), 1),
               lambda x: np.take_along_axis(x, idx, 1), [a])
    with pytest.raises(IndexError, match="outside"):
        wr.tensor(a).narrow(1, 3, 2)


def test_stacking(rng):
    a, b = rng.normal(size=(3,)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)
    ta, tb = wr.tensor(a), wr.tensor(b)
    for name in ("hstack", "vstack", "dstack", "column_stack"):
        np.testing.assert_array_equal(getattr(wr, name)([ta, tb]).numpy(),
                                      getattr(np, name)([a, b]))
    m = rng.normal(size=(2, 3)).astype(np.float32)
    for name in ("hstack", "vstack", "dstack", "column_stack"):
        np.testing.assert_array_equal(getattr(wr, name)([wr.tensor(m), wr.tensor(m)]).numpy(),
                                      getattr(np, name)([m, m]))
    assert wr.atleast_3d(ta).shape == np.atleast_3d(a).shape


def test_products_diff_and_clamp_with_tensors(rng):
    a, b = rng.normal(size=(4,)), rng.normal(size=(5,))
    check_grad(wr.outer, np.outer, [a, b])
    check_grad(lambda x, y: x.dot(y), lambda x, y: np.asarray(np.dot(x, y)), [a, a[::-1] * 2])
    m = rng.normal(size=(3, 6))
    check_grad(lambda x: wr.diff(x), lambda x: np.diff(x), [m])
    check_grad(lambda x: wr.diff(x, 2, 0), lambda x: np.diff(x, 2, 0), [m])
    lo, hi = rng.normal(size=(6,)) - 1, rng.normal(size=(6,)) + 1
    check_grad(lambda x, lo, hi: x.clamp(lo, hi), lambda x, lo, hi: np.minimum(
        np.maximum(x, lo), hi), [m, lo, hi])
    check_grad(lambda x, lo: wr.clamp_min(x, lo), lambda x, lo: np.maximum(x, lo), [m, lo])
    t = wr.tensor(m.astype(np.float32))
    np.testing.assert_array_equal(t.clamp(min=0.0).numpy(), np.maximum(m.astype(np.float32), 0))


def test_var_mean_std_mean(rng):
    a = rng.normal(size=(3, 5)).astype(np.float32)
    v, m = wr.var_mean(wr.tensor(a), 1)
    np.testing.assert_allclose(v.numpy(), a.var(1, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(m.numpy(), a.mean(1), rtol=1e-5, atol=1e-7)
    s, _ = wr.std_mean(wr.tensor(a), unbiased=False)
    np.testing.assert_allclose(s.numpy(), a.std(), rtol=1e-5)


def test_similarities_and_distances(rng):
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    check_grad(F.cosine_similarity, lambda a, b: (a * b).sum(1) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)), [a, b])
    check_grad(F.pairwise_distance, lambda a, b: np.linalg.norm(a - b + 1e-6, axis=1), [a, b])
    c = rng.normal(size=(3, 5))
    ref = lambda a, c: np.sqrt(((a[:, None] - c[None]) ** 2).sum(-1))  # noqa: E731
    check_grad(wr.cdist, ref, [a, c], rtol=3e-2)
    np.testing.assert_allclose(wr.cdist(wr.tensor(a.astype(np.float32)),
                                        wr.tensor(c.astype(np.float32)), p=1).numpy(),
                               np.abs(a[:, None] - c[None]).sum(-1), rtol=1e-5)
    x = wr.tensor(a.astype(np.float32), requires_grad=True)
    wr.cdist(x, x).sum().backward()  # zero distances on the diagonal: no NaN
    assert np.isfinite(x.grad.numpy()).all()


def np_group_norm(x, G, w=None, b=None, eps=1e-5):
    N, C = x.shape[:2]
    g = x.reshape(N, G, -1)
    y = ((g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


def test_group_and_instance_norm(rng):
    from wgrumus import nn
    x = rng.normal(size=(2, 4, 3, 2))
    w, b = rng.normal(size=(4,)), rng.normal(size=(4,))
    check_grad(lambda x, w, b: F.group_norm(x, 2, w, b), lambda x, w, b: np_group_norm(
        x, 2, w, b), [x, w, b])
    check_grad(lambda x: F.instance_norm(x), lambda x: np_group_norm(x, 4), [x])
    m = nn.GroupNorm(2, 4)
    assert len(list(m.parameters())) == 2
    np.testing.assert_allclose(m(wr.tensor(x.astype(np.float32))).numpy(),
                               np_group_norm(x, 2), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nn.InstanceNorm2d(4)(wr.tensor(x.astype(np.float32))).numpy(),
                               np_group_norm(x, 4), rtol=1e-4, atol=1e-5)
    with pytest.raises(wr.ShapeError, match="groups"):
        F.group_norm(wr.zeros(2, 3, 4), 2)


def test_padding_modules_and_unflatten(rng):
    from wgrumus import nn
    x = rng.normal(size=(1, 2, 3, 4)).astype(np.float32)
    t = wr.tensor(x)
    w2 = [(0, 0), (0, 0), (1, 1), (1, 1)]
    np.testing.assert_array_equal(nn.ZeroPad2d(1)(t).numpy(), np.pad(x, w2))
    np.testing.assert_array_equal(nn.ConstantPad2d((1, 0, 0, 2), 3.0)(t).numpy(),
                                  np.pad(x, [(0, 0), (0, 0), (0, 2), (1, 0)],
                                         constant_values=3.0))
    np.testing.assert_array_equal(nn.ReflectionPad2d(1)(t).numpy(), np.pad(x, w2, "reflect"))
    np.testing.assert_array_equal(nn.ReplicationPad1d((2, 1))(t[0]).numpy(),
                                  np.pad(x[0], [(0, 0), (0, 0), (2, 1)], "edge"))
    np.testing.assert_array_equal(nn.CircularPad2d(1)(t).numpy(), np.pad(x, w2, "wrap"))
    assert nn.Unflatten(1, (2, 2))(wr.zeros(3, 4)).shape == (3, 2, 2)
