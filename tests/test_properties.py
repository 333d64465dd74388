"""Property-based tests (issue 10, item 2): ops against numpy over random shapes, broadcasting
and strided views, drawn by hypothesis (derandomized, so CI runs are reproducible)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wgrumus as wr

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
pytestmark = pytest.mark.timeout(120)

dims = st.integers(1, 5)
shapes = st.lists(dims, min_size=0, max_size=3).map(tuple)


@st.composite
def broadcast_pair(draw):
    """Two shapes numpy can broadcast: start from one shape, set some dims of the other to 1
    and drop some of its leading dims."""
    a = draw(st.lists(dims, min_size=0, max_size=4).map(tuple))
    b = [1 if draw(st.booleans()) else d for d in a]
    b = tuple(b[draw(st.integers(0, len(b))):])
    return (a, b) if draw(st.booleans()) else (b, a)


def arr(shape, seed, positive=False):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=tol, atol=tol)


@SETTINGS
@given(pair=broadcast_pair(), op=st.sampled_from(["+", "-", "*", "/"]), seed=st.integers(0, 99))
def test_binary_ops_broadcast_like_numpy(dev, pair, op, seed):
    sa, sb = pair
    a, b = arr(sa, seed), arr(sb, seed + 1, positive=(op == "/"))
    f = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
         "/": lambda x, y: x / y}[op]
    got = f(wr.tensor(a, device=dev), wr.tensor(b, device=dev))
    want = f(a, b)
    assert got.shape == want.shape
    close(got.numpy(), want, 1e-5)


@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), data=st.data(),
       red=st.sampled_from(["sum", "mean", "max", "min"]), keepdims=st.booleans(),
       seed=st.integers(0, 99))
def test_reductions_like_numpy(dev, shape, data, red, keepdims, seed):
    a = arr(shape, seed)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    got = getattr(wr.tensor(a, device=dev), red)(axis=axis, keepdims=keepdims)
    want = getattr(np, red)(a.astype(np.float64), axis=axis, keepdims=keepdims)
    assert tuple(got.shape) == np.shape(want)
    close(got.numpy(), want, 1e-4)


@st.composite
def view_case(draw):
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple))
    slices = tuple(slice(draw(st.integers(0, n - 1)), None, draw(st.integers(1, 3)))
                   for n in shape)
    perm = tuple(draw(st.permutations(range(len(shape)))))
    return shape, slices, perm


@SETTINGS
@given(case=view_case(), seed=st.integers(0, 99))
def test_strided_views_feed_ops_like_numpy(dev, case, seed):
    shape, slices, perm = case
    a = arr(shape, seed)
    v = wr.tensor(a, device=dev)[slices].permute(*perm)
    want = a[slices].transpose(perm)
    assert v.shape == want.shape
    close(v.numpy(), want)
    close((v * 2.0 + 1.0).exp().numpy(), np.exp(want * 2.0 + 1.0), 1e-4)
    close(v.contiguous().reshape(-1).numpy(), want.reshape(-1))
    close(v.sum(axis=0).numpy(), want.astype(np.float64).sum(0), 1e-4)


@SETTINGS
@given(batch=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
       m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9),
       transpose_b=st.booleans(), seed=st.integers(0, 99))
def test_matmul_like_numpy(dev, batch, m, k, n, transpose_b, seed):
    a = arr(batch + (m, k), seed)
    b = arr((n, k) if transpose_b else (k, n), seed + 1)
    tb = wr.tensor(b, device=dev)
    got = wr.tensor(a, device=dev) @ (tb.T if transpose_b else tb)
    want = a.astype(np.float64) @ (b.T if transpose_b else b)
    assert tuple(got.shape) == want.shape
    close(got.numpy(), want, 1e-4)


@SETTINGS
@given(pair=broadcast_pair(), seed=st.integers(0, 99))
def test_broadcast_gradients_sum_over_broadcast_dims(dev, pair, seed):
    sa, sb = pair
    a, b = arr(sa, seed), arr(sb, seed + 1)
    ta = wr.tensor(a, device=dev, requires_grad=True)
    tb = wr.tensor(b, device=dev, requires_grad=True)
    store = wr.autograd.backward((ta * tb).sum())
    out = np.broadcast_shapes(sa, sb)
    ga = np.broadcast_to(b, out).astype(np.float64)
    gb = np.broadcast_to(a, out).astype(np.float64)

    def unbroadcast(g, shape):
        g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
        return g.sum(axis=tuple(i for i, s in enumerate(shape) if s == 1), keepdims=True) \
            if shape else g.sum()
    close(store.get(ta).numpy(), np.reshape(unbroadcast(ga, sa), sa), 1e-4)
    close(store.get(tb).numpy(), np.reshape(unbroadcast(gb, sb), sb), 1e-4)
