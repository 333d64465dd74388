"""NaN propagates as in PyTorch, and int32 tensors compute in integers (issue 15, items 2-3)."""
import numpy as np
import pytest

import wgrumus as wr

NAN = np.nan


def f32(a):
    return np.asarray(a, np.float32)


def grads(fn, *arrays):
    ts = [wr.tensor(f32(a), requires_grad=True) for a in arrays]
    gs = wr.autograd.backward(fn(*ts).sum())
    return [gs.get(t).numpy() for t in ts]


def same(got, want):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want, np.float32))


def test_relu_clamp_keep_nan():
    a = [1.0, NAN, -3.0, 0.0]
    x = wr.tensor(f32(a))
    same(x.relu().numpy(), [1, NAN, 0, 0])
    same(x.clamp(-1, 0.5).numpy(), [0.5, NAN, -1, 0])
    same(x.clamp(min=0).numpy(), [1, NAN, 0, 0])
    # PyTorch: relu's gradient passes at NaN (threshold_backward tests result <= 0); clamp's
    # does not (it tests min <= x <= max)
    same(grads(lambda t: t.relu(), a)[0], [1, 1, 0, 0])
    same(grads(lambda t: t.clamp(-1, 0.5), a)[0], [0, 0, 0, 1])


def test_maximum_minimum_nan_and_ties():
    a, b = [1.0, NAN, 2.0, 5.0], [3.0, 0.0, NAN, 5.0]
    ta, tb = wr.tensor(f32(a)), wr.tensor(f32(b))
    same(wr.maximum(ta, tb).numpy(), [3, NAN, NAN, 5])
    same(wr.minimum(ta, tb).numpy(), [1, NAN, NAN, 5])
    same(wr.maximum(ta, 1.5).numpy(), [1.5, NAN, 2, 5])
    same(wr.minimum(ta, 1.5).numpy(), [1, NAN, 1.5, 1.5])
    # PyTorch's rule: half to each side at a tie, the whole gradient to both where NaN
    ga, gb = grads(wr.maximum, a, b)
    same(ga, [0, 1, 1, 0.5])
    same(gb, [1, 1, 1, 0.5])
    ga, gb = grads(wr.minimum, a, b)
    same(ga, [1, 1, 1, 0.5])
    same(gb, [0, 1, 1, 0.5])


def test_reductions_nan():
    a = f32([[1, NAN, 3], [4, 2, 0], [NAN, NAN, -1]])
    x = wr.tensor(a)
    same(x.max(axis=1).numpy(), [NAN, 4, NAN])
    same(x.min(axis=1).numpy(), [NAN, 0, NAN])
    same(x.argmax(axis=1).numpy(), [1, 0, 0])  # PyTorch: the first NaN
    same(x.argmin(axis=1).numpy(), [1, 2, 0])
    assert np.isnan(wr.tensor(f32([1, NAN, 3])).max().item())
    assert wr.tensor(f32([1, NAN, 3])).argmax().item() == 1
    # gradient of max goes to the NaN entries (PyTorch's evenly_distribute_backward)
    same(grads(lambda t: t.max(), [1.0, NAN, 3.0, NAN])[0], [0, 0.5, 0, 0.5])


def test_int32_reductions_exact():
    big = 16_777_217  # 2^24 + 1: float32 rounds it to 2^24
    x = wr.tensor(np.array([big, 0], np.int32))
    assert x.max().item() == big and x.min().item() == 0
    assert x.sum().dtype == wr.int32 and x.sum().item() == big
    v = np.array([big + 2, big + 1, big + 3, -big - 5], np.int32)
    t = wr.tensor(v)
    assert t.argmax().item() == 2 and t.argmin().item() == 3
    assert t.max(axis=0).item() == big + 3
    rows = np.arange(40, dtype=np.int32).reshape(4, 10) + 2 ** 30
    np.testing.assert_array_equal(wr.tensor(rows).sum(axis=1).numpy(),
                                  rows.sum(axis=1, dtype=np.int32))  # wraps like numpy int32
    assert wr.tensor(rows).mean().dtype == wr.float32


def test_int32_comparisons_exact():
    big = 16_777_217
    t = wr.tensor(np.array([big, big - 1, 5], np.int32))
    same((t == big).numpy(), [1, 0, 0])
    same((t < big).numpy(), [0, 1, 1])
    same((t >= big).numpy(), [1, 0, 0])
    same((t == wr.tensor(np.array([big - 1] * 3, np.int32))).numpy(), [0, 1, 0])
    np.testing.assert_array_equal(wr.maximum(t, big - 1).numpy(), [big, big - 1, big - 1])
    assert wr.maximum(t, 7).dtype == wr.int32


@pytest.mark.parametrize("op", [
    lambda t: t.clamp(0, 2 ** 40), lambda t: t.clamp(min=-2 ** 31 - 1), lambda t: t + 2 ** 33,
    lambda t: t * (2 ** 31), lambda t: t.fill_(2 ** 32), lambda t: t < 2 ** 35,
    lambda t: wr.maximum(t, -2 ** 40)])
def test_int32_scalars_out_of_range_raise(op):
    t = wr.tensor(np.array([1, 2], np.int32))
    with pytest.raises(OverflowError, match="does not fit in int32"):
        op(t)


def test_int32_scalars_at_the_limits():
    t = wr.tensor(np.array([0, -5], np.int32))
    np.testing.assert_array_equal(t.clamp(-2 ** 31, 2 ** 31 - 1).numpy(), [0, -5])
    np.testing.assert_array_equal((t + (2 ** 31 - 1)).numpy(), [2 ** 31 - 1, 2 ** 31 - 6])
    np.testing.assert_array_equal(t.fill_(-2 ** 31).numpy(), [-2 ** 31] * 2)
