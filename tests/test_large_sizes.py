"""Sizes past llvmpipe's loop limit: Mesa's CPU driver ends every shader loop once an
invocation has run 65,535 iterations, silently. One test per kernel family at a size that
needed more than that per invocation before the kernels bounded their loops (see
wgrumus/kernels/bounds.py), plus the split paths at small sizes with the bounds lowered."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus.kernels import index as index_kernels
from wgrumus.kernels import reduce as reduce_kernels
from wgrumus.kernels import rows as row_kernels
from wgrumus.nn import functional as F
from wgrumus.ops.indexing import embedding, gather, index_select
from wgrumus.runtime.tuning import TUNING


def f32(a):
    return np.asarray(a, np.float32)


def lsm(a):
    z = a - a.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def grad_of(out, x, g):
    return wr.autograd.backward((out * wr.tensor(f32(g))).sum()).get(x).numpy()


@pytest.mark.timeout(120)
def test_full_reductions_of_17m_elements(rng):
    # 17M / 256 lanes = 66,407 iterations per lane in the old single-workgroup kernel
    n = 17_000_000
    assert wr.ones(n).sum().item() == n
    a = np.zeros(n, np.float32)
    a[n - 5] = 9.0  # where a truncated loop never gets
    a[n - 3] = -9.0
    a[n - 2] = 34.0
    x = wr.tensor(a)
    assert x.max().item() == 34.0 and x.argmin().item() == n - 3
    np.testing.assert_allclose(x.mean().item(), 34.0 / n, rtol=1e-5)


@pytest.mark.timeout(120)
def test_clip_grad_norm_17m(rng):
    n = 17_000_000
    p = wr.tensor(np.zeros(n, np.float32), requires_grad=True)
    g = f32(rng.standard_normal(n))
    p.grad = wr.tensor(g)
    total = wr.optim.clip_grad_norm_([p], 1.0).item()
    want = float(np.sqrt((g.astype(np.float64) ** 2).sum()))
    np.testing.assert_allclose(total, want, rtol=1e-4)
    np.testing.assert_allclose(float(np.sqrt((p.grad.numpy().astype(np.float64) ** 2).sum())),
                               1.0, rtol=1e-4)


def test_reduce_passes_small_chunks(rng, monkeypatch):
    """Three passes (chunks of 256): sums, extremes with NaN, first index among ties that sit
    in different chunks, int32 exactness."""
    monkeypatch.setattr(reduce_kernels, "CHUNK", 256)
    a = f32(rng.standard_normal((3, 70000)))
    x = wr.tensor(a)
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(x.mean(axis=1).numpy(), a.mean(1), rtol=1e-4, atol=1e-6)
    b = a.copy()
    b[0, [100, 600, 69000]] = 50.0  # ties in different chunks: the first one wins
    b[1, 40000] = np.nan
    xb = wr.tensor(b)
    np.testing.assert_array_equal(xb.argmax(axis=1).numpy(), [100, 40000, b[2].argmax()])
    got = xb.max(axis=1).numpy()
    assert got[0] == 50.0 and np.isnan(got[1]) and got[2] == b[2].max()
    ai = rng.integers(-2 ** 31, 2 ** 31 - 1, 70000).astype(np.int32)
    ti = wr.tensor(ai)
    assert ti.max().item() == ai.max() and ti.argmin().item() == ai.argmin()
    assert ti.sum().dtype == wr.int32
    assert ti.sum().item() == ai.sum(dtype=np.int32)  # exact, wrapping like numpy's int32


@pytest.mark.timeout(60)
def test_short_rows_many(rng):
    """(5M, 3) row sums: one invocation per row (was one 256-wide workgroup per row)."""
    a = f32(rng.standard_normal((5_000_000, 3)))
    x = wr.tensor(a)
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(x.argmax(axis=1).numpy()[:1000], a[:1000].argmax(1))


@pytest.mark.timeout(120)
def test_softmax_layer_norm_long_rows(rng):
    L = 70_000  # 2 loops x 70,000 per invocation in the old per-row-invocation kernels
    a = f32(rng.standard_normal((2, L)) * 3)
    g = f32(rng.standard_normal((2, L)))
    x = wr.tensor(a, requires_grad=True)
    y = np.exp(lsm(a))
    np.testing.assert_allclose(F.softmax(x).numpy(), y, rtol=1e-4, atol=1e-9)
    want = y * (g - (g * y).sum(-1, keepdims=True))
    np.testing.assert_allclose(grad_of(F.softmax(x), x, g), want, rtol=1e-3, atol=1e-8)
    np.testing.assert_allclose(F.log_softmax(x).numpy(), lsm(a), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(grad_of(F.log_softmax(x), x, g),
                               g - y * g.sum(-1, keepdims=True), rtol=1e-3, atol=1e-4)
    mu, var = a.mean(1, keepdims=True), a.var(1, keepdims=True)
    xh = (a - mu) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(F.layer_norm(x, L).numpy(), xh, rtol=1e-4, atol=1e-4)
    dx = (g - g.mean(1, keepdims=True) - xh * (g * xh).mean(1, keepdims=True)) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(grad_of(F.layer_norm(x, L), x, g), dx, rtol=1e-3, atol=1e-4)


@pytest.mark.timeout(120)
def test_cross_entropy_many_classes(rng):
    C = 70_000
    a = f32(rng.standard_normal((2, C)))
    t = np.array([5, C - 1])
    x = wr.tensor(a, requires_grad=True)
    loss = F.cross_entropy(x, t)
    np.testing.assert_allclose(loss.item(), -lsm(a)[[0, 1], t].mean(), rtol=1e-5)
    onehot = np.zeros_like(a)
    onehot[[0, 1], t] = 1
    got = wr.autograd.backward(loss).get(x).numpy()
    np.testing.assert_allclose(got, (np.exp(lsm(a)) - onehot) / 2, rtol=1e-3, atol=1e-8)


def test_split_row_ops_match(rng, monkeypatch):
    """With the loop budget lowered, softmax / layer_norm / cross_entropy take their composed
    path (rows past one workgroup, > 8M elements at the real budget); values and gradients."""
    monkeypatch.setattr(row_kernels, "LOOP_BUDGET", 64)
    a = f32(rng.standard_normal((3, 300)))
    g = f32(rng.standard_normal((3, 300)))
    x = wr.tensor(a, requires_grad=True)
    y = np.exp(lsm(a * 0.5))
    np.testing.assert_allclose(wr.ops.softmax(x, scale=0.5).numpy(), y, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(grad_of(F.softmax(x), x, g),
                               np.exp(lsm(a)) * (g - (g * np.exp(lsm(a))).sum(-1, keepdims=True)),
                               rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(F.log_softmax(x).numpy(), lsm(a), rtol=1e-5, atol=1e-5)
    w, b = f32(rng.standard_normal(300)), f32(rng.standard_normal(300))
    tw, tb = wr.tensor(w, requires_grad=True), wr.tensor(b, requires_grad=True)
    xh = (a - a.mean(1, keepdims=True)) / np.sqrt(a.var(1, keepdims=True) + 1e-5)
    out = F.layer_norm(x, 300, tw, tb)
    np.testing.assert_allclose(out.numpy(), xh * w + b, rtol=1e-4, atol=1e-4)
    gs = wr.autograd.backward((out * wr.tensor(g)).sum())
    np.testing.assert_allclose(gs.get(tw).numpy(), (g * xh).sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gs.get(tb).numpy(), g.sum(0), rtol=1e-4, atol=1e-4)
    t = np.array([3, -100, 299])
    for red in ("mean", "sum", "none"):
        loss = F.cross_entropy(x, t, label_smoothing=0.1, reduction=red)
        lp = lsm(a)
        rows = -(0.9 * lp[[0, 1, 2], np.where(t < 0, 0, t)] + 0.1 * lp.mean(1)) * (t != -100)
        want = {"mean": rows.sum() / 2, "sum": rows.sum(), "none": rows}[red]
        np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5, atol=1e-6)
    gx = wr.autograd.backward(F.cross_entropy(x, t)).get(x).numpy()
    ref = np.exp(lsm(a))
    ref[[0, 2], t[[0, 2]]] -= 1
    ref[1] = 0
    np.testing.assert_allclose(gx, ref / 2, rtol=1e-4, atol=1e-7)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("K,skewed", [(8192, True), (40_000, False)])
def test_embedding_backward_many_indices(rng, K, skewed):
    V, D = 50, 40
    ids = np.full(K, 7) if skewed else rng.integers(0, V, K)
    w = wr.tensor(f32(rng.standard_normal((V, D))), requires_grad=True)
    g = f32(rng.standard_normal((K, D)))
    ref = np.zeros((V, D))
    np.add.at(ref, ids, g)
    np.testing.assert_allclose(grad_of(embedding(ids, w), w, g), ref, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("mode", ["wg", "thread"])
def test_index_backward_passes(rng, monkeypatch, mode):
    """index_select / gather backward in several passes over the indices (budget lowered)."""
    monkeypatch.setattr(TUNING, "row_mode", mode)
    monkeypatch.setattr(index_kernels, "LOOP_BUDGET", 100)
    x = wr.tensor(f32(rng.standard_normal((4, 9, 5))), requires_grad=True)
    idx = rng.integers(0, 9, 700)
    g = f32(rng.standard_normal((4, 700, 5)))
    ref = np.zeros((4, 9, 5))
    np.add.at(ref, (slice(None), idx), g)
    np.testing.assert_allclose(grad_of(index_select(x, 1, idx), x, g), ref, rtol=1e-4, atol=1e-4)
    gi = rng.integers(0, 9, (4, 300, 5))
    gg = f32(rng.standard_normal((4, 300, 5)))
    ref = np.zeros((4, 9, 5))
    for o in range(4):
        for c in range(5):
            np.add.at(ref[o, :, c], gi[o, :, c], gg[o, :, c])
    np.testing.assert_allclose(grad_of(gather(x, 1, gi), x, gg), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(60)
def test_gather_backward_long_axis(rng):
    J = 70_000  # one invocation per element of dx looped over all J entries
    x = wr.tensor(f32(rng.standard_normal(3)), requires_grad=True)
    idx = rng.integers(0, 3, J)
    g = f32(rng.standard_normal(J))
    ref = np.zeros(3)
    np.add.at(ref, idx, g)
    np.testing.assert_allclose(grad_of(gather(x, 0, idx), x, g), ref, rtol=1e-4, atol=1e-2)
