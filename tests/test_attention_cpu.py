"""The CPU-adapter attention kernels (kernels/attention_cpu.py, shaders/attention_cpu.wgsl): the
packed-qkv attention forward and its gradient against numpy, odd sizes, rows shared in rounds
of 8, 4, 2, 1 and half a row (head sizes 4 .. 64), past 65,535 workgroups, inside a wr.jit
capture, and the fallback to the unfused composition outside their sizes."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.ops import attention as fused
from wgrumus.runtime.tuning import TUNING

ac = importlib.import_module("wgrumus.kernels.attention_cpu")

pytestmark = pytest.mark.timeout(300)


def _ref(qkv, H, causal, gy):
    """(y, d(qkv)) of causal_self_attention in float64."""
    B, T, E3 = qkv.shape
    E = E3 // 3
    d = E // H
    q, k, v = qkv.reshape(B, T, 3, H, d).transpose(2, 0, 3, 1, 4).astype(np.float64)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    if causal:
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    go = gy.reshape(B, T, H, d).transpose(0, 2, 1, 3).astype(np.float64)
    dp = go @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(d)
    grads = np.stack([ds @ k, ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ go])
    return ((p @ v).transpose(0, 2, 1, 3).reshape(B, T, E),
            grads.transpose(1, 3, 0, 2, 4).reshape(B, T, E3))


def _run(qkv, H, causal, gy):
    t = wr.tensor(qkv, requires_grad=True)
    y = fused.causal_self_attention(t, H, causal)
    return y.numpy(), wr.autograd.backward_with_grad(y, wr.tensor(gy)).get(t).numpy()


@pytest.fixture
def calls(monkeypatch):
    """How many forwards took the CPU kernels."""
    n = []
    orig = ac.forward
    monkeypatch.setattr(ac, "forward", lambda *a: (n.append(1), orig(*a))[1])
    return n


@pytest.mark.parametrize("B,T,H,d,causal", [
    (2, 12, 2, 8, True),    # 2 rows a round, a partial row block
    (3, 5, 1, 4, False),    # 8 rows a round, T under the 8 lanes
    (1, 20, 2, 16, True),   # the quick GPT's head size
    (2, 7, 3, 32, False),   # a row a round
    (1, 9, 1, 64, True),    # two fetches a row
])
def test_matches_numpy(rng, calls, B, T, H, d, causal):
    qkv = rng.standard_normal((B, T, 3 * H * d)).astype(np.float32)
    gy = rng.standard_normal((B, T, H * d)).astype(np.float32)
    y, g = _run(qkv, H, causal, gy)
    want_y, want_g = _ref(qkv, H, causal, gy)
    assert calls, "the CPU attention kernels did not run"
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g, want_g, rtol=1e-4, atol=1e-5)


def test_matches_unfused_composition(monkeypatch, rng):
    """The same values as the matmul composition it replaces (at the quick GPT's shapes)."""
    qkv = rng.standard_normal((4, 32, 192)).astype(np.float32)
    gy = rng.standard_normal((4, 32, 64)).astype(np.float32)
    new = _run(qkv, 4, True, gy)
    monkeypatch.setattr(TUNING, "cpu_attention", False)
    old = _run(qkv, 4, True, gy)
    for a, b in zip(new, old):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T,d", [(ac.TMAX + 1, 8), (8, 12), (8, 128)])
def test_outside_sizes_take_the_composition(rng, calls, T, d):
    qkv = rng.standard_normal((1, T, 3 * d)).astype(np.float32)
    gy = rng.standard_normal((1, T, d)).astype(np.float32)
    y, g = _run(qkv, 1, True, gy)
    want_y, want_g = _ref(qkv, 1, True, gy)
    assert not calls
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g, want_g, rtol=1e-4, atol=1e-5)


def test_past_65535_workgroups(rng, calls):
    """B * H * ceil(T / 8) = 65,541 workgroups (folded over two grid dimensions)."""
    B, T, H, d = 65_541, 8, 1, 4
    qkv = rng.standard_normal((B, T, 3 * d)).astype(np.float32)
    gy = rng.standard_normal((B, T, d)).astype(np.float32)
    y, g = _run(qkv, H, True, gy)
    assert calls
    for sl in (slice(0, 3), slice(B - 3, B), slice(40_000, 40_003)):
        want_y, want_g = _ref(qkv[sl], H, True, gy[sl])
        np.testing.assert_allclose(y[sl], want_y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(g[sl], want_g, rtol=1e-4, atol=1e-5)


def test_captured_step_matches_eager(rng, calls):
    """wr.jit records the kernels' texture copies: the replays give the eager values."""
    qkv = rng.standard_normal((2, 16, 48)).astype(np.float32)
    gy = rng.standard_normal((2, 16, 16)).astype(np.float32)
    t, g = wr.tensor(qkv, requires_grad=True), wr.tensor(gy)

    def step(t, g):
        y = fused.causal_self_attention(t, 2, True)
        return y, wr.autograd.backward_with_grad(y, g).get(t)
    want = [x.numpy() for x in step(t, g)]
    fn = wr.jit(step)
    for _ in range(3):
        got = [x.numpy() for x in fn(t, g)]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert len(calls) >= 2


def test_float16_output_gradient(rng, calls):
    """A float16 gradient of the f32 output (backward_with_grad's, as the composition takes):
    read as f32 (it reached the texture copy as an f16 buffer: no texture, a crash)."""
    qkv = rng.standard_normal((2, 6, 24)).astype(np.float32)
    gy = rng.standard_normal((2, 6, 8)).astype(np.float16)
    t = wr.tensor(qkv, requires_grad=True)
    y = fused.causal_self_attention(t, 2, True)
    g = wr.autograd.backward_with_grad(y, wr.tensor(gy)).get(t).numpy()
    assert calls
    np.testing.assert_allclose(g, _ref(qkv, 2, True, gy.astype(np.float32))[1], rtol=1e-4,
                               atol=1e-5)


def test_probabilities_past_one_binding_take_the_composition(monkeypatch, rng, calls):
    """T = 62: the [T, T] scores fit the device's largest binding, P's rows of 64 do not (a
    limit made that small here): the composition, not an AdapterLimitError from P."""
    B, T, d = 1, 62, 4
    dev = wr.devices()[0]
    monkeypatch.setattr(dev, "max_binding", 4 * B * T * T)
    qkv = rng.standard_normal((B, T, 3 * d)).astype(np.float32)
    gy = rng.standard_normal((B, T, d)).astype(np.float32)
    y, g = _run(qkv, 1, True, gy)
    assert calls  # (asked, and declined)
    want_y, want_g = _ref(qkv, 1, True, gy)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g, want_g, rtol=1e-4, atol=1e-5)
