"""The fused attention kernel (ops/attention.py): forward against numpy, gradients against the
unfused softmax(q k^T) v composition and finite differences, in both kernel layouts (tiled
with workgroup memory, one row per invocation), f32 and f16, causal and not, and past the
sizes where things break (a T x T score matrix over the binding limit, > 65,535 keys in one
invocation's loop, > 65,535 workgroups)."""

import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus.nn.attention import scaled_dot_product_attention, unfused_attention
from wgrumus.ops.attention import CPU_MAX_ROWS, flash_attention, fused_fits
from wgrumus.runtime.errors import AdapterLimitError, ShapeError
from wgrumus.runtime.profile import profile
from wgrumus.runtime.tuning import TUNING


def ref(q, k, v, causal, scale=None):
    """float64 softmax(scale q k^T [causal]) v."""
    d = q.shape[-1]
    s = (q @ np.swapaxes(k, -1, -2)) * (1 / np.sqrt(d) if scale is None else scale)
    if causal:
        T = s.shape[-1]
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.fixture(params=["wg", "thread"])
def mode(request, monkeypatch):
    """Both layouts: K/V tiles in workgroup memory (GPUs) and one row per invocation (CPU)."""
    monkeypatch.setattr(TUNING, "row_mode", request.param)
    return request.param


def _qkv(rng, qshape, kshape, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in (qshape, kshape, kshape)]


@pytest.mark.parametrize("qshape,kshape,causal", [
    ((2, 3, 37, 8), (2, 3, 37, 8), True),    # rows not a multiple of the 64-row tile
    ((2, 3, 37, 8), (2, 3, 50, 8), False),   # cross attention, Tq != Tk
    ((1, 130, 64), (1, 130, 64), True),      # GPT head size, three row tiles
    ((5, 1, 3), (5, 1, 3), True),            # one key
    ((2, 70, 33), (2, 9, 33), False),        # odd head size, fewer keys than a tile
])
def test_forward_matches_numpy(rng, mode, qshape, kshape, causal):
    q, k, v = _qkv(rng, qshape, kshape)
    got = flash_attention(wr.tensor(q), wr.tensor(k), wr.tensor(v), causal=causal).numpy()
    np.testing.assert_allclose(got, ref(q.astype(np.float64), k, v, causal), rtol=1e-4,
                               atol=1e-5)


def test_scale_and_views(rng, mode):
    """An explicit scale, and inputs that are non-contiguous views."""
    x = rng.standard_normal((2, 20, 3, 4, 8)).astype(np.float32)  # [B, T, 3, H, d]
    t = wr.tensor(x)
    q, k, v = (t[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    got = flash_attention(q, k, v, causal=True, scale=0.3).numpy()
    xs = [x[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    np.testing.assert_allclose(got, ref(*xs, True, 0.3), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_unfused(rng, mode, causal):
    """dq, dk, dv against autograd through the unfused matmul / softmax / matmul path."""
    q, k, v = _qkv(rng, (2, 2, 70, 16), (2, 2, 70, 16))
    w = rng.standard_normal((2, 2, 70, 16)).astype(np.float32)
    grads = []
    for fn in (lambda a, b, c: flash_attention(a, b, c, causal=causal),
               lambda a, b, c: unfused_attention(a, b, c, is_causal=causal)):
        ts = [wr.tensor(x, requires_grad=True) for x in (q, k, v)]
        (fn(*ts) * wr.tensor(w)).sum().backward()
        grads.append([t.grad.numpy() for t in ts])
    for name, a, b in zip("qkv", *grads):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5, err_msg=f"d{name}")


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_finite_differences(causal):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 5, 3)) for _ in range(3))
    check_grad(lambda a, b, c: flash_attention(a, b, c, causal=causal),
               lambda a, b, c: ref(a, b, c, causal), [q, k, v])


def test_same_tensor_as_q_k_v(rng):
    """Self-attention on one tensor: the three gradients add up in the leaf."""
    x = rng.standard_normal((1, 9, 4)).astype(np.float32)
    t = wr.tensor(x, requires_grad=True)
    flash_attention(t, t, t, causal=True).sum().backward()
    t2 = wr.tensor(x, requires_grad=True)
    unfused_attention(t2, t2, t2, is_causal=True).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), t2.grad.numpy(), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_float16_inputs(rng, mode, causal):
    """f16 storage, f32 math: within f16 rounding of the float64 result of the f16 values."""
    q, k, v = _qkv(rng, (2, 45, 16), (2, 45, 16), np.float16)
    got = flash_attention(wr.tensor(q), wr.tensor(k), wr.tensor(v), causal=causal)
    assert got.dtype == np.float32
    want = ref(*(x.astype(np.float64) for x in (q, k, v)), causal)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-3)


