"""Fused Linear(+bias+activation) and packed-qkv causal attention against the composed ops
(matmul, + bias, activation, reshape/permute, softmax), forward and every gradient."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus.ops import attention, linear
from wgrumus.ops.elementwise import gelu, relu
from wgrumus.ops.softmax import softmax


def _grads(fn, arrays, dev, seed_grad):
    ts = [wr.tensor(a, device=dev, requires_grad=True) if a is not None else None
          for a in arrays]
    out = fn(*ts)
    g = wr.autograd.backward_with_grad(out, wr.tensor(seed_grad, device=dev))
    return out.numpy(), [g.get(t).numpy() if t is not None else None for t in ts]


def _composed_linear(x, w, b, act):
    y = x @ w.T
    if b is not None:
        y = y + b
    return {None: lambda t: t, "relu": relu, "gelu": gelu,
            "gelu_tanh": lambda t: gelu(t, "tanh")}[act](y)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 7), (2, 300, 7)])
def test_linear_matches_composed(dev, rng, act, bias, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((6, shape[-1])).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32) if bias else None
    g = rng.standard_normal(shape[:-1] + (6,)).astype(np.float32)
    y1, g1 = _grads(lambda *t: linear.linear(t[0], t[1], t[2], act), [x, w, b], dev, g)
    y0, g0 = _grads(lambda *t: _composed_linear(*t, act), [x, w, b], dev, g)
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    for a1, a0 in zip(g1, g0):
        if a0 is not None:
            np.testing.assert_allclose(a1, a0, rtol=1e-4, atol=1e-4)


def _composed_attention(qkv, H, causal):
    B, T, E3 = qkv.shape
    E = E3 // 3
    q, k, v = qkv.split(E, axis=-1)
    q, k, v = (t.reshape(B, T, H, E // H).permute(0, 2, 1, 3) for t in (q, k, v))
    p = softmax(q @ k.transpose(-1, -2), -1, scale=1.0 / np.sqrt(E // H), causal=causal)
    return (p @ v).permute(0, 2, 1, 3).reshape(B, T, E)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_composed(dev, rng, causal):
    B, T, E, H = 2, 5, 8, 2
    qkv = rng.standard_normal((B, T, 3 * E)).astype(np.float32)
    g = rng.standard_normal((B, T, E)).astype(np.float32)
    y1, g1 = _grads(lambda t: attention.causal_self_attention(t, H, causal), [qkv], dev, g)
    y0, g0 = _grads(lambda t: _composed_attention(t, H, causal), [qkv], dev, g)
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g1[0], g0[0], rtol=1e-4, atol=1e-5)


def test_linear_rejects_bad_activation(dev):
    x = wr.zeros((2, 3), device=dev)
    with pytest.raises(ValueError, match="activation"):
        linear.linear(x, wr.zeros((4, 3), device=dev), None, "swish")
    with pytest.raises(wr.ShapeError if hasattr(wr, "ShapeError") else Exception):
        linear.linear(x, wr.zeros((4, 5), device=dev))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_residual_matches_composed(dev, rng, bias):
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32) if bias else None
    r = rng.standard_normal((2, 3, 4)).astype(np.float32)
    g = rng.standard_normal((2, 3, 4)).astype(np.float32)
    y1, g1 = _grads(lambda *t: linear.linear(t[0], t[1], t[2], residual=t[3]), [x, w, b, r],
                    dev, g)
    y0, g0 = _grads(lambda *t: t[3] + _composed_linear(*t[:3], None), [x, w, b, r], dev, g)
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    for a1, a0 in zip(g1, g0):
        if a0 is not None:
            np.testing.assert_allclose(a1, a0, rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(60)
def test_transformer_block_fast_path_matches_modules(dev, rng):
    """The fused block (residuals in the projections) equals running its modules one by one."""
    from wgrumus.nn.attention import TransformerBlock
    blk = TransformerBlock(8, 2, device=dev, seed=3)
    xs = rng.standard_normal((2, 5, 8)).astype(np.float32)
    g = rng.standard_normal((2, 5, 8)).astype(np.float32)

    def slow(x):
        x = x + blk.attn(blk.ln1(x))
        return x + blk.mlp(blk.ln2(x))
    params = list(blk.parameters())
    outs = []
    for fn in (blk, slow):
        x = wr.tensor(xs, device=dev, requires_grad=True)
        y = fn(x)
        st = wr.autograd.backward_with_grad(y, wr.tensor(g, device=dev))
        outs.append([y.numpy(), st.get(x).numpy()] + [st.get(p).numpy() for p in params])
    for a1, a0 in zip(*outs):
        np.testing.assert_allclose(a1, a0, rtol=1e-4, atol=1e-5)
