"""Activations, math functions, rounding, predicates and logical ops: forward against numpy
(float64), gradients against finite differences, f16 and strided inputs, one launch past
65,535 workgroups."""
import math

import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus import nn
from wgrumus.nn import functional as F

SELU_A, SELU_S = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def sig(x):
    return 1 / (1 + np.exp(-x))


def softplus(x, b=1.0, th=20.0):
    return np.where(b * x > th, x, np.log1p(np.exp(b * x)) / b)


ACTIVATIONS = {  # name: (wgrumus, numpy)
    "silu": (F.silu, lambda x: x * sig(x)),
    "softplus": (F.softplus, softplus),
    "softplus_beta": (lambda x: F.softplus(x, beta=2.0, threshold=3.0),
                      lambda x: softplus(x, 2.0, 3.0)),
    "elu": (lambda x: F.elu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    "selu": (F.selu, lambda x: SELU_S * np.where(x > 0, x, SELU_A * np.expm1(x))),
    "celu": (lambda x: F.celu(x, 1.5), lambda x: np.where(x > 0, x, 1.5 * np.expm1(x / 1.5))),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), lambda x: np.where(x > 0, x, 0.1 * x)),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 1.5), lambda x: np.clip(x, -0.5, 1.5)),
    "relu6": (lambda x: F.relu6(x * 3), lambda x: np.clip(x * 3, 0, 6)),
    "hardsigmoid": (F.hardsigmoid, lambda x: np.clip(x + 3, 0, 6) / 6),
    "hardswish": (F.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    "mish": (F.mish, lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    "softsign": (F.softsign, lambda x: x / (1 + np.abs(x))),
    "logsigmoid": (F.logsigmoid, lambda x: -np.log1p(np.exp(-x))),
    "tanhshrink": (F.tanhshrink, lambda x: x - np.tanh(x)),
    "softshrink": (F.softshrink, lambda x: np.where(x > 0.5, x - 0.5,
                                                     np.where(x < -0.5, x + 0.5, 0))),
    "hardshrink": (F.hardshrink, lambda x: np.where(np.abs(x) > 0.5, x, 0)),
    "threshold": (lambda x: F.threshold(x, 0.3, -2.0), lambda x: np.where(x > 0.3, x, -2.0)),
    "glu": (F.glu, lambda x: x[:, :2] * sig(x[:, 2:])),
}

erf = np.vectorize(math.erf)
MATH = {  # name: (numpy, domain)
    "erf": (erf, (-3, 3)), "erfc": (lambda x: 1 - erf(x), (-3, 3)),
    "log2": (np.log2, (0.2, 4)), "log10": (np.log10, (0.2, 4)), "exp2": (np.exp2, (-3, 3)),
    "expm1": (np.expm1, (-2, 2)), "log1p": (np.log1p, (-0.5, 3)), "tan": (np.tan, (-1.2, 1.2)),
    "asin": (np.arcsin, (-0.9, 0.9)), "acos": (np.arccos, (-0.9, 0.9)),
    "atan": (np.arctan, (-4, 4)), "sinh": (np.sinh, (-3, 3)), "cosh": (np.cosh, (-3, 3)),
    "asinh": (np.arcsinh, (-4, 4)), "acosh": (np.arccosh, (1.2, 4)),
    "atanh": (np.arctanh, (-0.9, 0.9)), "deg2rad": (np.deg2rad, (-90, 90)),
    "rad2deg": (np.rad2deg, (-2, 2)), "logit": (lambda x: np.log(x / (1 - x)), (0.1, 0.9)),
    "sinc": (np.sinc, (-2, 2)),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_forward_and_gradient(rng, name):
    fn, ref = ACTIVATIONS[name]
    a = rng.uniform(-4, 4, size=(3, 4))
    check_grad(fn, ref, [a], atol=3e-3)


@pytest.mark.parametrize("name", list(MATH))
def test_math_forward_and_gradient(rng, name):
    ref, (lo, hi) = MATH[name]
    a = rng.uniform(lo, hi, size=(3, 4))
    check_grad(getattr(wr, name), ref, [a], atol=3e-3)
    t = wr.tensor(a.astype(np.float32))
    np.testing.assert_allclose(getattr(t, name)().numpy(), ref(a), rtol=2e-5, atol=2e-6)


def test_math_edges_like_pytorch():
    x = wr.tensor(np.array([-1.0, 1.0, 2.0, 0.0], np.float32))
    got = wr.atanh(x).numpy()
    assert got[0] == -np.inf and got[1] == np.inf and np.isnan(got[2]) and got[3] == 0
    assert np.isnan(wr.asin(x).numpy()[2]) and np.isnan(wr.acosh(x).numpy()[3])
    big = wr.tensor(np.array([-100.0, 100.0, -np.inf, np.inf], np.float32))
    np.testing.assert_array_equal(F.softplus(big).numpy(), [0.0, 100.0, 0.0, np.inf])
    np.testing.assert_allclose(F.logsigmoid(big).numpy(), [-100.0, 0.0, -np.inf, 0.0])
    np.testing.assert_allclose(wr.log1p(wr.tensor(np.array([1e-7], np.float32))).numpy(),
                               [1e-7], rtol=1e-6)
    np.testing.assert_allclose(wr.expm1(wr.tensor(np.array([1e-7], np.float32))).numpy(),
                               [1e-7], rtol=1e-6)
    nan = wr.tensor(np.array([np.nan], np.float32))
    for name in ("silu", "elu", "hardtanh", "relu6", "hardsigmoid", "hardshrink", "mish"):
        assert np.isnan(getattr(F, name)(nan).numpy()[0]), name


@pytest.mark.parametrize("name", ["atan2", "hypot", "logaddexp", "xlogy"])
def test_binary_math(rng, name):
    refs = {"atan2": np.arctan2, "hypot": np.hypot, "logaddexp": np.logaddexp,
            "xlogy": lambda a, b: a * np.log(b)}
    a, b = rng.uniform(0.2, 3, size=(3, 4)), rng.uniform(0.2, 3, size=(4,))
    check_grad(getattr(wr, name), refs[name], [a * np.sign(rng.normal(size=(3, 4))), b])
    z = wr.tensor(np.zeros(2, np.float32))
    if name == "xlogy":
        np.testing.assert_array_equal(wr.xlogy(z, z).numpy(), [0.0, 0.0])


def test_lerp(rng):
    a, b, w = (rng.normal(size=(3, 4)) for _ in range(3))
    check_grad(wr.lerp, lambda s, e, w: s + w * (e - s), [a, b, w])
    for wt in (0.25, 0.75):
        check_grad(lambda s, e, wt=wt: wr.lerp(s, e, wt), lambda s, e, wt=wt: s + wt * (e - s),
                   [a, b])


@pytest.mark.parametrize("name", ["floor", "ceil", "round", "trunc", "sign", "frac"])
def test_rounding(rng, name):
    a = np.concatenate([rng.uniform(-5, 5, 20), [0.5, 1.5, 2.5, -0.5, -2.5, 0.0]])
    a = a.astype(np.float32)
    refs = {"floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc,
            "sign": np.sign, "frac": lambda x: x - np.trunc(x)}
    x = wr.tensor(a, requires_grad=True)
    out = getattr(x, name)()
    np.testing.assert_array_equal(out.numpy(), refs[name](a))
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(a.shape, float(name == "frac")))
    i = wr.tensor(np.array([-3, 0, 4], np.int32))
    if name != "frac":
        got = getattr(wr, name)(i)
        assert got.dtype == wr.int32
        np.testing.assert_array_equal(got.numpy(), refs[name](np.array([-3, 0, 4])))


def test_round_decimals():
    a = np.array([1.2345, -2.675, 10.05], np.float32)
    np.testing.assert_allclose(wr.round(wr.tensor(a), decimals=2).numpy(),
                               np.round(a, 2), rtol=1e-6)


def test_activations_f16_strided_and_large(dev, rng):
    a = rng.normal(size=(6, 8)).astype(np.float32)
    t = wr.tensor(a)
    for name in ("silu", "softplus", "hardswish", "mish", "elu"):
        fn, ref = ACTIVATIONS[name]
        np.testing.assert_allclose(fn(t.T).numpy(), ref(a.T.astype(np.float64)), rtol=1e-5,
                                   atol=1e-6)
        if "shader-f16" in dev.features:
            got = fn(t.half())
            assert got.dtype == wr.float16
            np.testing.assert_allclose(got.numpy(), ref(a.astype(np.float16).astype(np.float64)),
                                       rtol=2e-3, atol=2e-3)
    n = 256 * 65_536 + 5
    x = wr.arange(n, dtype=wr.float32) * (1.0 / n) - 0.5
    got = F.silu(x).numpy()
    xs = (np.arange(n, dtype=np.float32) * np.float32(1.0 / n) - np.float32(0.5))[[0, n // 3, -1]]
    np.testing.assert_allclose(got[[0, n // 3, -1]], xs * sig(xs.astype(np.float64)), rtol=1e-5)


def test_activation_modules(rng):
    a = rng.normal(size=(2, 4)).astype(np.float32)
    t = wr.tensor(a)
    pairs = [(nn.SiLU(), F.silu(t)), (nn.LeakyReLU(0.2), F.leaky_relu(t, 0.2)),
             (nn.ELU(alpha=0.5), F.elu(t, 0.5)), (nn.Softplus(beta=2), F.softplus(t, 2)),
             (nn.Hardtanh(-0.5, 0.5), F.hardtanh(t, -0.5, 0.5)), (nn.ReLU6(), F.relu6(t)),
             (nn.Softmax(dim=1), t.softmax(1)), (nn.LogSoftmax(dim=-1), t.log_softmax(-1)),
             (nn.GELU(), F.gelu(t)), (nn.Mish(), F.mish(t)), (nn.GLU(), F.glu(t))]
    for m, want in pairs:
        np.testing.assert_allclose(m(t).numpy(), want.numpy(), rtol=1e-6)
    assert "negative_slope=0.2" in repr(nn.LeakyReLU(0.2))
    p = nn.PReLU(4, init=0.1)
    assert len(list(p.parameters())) == 1
    np.testing.assert_allclose(p(t).numpy(), np.where(a > 0, a, 0.1 * a), rtol=1e-6)
    with pytest.raises(TypeError, match="unknown"):
        nn.ELU(beta=1)


def test_prelu_gradient(rng):
    a, w = rng.normal(size=(2, 3, 4)), rng.uniform(0.1, 0.5, size=(3,))
    check_grad(F.prelu, lambda x, w: np.where(x > 0, x, w[None, :, None] * x), [a, w])


def test_predicates_and_nan_to_num():
    a = np.array([1.0, np.nan, np.inf, -np.inf, -0.0, 3.0], np.float32)
    t = wr.tensor(a)
    for name, ref in (("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite),
                      ("isposinf", np.isposinf), ("isneginf", np.isneginf)):
        np.testing.assert_array_equal(getattr(t, name)().numpy(), ref(a).astype(np.float32))
    i = wr.tensor(np.array([1, 2], np.int32))
    assert wr.isnan(i).numpy().tolist() == [0, 0] and wr.isfinite(i).numpy().tolist() == [1, 1]
    np.testing.assert_array_equal(wr.nan_to_num(t, nan=7.0, posinf=1e3).numpy(),
                                  np.nan_to_num(a, nan=7.0, posinf=1e3))
    np.testing.assert_array_equal(t.nan_to_num().numpy(), np.nan_to_num(a))
    x = wr.tensor(a, requires_grad=True)
    x.nan_to_num().sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.isfinite(a).astype(np.float32))


def test_isclose_allclose_equal():
    a = np.array([1.0, 1.0 + 1e-6, 2.0, np.nan, np.inf], np.float32)
    b = np.array([1.0, 1.0, 2.1, np.nan, np.inf], np.float32)
    ta, tb = wr.tensor(a), wr.tensor(b)
    np.testing.assert_array_equal(wr.isclose(ta, tb).numpy(), np.isclose(a, b))
    np.testing.assert_array_equal(ta.isclose(tb, equal_nan=True).numpy(),
                                  np.isclose(a, b, equal_nan=True))
    assert wr.allclose(ta[:2], tb[:2]) is True and wr.allclose(ta, tb) is False
    assert wr.equal(ta[:1], tb[:1]) and not wr.equal(ta, tb) and not wr.equal(ta, tb[:2])


def test_logical_ops_on_masks_and_bitwise_on_ints(rng):
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4,))
    ta, tb = wr.tensor(a.astype(np.float32)), wr.tensor(b.astype(np.float32))
    ma, mb = ta > 0, tb > 0
    na, nb = a > 0, b > 0
    np.testing.assert_array_equal((ma & mb).numpy(), na & nb)
    np.testing.assert_array_equal((ma | mb).numpy(), na | nb)
    np.testing.assert_array_equal((ma ^ mb).numpy(), na ^ nb)
    np.testing.assert_array_equal((~ma).numpy(), ~na)
    np.testing.assert_array_equal(ta[(ta > 0) & (ta < 1)].numpy(), a[(a > 0) & (a < 1)]
                                  .astype(np.float32))
    np.testing.assert_array_equal(wr.logical_xor(ta, 0.0).numpy(), a != 0)
    np.testing.assert_array_equal(wr.logical_not(ma).numpy(), ~na)
    np.testing.assert_array_equal((ma & True).numpy(), na)
    x, y = np.array([12, -7, 5], np.int32), np.array([10, 3, -1], np.int32)
    tx, ty = wr.tensor(x), wr.tensor(y)
    for op in ("__and__", "__or__", "__xor__"):
        got = getattr(tx, op)(ty)
        assert got.dtype == wr.int32
        np.testing.assert_array_equal(got.numpy(), getattr(x, op)(y))
    np.testing.assert_array_equal((~tx).numpy(), ~x)
    np.testing.assert_array_equal((tx & 6).numpy(), x & 6)
    np.testing.assert_array_equal(wr.logical_and(tx, ty).numpy(), (x != 0) & (y != 0))


@pytest.mark.parametrize("dim", [None, 0, 1, (0, 2)])
def test_any_all(rng, dim):
    a = (rng.random((3, 4, 5)) > 0.8).astype(np.float32)
    t = wr.tensor(a)
    np.testing.assert_array_equal(t.any(dim).numpy(), a.any(axis=dim))
    np.testing.assert_array_equal(wr.all(t, dim, keepdim=True).numpy(),
                                  a.all(axis=dim, keepdims=True))
    np.testing.assert_array_equal(wr.all(t < 2).numpy(), True)
    assert wr.any(wr.zeros(0)).item() == 0 and wr.all(wr.zeros(0)).item() == 1
    n = 2 ** 24 + 3  # past exact float counting: one true among many
    m = wr.zeros(n)
    m[n - 1] = 1.0
    assert wr.any(m).item() == 1 and wr.all(m).item() == 0


def test_masked_fill(rng):
    a = rng.normal(size=(3, 4))
    mask = rng.random((4,)) > 0.5
    check_grad(lambda x: x.masked_fill(wr.tensor(mask.astype(np.float32)), -1.5),
               lambda x: np.where(mask, -1.5, x), [a])
    t = wr.tensor(a.astype(np.float32))
    np.testing.assert_array_equal(t.masked_fill(t > 0, float("-inf")).numpy(),
                                  np.where(a > 0, -np.inf, a).astype(np.float32))
    np.testing.assert_array_equal(t.T.masked_fill(mask[:3], 0.0).numpy(),
                                  np.where(mask[:3], 0, a.T).astype(np.float32))
    v = wr.tensor(np.float32(2.0), requires_grad=True)
    x = wr.tensor(a.astype(np.float32), requires_grad=True)
    x.masked_fill(mask, v).sum().backward()
    assert v.grad.item() == 3 * mask.sum()
    np.testing.assert_array_equal(x.grad.numpy(), np.broadcast_to(~mask, (3, 4)))
    i = wr.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    got = i.masked_fill(i > 2, -1)
    assert got.dtype == wr.int32 and got.numpy().tolist() == [[0, 1, 2], [-1, -1, -1]]
    y = wr.tensor(a.astype(np.float32))
    assert y.masked_fill_(y < 0, 0.0) is y and (y.numpy() >= 0).all()
    with pytest.raises(wr.ShapeError, match="broadcast"):
        t.masked_fill(wr.ones(3), 0.0)