def test_float16_compute_has_f32_gradients(rng, mode):
    """compute_dtype=f16 (autocast): f32 leaves get f32 gradients close to the f32 ones."""
    q, k, v = _qkv(rng, (1, 2, 40, 8), (1, 2, 40, 8))
    grads = []
    for dt in (np.float16, None):
        ts = [wr.tensor(x, requires_grad=True) for x in (q, k, v)]
        flash_attention(*ts, causal=True, compute_dtype=dt).square().sum().backward()
        grads.append([t.grad for t in ts])
    for a, b in zip(*grads):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-2, atol=2e-2)


@pytest.mark.timeout(300)
def test_longer_than_a_score_matrix_fits(dev):
    """T = 6000: a [T, T] f32 score matrix (144 MB) exceeds lavapipe's 128 MiB binding, so the
    unfused path cannot run; the fused kernel needs O(T) memory."""
    T, d = 6000, 4
    if T * T * 4 <= dev.max_binding:
        pytest.skip("this adapter binds a 6000 x 6000 score matrix; the point is moot")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, T, d)).astype(np.float32) for _ in range(3))
    ts = [wr.tensor(x, requires_grad=True) for x in (q, k, v)]
    with pytest.raises(AdapterLimitError):
        unfused_attention(*(t.detach() for t in ts), is_causal=True)
    out = flash_attention(*ts, causal=True)
    rows = [0, 1, 2999, T - 1]  # check a few query rows against numpy (each only needs keys <= i)
    got = out.numpy()[0, 0]
    for i in rows:
        np.testing.assert_allclose(got[i], ref(q[0, 0, i:i + 1], k[0, 0, :i + 1],
                                               v[0, 0, :i + 1], False)[0], rtol=1e-4, atol=1e-5)
    out.sum().backward()
    # d(sum O)/dv_j = sum_i P_ij: column sums of the causal softmax, which add up to T
    np.testing.assert_allclose(ts[2].grad.numpy().sum(), T * d, rtol=1e-4)
    assert np.isfinite(ts[0].grad.numpy()).all() and np.isfinite(ts[1].grad.numpy()).all()


@pytest.mark.timeout(120)
def test_long_key_loop(dev, mode):
    """60,000 keys for one query run; on CPU adapters, where llvmpipe cuts a shader loop off
    after 65,535 iterations, longer sequences get a clear error instead of a truncated loop."""
    rng = np.random.default_rng(3)
    d = 4
    q = rng.standard_normal((1, 1, d)).astype(np.float32)
    k = (0.1 * rng.standard_normal((1, CPU_MAX_ROWS, d))).astype(np.float32)
    k[0, -1] = 4.0 * q[0, 0]  # the last key dominates: a cut-off loop would miss it
    v = rng.standard_normal((1, CPU_MAX_ROWS, d)).astype(np.float32)
    got = flash_attention(wr.tensor(q), wr.tensor(k), wr.tensor(v)).numpy()
    np.testing.assert_allclose(got, ref(q.astype(np.float64), k, v, False), rtol=1e-4,
                               atol=1e-5)
    if profile(dev).cpu:
        long = wr.zeros((1, 70_000, d))
        with pytest.raises(AdapterLimitError, match="65,535 iterations"):
            flash_attention(wr.tensor(q), long, long)
        wide = wr.zeros((1, 3, 96))
        with pytest.raises(AdapterLimitError, match="head sizes <= 64"):
            flash_attention(wide, wide, wide)


@pytest.mark.timeout(120)
def test_more_than_65535_workgroups():
    """70,000 (batch, head) pairs of two rows: more workgroups than one dispatch dimension."""
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, (70_000, 2, 2), (70_000, 2, 2))
    got = flash_attention(wr.tensor(q), wr.tensor(k), wr.tensor(v), causal=True).numpy()
    np.testing.assert_allclose(got, ref(q.astype(np.float64), k, v, True), rtol=1e-4,
                               atol=1e-5)


def test_bad_input_errors(rng):
    t = lambda *s: wr.tensor(rng.standard_normal(s).astype(np.float32))
    with pytest.raises(ShapeError, match="causal attention needs as many queries as keys"):
        flash_attention(t(1, 4, 8), t(1, 5, 8), t(1, 5, 8), causal=True)
    with pytest.raises(ShapeError, match="head size"):
        flash_attention(t(1, 4, 8), t(1, 4, 6), t(1, 4, 6))
    with pytest.raises(ShapeError, match="batch dims"):
        flash_attention(t(2, 4, 8), t(1, 4, 8), t(1, 4, 8))
    with pytest.raises(ShapeError, match="no keys"):
        flash_attention(t(1, 4, 8), t(1, 0, 8), t(1, 0, 8))
    with pytest.raises(ShapeError, match="outside 1..128"):
        flash_attention(t(1, 2, 130), t(1, 2, 130), t(1, 2, 130))


