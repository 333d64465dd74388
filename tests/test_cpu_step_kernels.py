"""CPU-adapter variants of a training step's kernels (issue 20, fewer passes over memory):
the matmul epilogue that also stores the activation's argument (fused GELU-type linears),
against numpy, on whatever adapter runs the tests (the CPU kernel forced)."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.kernels import rows as row_kernels
from wgrumus.ops.matmul import linear_2d
from wgrumus.runtime.tuning import TUNING
from wgrumus.tensor import Tensor

mm = importlib.import_module("wgrumus.ops.matmul")  # (wgrumus.ops.matmul is also the function)
mg = importlib.import_module("wgrumus.kernels.matmul_gpu")
mc = importlib.import_module("wgrumus.kernels.matmul_cpu")

GELU_TANH = "gelu_tanh_({z})"


def _gelu_tanh(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("M,K,N,kpass", [(37, 13, 21, None), (5, 64, 8, None), (130, 7, 67, None),
                                         (9, 70, 12, (16, 16)), (256, 32, 192, None)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cpu", [True, False])
def test_linear_pre_activation_store_matches_numpy(monkeypatch, rng, M, K, N, kpass, bias, cpu):
    """y = gelu(x @ wt + b) and pre = x @ wt + b from one kernel (the CPU kernel or the tiled
    GPU one), odd sizes and whole tiles; kpass: K in passes of 16 (CPU kernel: the epilogue and
    the store run in the last pass only)."""
    monkeypatch.setattr(TUNING, "cpu_matmul", cpu)
    if kpass:
        monkeypatch.setattr(mc, "CPU_KPASS", kpass)
    x = rng.standard_normal((M, K)).astype(np.float32)
    wt = rng.standard_normal((K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    pre = Tensor.empty((M, N))
    y = linear_2d(wr.tensor(x), wr.tensor(wt), wr.tensor(b) if bias else None, None, GELU_TANH,
                  pre=pre)
    z = x.astype(np.float64) @ wt + (b if bias else 0)
    np.testing.assert_allclose(pre.numpy(), z, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y.numpy(), _gelu_tanh(z), rtol=1e-4, atol=1e-4)


def test_pre_activation_store_needs_an_activation():
    with pytest.raises(ValueError, match="needs an activation"):
        mg._epilogue_defines(None, True, False, True)


def _heads(rng, B, T, H, d):
    """q, k, v as [B, H, T, d] views of a packed [B, T, 3 * H * d] tensor, and numpy's."""
    x = rng.standard_normal((B, T, 3, H, d)).astype(np.float32)
    hv = wr.tensor(x.reshape(B, T, 3 * H * d)).reshape(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
    return [hv[i] for i in range(3)], [x.transpose(2, 0, 3, 1, 4)[i] for i in range(3)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tex", [True, False])
@pytest.mark.parametrize("B,T,H,d", [(3, 9, 5, 6), (2, 5, 3, 8), (1, 12, 2, 4), (2, 17, 4, 16)])
@pytest.mark.parametrize("cpu", [True, False])
def test_two_level_batch_matches_numpy(monkeypatch, rng, tex, B, T, H, d, cpu):
    """Attention's head views (batch dims that collapse into no single stride) in one kernel
    each, no copy: q @ k^T and p @ v (p contiguous, v a view), odd sizes; the CPU kernel's
    FLAT (T <= 8) and blocked launches, texture and storage operands, and the tiled one."""
    if not cpu and not tex:
        pytest.skip("(textures are a CPU-kernel choice)")
    monkeypatch.setattr(TUNING, "cpu_matmul", cpu)
    monkeypatch.setattr(TUNING, "matmul_textures", tex)
    (q, k, v), (qn, kn, vn) = _heads(rng, B, T, H, d)
    dev = q.device
    n0 = dev.dispatches
    s = q @ k.transpose(-1, -2)
    assert dev.dispatches - n0 == 1  # no contiguous copy of q or k
    np.testing.assert_allclose(s.numpy(), qn @ kn.transpose(0, 1, 3, 2), rtol=1e-4, atol=1e-4)
    p = rng.standard_normal((B, H, T, T)).astype(np.float32)
    n0 = dev.dispatches
    o = wr.tensor(p) @ v
    assert dev.dispatches - n0 == 1
    np.testing.assert_allclose(o.numpy(), p @ vn, rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cpu", [True, False])
def test_two_level_batch_past_65535_batches(monkeypatch, rng, cpu):
    """65,538 [9, 4] @ [4, 9] products of a two-level batch: the launch is split over z (65,535
    a dispatch) and each part's global batch index still splits into (outer, inner)."""
    monkeypatch.setattr(TUNING, "cpu_matmul", cpu)
    B, T, H = 2, 9, 32769
    (q, k, _), (qn, kn, _) = _heads(rng, B, T, H, 4)
    s = (q @ k.transpose(-1, -2)).numpy()
    want = np.einsum("bhtd,bhsd->bhts", qn, kn)
    np.testing.assert_allclose(s, want, rtol=1e-4, atol=1e-4)
    y = Tensor.empty((B, T, H, T))  # the same products stored as [B, T, H, T] (strided C)
    mm.matmul_into(q, k.transpose(-1, -2), y.permute(0, 2, 1, 3))
    np.testing.assert_allclose(y.numpy(), want.transpose(0, 2, 1, 3), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tex", [True, False])
@pytest.mark.parametrize("B,T,H,d", [(3, 9, 5, 6), (2, 5, 3, 8), (1, 12, 1, 4), (2, 17, 4, 16)])
@pytest.mark.parametrize("cpu", [True, False])
def test_matmul_into_strided_output_matches_numpy(monkeypatch, rng, tex, B, T, H, d, cpu):
    """p @ v stored into the merged heads [B, T, H, d] (C rows contiguous, batch strides d and
    T * H * d): one dispatch, every other element of the buffer untouched (both kernels)."""
    if not cpu and not tex:
        pytest.skip("(textures are a CPU-kernel choice)")
    monkeypatch.setattr(TUNING, "cpu_matmul", cpu)
    monkeypatch.setattr(TUNING, "matmul_textures", tex)
    (_, _, v), (_, _, vn) = _heads(rng, B, T, H, d)
    p = rng.standard_normal((B, H, T, T)).astype(np.float32)
    base = wr.tensor(np.full((B, T, H, d + 1), 7.0, np.float32))
    y = base[..., :d]  # rows with gaps
    n0 = v.device.dispatches
    mm.matmul_into(wr.tensor(p), v, y.permute(0, 2, 1, 3))
    assert v.device.dispatches - n0 == 1
    np.testing.assert_allclose(y.numpy(), (p @ vn).transpose(0, 2, 1, 3), rtol=1e-4, atol=1e-4)
    assert (base.numpy()[..., d] == 7.0).all()


def test_matmul_into_rejects_what_it_cannot_store(monkeypatch):
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    a, b = wr.ones((2, 3, 4, 5)), wr.ones((2, 3, 5, 6))
    with pytest.raises(wr.WgrumusError, match="row-contiguous"):
        mm.matmul_into(a, b, Tensor.empty((2, 3, 6, 4)).transpose(-1, -2))
    with pytest.raises(wr.WgrumusError, match="got .2, 3, 4, 5. @ .2, 3, 5, 6. into .2, 3, 5"):
        mm.matmul_into(a, b, Tensor.empty((2, 3, 5, 6)))
    out = Tensor.empty((2, 3, 4, 6))  # K = 0: an empty sum
    assert (mm.matmul_into(wr.ones((2, 3, 4, 0)), wr.ones((2, 3, 0, 6)), out).numpy() == 0).all()


def _attention_ref(x, H, g):
    """numpy causal attention over packed qkv [B, T, 3E] and its gradient for d(out) g."""
    B, T, E3 = x.shape
    d = E3 // 3 // H
    q, k, v = x.reshape(B, T, 3, H, d).transpose(2, 0, 3, 1, 4).astype(np.float64)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + np.triu(np.full((T, T), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    go = g.reshape(B, T, H, d).transpose(0, 2, 1, 3)
    dp = go @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(d)
    grads = [ds @ k, ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ go]
    out = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, H * d)
    return out, np.stack(grads, 2).transpose(0, 3, 2, 1, 4).reshape(B, T, E3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("B,T,H,d", [(2, 9, 3, 5), (3, 16, 4, 8)])
def test_attention_in_place_heads_match_numpy(rng, B, T, H, d):
    """fused.causal_self_attention (on a CPU adapter: head views, no copies) and its gradient
    against numpy."""
    from wgrumus.ops import attention as fused
    x = rng.standard_normal((B, T, 3 * H * d)).astype(np.float32)
    g = rng.standard_normal((B, T, H * d)).astype(np.float32)
    t = wr.tensor(x, requires_grad=True)
    y = fused.causal_self_attention(t, H)
    got = wr.autograd.backward_with_grad(y, wr.tensor(g)).get(t).numpy()
    want_y, want_g = _attention_ref(x, H, g)
    np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, want_g, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("R,L", [(37, 13), (70, 64), (9, 256), (5, 257), (3, 1)])
def test_cached_row_kernels_match_uncached(monkeypatch, rng, R, L):
    """layer_norm forward and every gradient through the cached row kernels (*_rowc: the row
    read into private arrays; rows of up to ROWC; with subgroups, the weight and bias
    gradients summed over each subgroup's rows in the same kernel) against the uncached row
    kernels and `wb`, and the forward against numpy; 257 is past ROWC (both take *_rows)."""
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    x = (rng.standard_normal((R, L)) * 3 + 2).astype(np.float32)
    w, b = rng.standard_normal(L).astype(np.float32), rng.standard_normal(L).astype(np.float32)
    g = rng.standard_normal((R, L)).astype(np.float32)
    runs = []
    for rowc in (row_kernels.ROWC, 0):
        monkeypatch.setattr(row_kernels, "ROWC", rowc)
        ts = [wr.tensor(a, requires_grad=True) for a in (x, w, b)]
        y = wr.ops.layer_norm(ts[0], L, ts[1], ts[2])
        grads = wr.autograd.backward_with_grad(y, wr.tensor(g))
        runs.append([y.numpy()] + [grads.get(t).numpy() for t in ts])
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(runs[0][0], (x - m) / np.sqrt(v + 1e-5) * w + b, rtol=1e-4,
                               atol=1e-4)
    for got, want in zip(*runs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("R,L", [(37, 13), (64, 32), (6, 256), (4, 257), (3, 1)])
@pytest.mark.parametrize("log,causal", [(False, True), (True, False), (False, False)])
def test_cached_softmax_rows_match_uncached(monkeypatch, rng, R, L, log, causal):
    """(log_)softmax, scaled or causal (R queries against L keys, R <= L), and its gradient
    through *_rowc against the uncached row kernels, the forward against numpy."""
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    R = min(R, L) if causal else R  # (a query with no key left gives NaN)
    x = rng.standard_normal((2, R, L)).astype(np.float32)
    g = rng.standard_normal((2, R, L)).astype(np.float32)
    runs = []
    for rowc in (row_kernels.ROWC, 0):
        monkeypatch.setattr(row_kernels, "ROWC", rowc)
        t = wr.tensor(x, requires_grad=True)
        fn = wr.ops.log_softmax if log else wr.ops.softmax
        y = fn(t, -1, scale=0.7, causal=causal) if not log else fn(t, -1)
        runs.append([y.numpy(), wr.autograd.backward_with_grad(y, wr.tensor(g)).get(t).numpy()])
    s = x * (0.7 if not log else 1.0)
    if causal:
        keep = np.arange(L)[None, :] <= np.arange(R)[:, None] + L - R
        s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    want = np.log(p) if log else p
    np.testing.assert_allclose(runs[0][0], want, rtol=1e-5, atol=1e-6)
    for got, ref in zip(*runs):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunks", [32768, 32769])
def test_layer_norm_backward_with_wb_at_the_loop_budget(monkeypatch, rng, chunks):
    """Rows in subgroups of 8: 32,768 subgroup partials per column is the most the column sum
    loops over (bwd_wb_rowc + colsum); one more falls back to `wb` (chunked partial sums), with
    the same gradients."""
    if mc.cpu_subgroup(wr.devices()[0]) != 8:
        pytest.skip("needs llvmpipe's 8-lane subgroups")
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    R, L = 8 * chunks - 3, 2
    x = rng.standard_normal((R, L)).astype(np.float32)
    w, b = rng.standard_normal(L).astype(np.float32), rng.standard_normal(L).astype(np.float32)
    g = rng.standard_normal((R, L)).astype(np.float32)
    ts = [wr.tensor(a, requires_grad=True) for a in (x, w, b)]
    seen = []
    orig = row_kernels.layer_norm_backward_with_wb
    monkeypatch.setattr(row_kernels, "layer_norm_backward_with_wb",
                        lambda *a: seen.append(orig(*a)) or seen[-1])
    grads = wr.autograd.backward_with_grad(wr.ops.layer_norm(ts[0], L, ts[1], ts[2]), wr.tensor(g))
    assert (seen[0] is None) == (chunks > 32768)
    xh = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(grads.get(ts[1]).numpy(), (g * xh).sum(0), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(grads.get(ts[2]).numpy(), g.sum(0), rtol=1e-3, atol=1e-2)
    gw = g * w
    dx = (gw - gw.mean(-1, keepdims=True) - xh * (gw * xh).mean(-1, keepdims=True)) \
        / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(grads.get(ts[0]).numpy(), dx, rtol=1e-3, atol=1e-3)


@pytest.mark.timeout(300)
def test_cached_row_kernels_past_65535_workgroups(monkeypatch, rng):
    """64 * 65,535 + 7 rows of 2: the cached row kernels' launch folds into (x, y) workgroups
    (layer_norm forward and backward, softmax forward and backward)."""
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    R = 64 * 65535 + 7
    x = rng.standard_normal((R, 2)).astype(np.float32)
    g = rng.standard_normal((R, 2)).astype(np.float32)
    t = wr.tensor(x, requires_grad=True)
    y = wr.ops.layer_norm(t, 2)
    dx = wr.autograd.backward_with_grad(y, wr.tensor(g)).get(t).numpy()
    d = (x[:, 0] - x[:, 1]).astype(np.float64)[:, None] * np.array([0.5, -0.5])
    rstd = 1 / np.sqrt(d[:, :1] ** 2 + 1e-5)  # up to 316 where the two values nearly agree
    np.testing.assert_allclose(y.numpy(), d * rstd, rtol=1e-4, atol=1e-4)
    xh = d * rstd
    want = rstd * (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True))
    np.testing.assert_allclose(dx, want, rtol=1e-3, atol=1e-2)
    t = wr.tensor(x, requires_grad=True)
    p = wr.ops.softmax(t, -1)
    dx = wr.autograd.backward_with_grad(p, wr.tensor(g)).get(t).numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    pn = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(p.numpy(), pn, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, pn * (g - (g * pn).sum(-1, keepdims=True)), rtol=1e-4,
                               atol=1e-5)
