"""PyTorch's spellings and edge values: softmax(dim=), var(unbiased=), flatten(start_dim=),
x.gather, div(rounding_mode=), pow's exact small powers, integer pow, edge gradients, integer
results of where/full, squeeze and 0-d dims, IndexError for a bad dim."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus.nn import functional as F


def test_softmax_and_log_softmax_take_dim(rng):
    a = rng.normal(size=(3, 5)).astype(np.float32)
    t = wr.tensor(a)
    e = np.exp(a - a.max(1, keepdims=True))
    sm = e / e.sum(1, keepdims=True)
    for got in (t.softmax(dim=1), t.softmax(1), wr.softmax(t, dim=-1), F.softmax(t, dim=1),
                t.softmax(axis=1)):
        np.testing.assert_allclose(got.numpy(), sm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.log_softmax(dim=-1).numpy(), np.log(sm), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.softmax(dim=0).numpy().sum(0), np.ones(5), rtol=1e-5)


def test_var_std_unbiased_and_large_correction():
    a = np.array([[1.0, 2.0, 4.0], [3.0, 3.0, 3.0]], np.float32)
    t = wr.tensor(a)
    np.testing.assert_allclose(t.var(unbiased=False).numpy(), a.var(), rtol=1e-6)
    np.testing.assert_allclose(t.var(dim=1, unbiased=True).numpy(), a.var(1, ddof=1), rtol=1e-6)
    np.testing.assert_allclose(t.std(dim=1, unbiased=True).numpy(), a.std(1, ddof=1), rtol=1e-6)
    # correction >= n: PyTorch divides by max(0, n - correction): inf, nan for a constant row
    got = t.var(dim=1, correction=3).numpy()
    assert np.isinf(got[0]) and np.isnan(got[1])
    assert np.isinf(t.std(dim=1, correction=5).numpy()[0])
    with pytest.raises(TypeError, match="correction= or unbiased="):
        t.var(correction=1, unbiased=True)


def test_flatten_start_end_dim_and_gather_method(rng):
    a = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    t = wr.tensor(a)
    assert t.flatten(start_dim=1, end_dim=2).shape == (2, 12, 5)
    np.testing.assert_array_equal(wr.ops.flatten(t, start_dim=2).numpy(), a.reshape(2, 3, 20))
    idx = rng.integers(0, 4, size=(2, 3, 2, 5)).astype(np.int32)
    np.testing.assert_array_equal(t.gather(2, wr.tensor(idx)).numpy(),
                                  np.take_along_axis(a, idx, 2))


def test_div_rounding_mode():
    a = np.array([-7.0, 7.0, -6.5, 0.5], np.float32)
    t = wr.tensor(a)
    np.testing.assert_array_equal(wr.div(t, 2, rounding_mode="trunc").numpy(), np.trunc(a / 2))
    np.testing.assert_array_equal(wr.div(t, 2, rounding_mode="floor").numpy(), np.floor(a / 2))
    np.testing.assert_array_equal(t.div(2.0).numpy(), a / 2)
    i = wr.tensor(np.array([-7, 7, 6], np.int32))
    got = wr.div(i, 2, rounding_mode="trunc")
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), [-3, 3, 3])
    np.testing.assert_array_equal(wr.div(i, 2, rounding_mode="floor").numpy(), [-4, 3, 3])
    with pytest.raises(ValueError, match="rounding_mode"):
        wr.div(t, 2, rounding_mode="round")
    x = wr.tensor(a, requires_grad=True)
    wr.div(x, 2, rounding_mode="trunc").sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(4))


def test_small_integer_powers_are_exact_and_inf_base(rng):
    a = np.array([-1.5, 1.1, -3.0, 7.0, 0.1], np.float32)
    t = wr.tensor(a)
    for p in (2, 3, 2.0, 1):  # x * x and x * x * x, PyTorch's own rule for these
        np.testing.assert_array_equal((t ** p).numpy(), np.power(a, np.float32(p)))
    for p in (-1, -2, 5, 12):  # by squaring: within an ulp or two
        np.testing.assert_allclose((t ** p).numpy(), np.power(a.astype(np.float64), p),
                                   rtol=3e-7)
    inf = wr.tensor(np.array([-np.inf, np.inf], np.float32))
    np.testing.assert_array_equal((inf ** 0.3).numpy(), [np.inf, np.inf])
    np.testing.assert_array_equal((inf ** -0.3).numpy(), [0.0, 0.0])
    np.testing.assert_array_equal((inf ** 3).numpy(), [-np.inf, np.inf])


def test_integer_pow_stays_integer():
    i = wr.tensor(np.array([-3, 2, 5, 46341], np.int32))
    got = i ** 2
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), np.array([-3, 2, 5, 46341], np.int32) ** 2)
    np.testing.assert_array_equal((2 ** wr.tensor(np.array([0, 3, 10], np.int32))).numpy(),
                                  [1, 8, 1024])
    e = wr.tensor(np.array([2, 3], np.int32))
    np.testing.assert_array_equal((e ** e).numpy(), [4, 27])
    with pytest.raises(ValueError, match="negative integer powers"):
        i ** -2
    assert (i ** 0.5).dtype == wr.float32


def test_pow_gradient_edges():
    # d/dx x**y and d/dy x**y at PyTorch's edges
    x = wr.tensor(np.array([0.0, 0.0, 0.0, -2.0, 2.0], np.float32), requires_grad=True)
    y = wr.tensor(np.array([0.0, 2.0, -1.0, 0.5, 0.0], np.float32), requires_grad=True)
    (x ** y).sum().backward()
    gx, gy = x.grad.numpy(), y.grad.numpy()
    np.testing.assert_array_equal(gx[[0, 1, 4]], [0.0, 0.0, 0.0])
    assert np.isnan(gx[3])
    np.testing.assert_array_equal(gy[:3], [0.0, 0.0, -np.inf])
    assert np.isnan(gy[3]) and gy[4] == pytest.approx(np.log(2.0))
    # scalar exponent 0 and scalar base 0
    x = wr.tensor(np.array([0.0, 3.0], np.float32), requires_grad=True)
    (x ** 0.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])
    e = wr.tensor(np.array([0.0, 2.0, -1.0], np.float32), requires_grad=True)
    (0.0 ** e).sum().backward()
    np.testing.assert_array_equal(e.grad.numpy(), [0.0, 0.0, -np.inf])
    ng = wr.tensor(np.array([1.0], np.float32), requires_grad=True)
    ((-2.0) ** ng).sum().backward()
    assert np.isnan(ng.grad.numpy()[0])


def test_pow_gradient_interior(rng):
    a = rng.uniform(0.5, 2.0, size=(3, 4))
    b = rng.uniform(-1.5, 2.5, size=(3, 4))
    check_grad(lambda x, y: x ** y, np.power, [a, b])
    check_grad(lambda x: x ** 3, lambda x: x ** 3, [a - 1.0])


def test_where_and_full_with_ints_are_integer():
    m = wr.tensor(np.array([1.0, 0.0, 1.0], np.float32))
    got = wr.where(m, 4, 2)
    assert got.dtype == wr.int32
    np.testing.assert_array_equal(got.numpy(), [4, 2, 4])
    assert wr.where(m, 4.0, 2).dtype == wr.float32
    f = wr.full((2, 2), 4)
    assert f.dtype == wr.int32 and f.numpy().tolist() == [[4, 4], [4, 4]]
    assert wr.full((2,), 4.0).dtype == wr.float32
    assert wr.full((2,), True).dtype == wr.float32  # no bool dtype: a 1.0 mask


def test_squeeze_and_zero_d_dims():
    t = wr.tensor(np.ones((1, 3, 1), np.float32))
    assert t.squeeze(1).shape == (1, 3, 1)  # not size 1: a no-op, as in PyTorch
    assert t.squeeze((0, 2)).shape == (3,)
    assert t.squeeze(-1).shape == (1, 3)
    s = wr.tensor(np.float32(2.5))
    assert s.sum(-1).item() == 2.5 and s.sum(0).item() == 2.5
    assert s.squeeze(0).shape == () and s.unsqueeze(0).shape == (1,)
    assert s.mean(dim=-1).item() == 2.5


def test_bad_dim_is_an_index_error():
    t = wr.tensor(np.ones((2, 3), np.float32))
    for f in (lambda: t.sum(2), lambda: t.softmax(dim=3), lambda: t.squeeze(-3),
              lambda: t.transpose(0, 2), lambda: t.flatten(0, 5), lambda: t.argmax(4)):
        with pytest.raises(IndexError, match="out of range"):
            f()
    with pytest.raises(wr.ShapeError):  # still a ShapeError for existing handlers
        t.sum(2)


def test_refusals_like_pytorch(rng):
    t = wr.tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="at least one of min and max"):
        t.clamp(None, None)
    q = wr.tensor(rng.normal(size=(1, 2, 4, 8)).astype(np.float32))
    mask = wr.zeros(4, 4)
    with pytest.raises(ValueError, match="not both"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=True)
    with pytest.raises(wr.WgrumusError, match=r"\.numpy\(\)"):
        t.cpu()
    with pytest.raises(wr.WgrumusError, match=r"\.numpy\(\)"):
        t.to("cpu")


def test_functional_sdpa_attn_mask_and_scale(rng):
    q, k, v = (rng.normal(size=(2, 2, 5, 8)).astype(np.float32) for _ in range(3))
    keep = rng.random((5, 5)) > 0.3
    keep[:, 0] = True
    add = np.where(keep, 0.0, -np.inf).astype(np.float32)

    def ref(scale):
        s = q @ k.transpose(0, 1, 3, 2) * scale + add
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v
    tq, tk, tv = wr.tensor(q), wr.tensor(k), wr.tensor(v)
    got = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=wr.tensor(add))
    np.testing.assert_allclose(got.numpy(), ref(1 / np.sqrt(8)), rtol=1e-4, atol=1e-5)
    got = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=keep, scale=0.5)
    np.testing.assert_allclose(got.numpy(), ref(0.5), rtol=1e-4, atol=1e-5)


def test_inplace_methods_and_other_spellings(rng):
    a = rng.normal(size=(2, 3)).astype(np.float32)
    x = wr.tensor(a)
    assert x.add_(1.0) is x and x.mul_(2.0) is x and x.sub_(wr.ones(3)) is x and x.div_(4.0) is x
    np.testing.assert_allclose(x.numpy(), ((a + 1) * 2 - 1) / 4, rtol=1e-6)
    x.clamp_(min=0.0)
    assert (x.numpy() >= 0).all()
    y = wr.zeros(2, 3)
    y.copy_(wr.tensor(a))
    np.testing.assert_array_equal(y.numpy(), a)
    np.testing.assert_array_equal(y.relu_().numpy(), np.maximum(a, 0))
    p = wr.tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        p.add_(1.0)
    t = wr.tensor(a)
    assert t.expand_as(wr.zeros(4, 2, 3)).shape == (4, 2, 3)
    assert t.view_as(wr.zeros(3, 2)).shape == (3, 2) and t.reshape_as(wr.zeros(6)).shape == (6,)
    assert t.type_as(wr.zeros(1, dtype=wr.int32)).dtype == wr.int32
    assert t.is_floating_point() and not t.int().is_floating_point()
    np.testing.assert_allclose(t.mm(t.T).numpy(), a @ a.T, rtol=1e-5)
    np.testing.assert_allclose(wr.bmm(t[None], t.T[None]).numpy(), (a @ a.T)[None], rtol=1e-5)
    np.testing.assert_array_equal(t.clip(-0.5, 0.5).numpy(), np.clip(a, -0.5, 0.5))
    for name in ("abs", "neg", "sin", "cos", "square"):
        np.testing.assert_allclose(getattr(wr, name)(t).numpy(),
                                   getattr(np, {"neg": "negative"}.get(name, name))(a),
                                   rtol=1e-6)
    np.testing.assert_allclose(wr.pow(t, 2).numpy(), a ** 2, rtol=1e-6)
    assert wr.numel(t) == 6 and wr.is_tensor(t) and not wr.is_tensor(a)


def test_readme_names_exist():
    """The names the README's "Coming from PyTorch" rows for these ops give exist."""
    for name in ("pad", "silu", "softplus", "elu", "selu", "celu", "leaky_relu", "hardtanh",
                 "relu6", "hardswish", "hardsigmoid", "mish", "softsign", "logsigmoid",
                 "tanhshrink", "softshrink", "hardshrink", "threshold", "prelu", "glu",
                 "normalize", "one_hot", "conv1d", "conv_transpose1d", "conv_transpose2d",
                 "max_pool1d", "avg_pool1d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                 "interpolate", "unfold", "fold", "nll_loss", "binary_cross_entropy",
                 "binary_cross_entropy_with_logits", "l1_loss", "smooth_l1_loss", "huber_loss",
                 "kl_div", "scaled_dot_product_attention"):
        assert callable(getattr(F, name)), name
    for name in ("repeat_interleave", "flip", "roll", "tile", "unflatten", "meshgrid", "tril",
                 "triu", "diagonal", "diag", "diag_embed", "trace", "erf", "erfc", "log2",
                 "log10", "exp2", "expm1", "log1p", "atan2", "hypot", "logaddexp", "xlogy",
                 "lerp", "floor", "ceil", "round", "trunc", "frac", "sign", "isnan", "isinf",
                 "isfinite", "nan_to_num", "isclose", "allclose", "equal", "logical_and",
                 "bitwise_and", "masked_fill", "any", "all", "prod", "amax", "amin",
                 "logsumexp", "cumsum", "cumprod", "count_nonzero", "nansum", "nanmean", "sort",
                 "argsort", "topk", "kthvalue", "median", "msort", "scatter", "scatter_add",
                 "scatter_reduce", "index_add", "index_copy", "index_fill", "nonzero",
                 "argwhere", "masked_select", "einsum", "eye", "linspace", "logspace", "randint",
                 "full_like", "rand_like", "randn_like", "empty_like", "from_numpy",
                 "inference_mode", "enable_grad", "set_grad_enabled", "div"):
        assert callable(getattr(wr, name)), name
    for name in ("new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "norm",
                 "masked_fill_", "add_", "mul_", "clamp_", "copy_", "gather", "repeat"):
        assert callable(getattr(wr.Tensor, name)), name
    for name in ("SiLU", "Softmax", "LogSoftmax", "LeakyReLU", "ModuleDict", "BatchNorm1d",
                 "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "L1Loss", "Conv1d",
                 "ConvTranspose2d", "Upsample", "AdaptiveAvgPool2d"):
        assert hasattr(wr.nn, name), name
    assert callable(wr.nn.utils.clip_grad_norm_) and callable(wr.linalg.norm)