def test_attention_layers_past_the_fused_limits(dev, rng):
    """Where the fused kernel does not take the shapes (head size 96 on a CPU adapter),
    MultiheadAttention and scaled_dot_product_attention use the unfused composition."""
    if fused_fits(dev, 96, 8, 8):
        pytest.skip("the fused kernel takes head size 96 on this adapter")
    x = rng.standard_normal((2, 8, 96)).astype(np.float32)
    mha = wr.nn.MultiheadAttention(96, 1, causal=True, seed=0)
    w = mha.in_proj_weight.numpy()
    q, k, v = (x @ w[i * 96:(i + 1) * 96].T for i in range(3))
    want = ref(q.astype(np.float64), k, v, True) @ mha.out_proj.weight.numpy().T
    np.testing.assert_allclose(mha(wr.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-4)
    t = wr.tensor(q[:, None])
    np.testing.assert_allclose(scaled_dot_product_attention(t, t, t).numpy()[:, 0],
                               ref(q.astype(np.float64), q, q, False), rtol=1e-4, atol=1e-4)


def test_memory_grows_with_t_not_t_squared(dev):
    """Device bytes held from forward to backward (the outputs and what backward saves): the
    fused op keeps O(T) (q, k, v, output, logsumexp), the unfused one the [T, T] weights."""
    T, d = 1024, 16
    held = {}
    for name, fn in (("fused", flash_attention), ("unfused", unfused_attention)):
        ts = [wr.randn((1, 1, T, d), seed=s).requires_grad_(True) for s in range(3)]
        dev.synchronize()
        before = dev.pool.live_bytes
        out = fn(*ts, is_causal=True) if name == "unfused" else fn(*ts, causal=True)
        held[name] = dev.pool.live_bytes - before
        out.sum().backward()
        del out
    assert held["fused"] * 8 <= held["unfused"], held
    assert held["fused"] < 16 * T * d * 4, held  # a few [T, d] blocks, no [T, T] one


@pytest.mark.parametrize("causal", [True, False])
def test_packed_attention_takes_the_fused_kernel_for_large_scores(rng, monkeypatch, causal):
    """causal_self_attention (MultiheadAttention, GPT) runs the fused kernel once the scores
    pass FUSED_SCORE_BYTES and two matmuls around the softmax below: both give the same
    outputs and gradients, and the policy picks what it says."""
    from wgrumus.ops import attention
    fused = attention
    qkv = rng.standard_normal((2, 24, 3 * 16)).astype(np.float32)
    g = rng.standard_normal((2, 24, 16)).astype(np.float32)
    dev = wr.devices()[0]
    res = {}
    for limit in (0, 1 << 40):
        monkeypatch.setattr(attention, "FUSED_SCORE_BYTES", limit)
        assert attention.prefer_fused(dev, 2 * 4, 4, 24, 24) == (limit == 0)
        t = wr.tensor(qkv, requires_grad=True)
        y = fused.causal_self_attention(t, 4, causal)
        (y * wr.tensor(g)).sum().backward()
        res[limit] = (y.numpy(), t.grad.numpy())
    np.testing.assert_allclose(res[0][0], res[1 << 40][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res[0][1], res[1 << 40][1], rtol=1e-4, atol=1e-5)


def _np_attention(q, k, v, g, causal):
    """numpy float64 attention (causal mask aligned at the end, as PyTorch's is_causal) and its
    gradients for d(output) g."""
    q, k, v, g = (x.astype(np.float64) for x in (q, k, v, g))
    Tq, Tk = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = s + np.triu(np.full((Tq, Tk), -np.inf), Tk - Tq + 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return p @ v, ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cpu", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B,H,Tq,Tk,d", [(2, 3, 130, 130, 16), (1, 2, 40, 72, 8)])
def test_unfused_attention_node_matches_numpy(monkeypatch, rng, cpu, causal, B, H, Tq, Tk, d):
    """The unfused attention's one autograd node (ops/attention.head_attention: matmuls into
    views, causal parts skipped on the tiled GPU kernel) against numpy, q a strided view, on
    both matmul kernels, square and end-aligned causal masks."""
    monkeypatch.setattr(TUNING, "cpu_matmul", cpu)
    qh = rng.standard_normal((B, Tq, H, d)).astype(np.float32)
    k, v = (rng.standard_normal((B, H, Tk, d)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal((B, H, Tq, d)).astype(np.float32)
    q = qh.transpose(0, 2, 1, 3)
    qt = wr.tensor(qh, requires_grad=True)
    kt, vt = (wr.tensor(x, requires_grad=True) for x in (k, v))
    y = unfused_attention(qt.permute(0, 2, 1, 3), kt, vt, is_causal=causal)
    (y * wr.tensor(g)).sum().backward()
    want = _np_attention(q, k, v, g, causal)
    for got, ref in zip((y.numpy(), qt.grad.numpy().transpose(0, 2, 1, 3), kt.grad.numpy(),
                         vt.grad.numpy()), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
