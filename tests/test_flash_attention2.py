"""The FlashAttention-2 kernels (kernels/attention_gpu.py, the GPU path of ops/attention.py) on
lavapipe with the GPU layout forced: every tile variant's forward and gradients against
numpy (float64), odd sizes, causal and not, f16 storage, head size 128 (the smallest tiles
that fit), and past the sizes where things break (60,000 keys or queries in one workgroup's
loop, > 65,535 workgroups)."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus.kernels import attention_gpu as attention_tiles
from wgrumus.ops.attention import attention_backward, attention_forward, flash_attention
from wgrumus.runtime.profile import AdapterProfile
from wgrumus.runtime.tuning import TUNING


@pytest.fixture(autouse=True)
def gpu_layout(monkeypatch):
    monkeypatch.setattr(TUNING, "row_mode", "wg")


def attn64(q, k, v, causal, g):
    """float64 (O, dq, dk, dv) of softmax(q k^T / sqrt(d), causal) v with output gradient g."""
    q, k, v, g = (x.astype(np.float64) for x in (q, k, v, g))
    sc = 1 / np.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * sc
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return p @ v, ds @ k * sc, np.swapaxes(ds, -1, -2) @ q * sc, np.swapaxes(p, -1, -2) @ g


def run(q, k, v, causal, g):
    """(O, dq, dk, dv) of the kernels on [BH, T, d] arrays."""
    ts = [wr.tensor(x) for x in (q, k, v, g)]
    o, lse = attention_forward(*ts[:3], 1 / np.sqrt(q.shape[-1]), causal)
    grads = attention_backward(*ts[:3], o, lse, ts[3], 1 / np.sqrt(q.shape[-1]), causal)
    return [t.numpy() for t in (o,) + grads]


def check(q, k, v, causal, rng, tol=2e-5):
    g = rng.standard_normal(q.shape[:-1] + (v.shape[-1],)).astype(np.float32)
    for name, a, b in zip(("o", "dq", "dk", "dv"), run(q, k, v, causal, g),
                          attn64(q, k, v, causal, g)):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(attention_tiles.VARIANTS))
def test_variants_match_numpy(dev, rng, monkeypatch, name):
    """Each variant (forced) at head size 12, where all of them fit lavapipe's workgroup
    memory: causal self-attention over 3 query blocks and a partial one, and cross attention
    with fewer keys than a tile."""
    monkeypatch.setattr(TUNING, "attention_variant", name)
    for role, tiles in attention_tiles.VARIANTS[name].items():
        assert attention_tiles.pick_tiles(dev, role, 12)[:4] == tiles[:4]
    mk = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    check(mk(2, 101, 12), mk(2, 101, 12), mk(2, 101, 12), True, rng)
    check(mk(1, 37, 12), mk(1, 9, 12), mk(1, 9, 12), False, rng)


@pytest.mark.timeout(300)
def test_subgroup_row_reductions(dev, rng, monkeypatch):
    """The forward's row max and sum by subgroup shuffles (a64sg: rows of 8 invocations).
    llvmpipe's subgroups are its SIMD width (8 lanes at 256 bits) but it reports 4 as the
    least, so the test says 8 where the adapter name shows that width."""
    if "subgroup" not in dev.features or not any(w in dev.name for w in ("256 bits",
                                                                         "512 bits")):
        pytest.skip("no subgroups of 8 known on this adapter")
    monkeypatch.setattr(TUNING, "attention_variant", "a64sg")
    monkeypatch.setattr(TUNING, "subgroup_min", 8)
    assert attention_tiles.pick_tiles(dev, "fwd", 12) == (64, 32, 4, 4, 1)
    mk = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    check(mk(2, 101, 12), mk(2, 101, 12), mk(2, 101, 12), True, rng)
    check(mk(1, 37, 12), mk(1, 9, 12), mk(1, 9, 12), False, rng)


def test_table_per_role_and_known_subgroup_sizes(monkeypatch):
    """ATTN_TABLE entries name a variant per role; NVIDIA's warps of 32 hold the subgroup
    forward's rows of 16 although wgpu reports a placeholder least size of 4 (as on the H100),
    another adapter reporting 4 takes the forward without subgroups."""
    from types import SimpleNamespace
    info = {"stackgroup_min_size": 4, "stackgroup_max_size": 128}
    dev = SimpleNamespace(profile=AdapterProfile.of({**info, "vendor_id": 0x10DE}, {"subgroup"}),
                          features={"subgroup"}, adapter_info=info,
                          limits={"max-compute-workgroup-storage-size": 49152,
                                  "max-compute-invocations-per-workgroup": 1024})
    entry = {"fwd": "a32t2sg", "q": "a64i512", "kv": "a32t12"}
    for cls in ("nvidia", "amd"):
        monkeypatch.setitem(attention_tiles.ATTN_TABLE, cls, entry)
    assert attention_tiles.pick_tiles(dev, "fwd", 64) == (32, 32, 2, 2, 1)
    assert attention_tiles.pick_tiles(dev, "q", 64) == (64, 16, 2, 1)
    assert attention_tiles.pick_tiles(dev, "kv", 64) == (16, 32, 1, 2)
    dev.profile = AdapterProfile.of({**info, "vendor": "AMD"}, {"subgroup"})
    assert attention_tiles.pick_tiles(dev, "fwd", 64) == (32, 32, 2, 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("d,causal", [(3, True), (33, False), (64, True)])
def test_head_sizes_and_odd_lengths(rng, d, causal):
    T = 45
    q, k, v = (rng.standard_normal((2, T, d)).astype(np.float32) for _ in range(3))
    check(q, k, v, causal, rng)


@pytest.mark.timeout(300)
def test_head_size_128(dev, rng):
    """d = 128 (the largest head): on lavapipe's 32 KiB the smallest backward tiles."""
    assert attention_tiles.pick_tiles(dev, "kv", 128) is not None
    q, k, v = (rng.standard_normal((1, 24, 128)).astype(np.float32) for _ in range(3))
    check(q, k, v, True, rng)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("causal", [True, False])
def test_float16_storage(rng, causal):
    """f16 q, k, v (f32 math): within f32 rounding of the float64 result of the f16 values."""
    q, k, v = (rng.standard_normal((2, 50, 16)).astype(np.float16) for _ in range(3))
    check(q, k, v, causal, rng, tol=1e-4)


@pytest.mark.timeout(300)
def test_long_loops_forward_and_backward(rng, monkeypatch):
    """60,000 keys streamed by one query block (fwd, bwd_q) and 60,000 queries streamed by one
    key block (bwd_kv), with the smallest tiles (the most tile passes): llvmpipe would cut a
    loop of more than 65,535 iterations short; the kernels loop <= 9 times per tile."""
    monkeypatch.setattr(TUNING, "attention_variant", "a16")
    n, d = 60_000, 4
    mk = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, k, v = mk(1, 2, d), 0.1 * mk(1, n, d), mk(1, n, d)
    k[0, -1] = 4 * q[0, 0]  # the last key dominates the first query: a cut-off loop misses it
    check(q, k, v, False, rng, tol=1e-4)
    q, k, v = mk(1, n, d), mk(1, 16, d), mk(1, 16, d)
    check(q, k, v, False, rng, tol=1e-4)


@pytest.mark.timeout(300)
def test_more_than_65535_workgroups(rng, monkeypatch):
    """70,000 (batch, head) pairs: more workgroups than one dispatch dimension (the forward;
    the backward's grids fold the same way), with the smallest workgroups."""
    monkeypatch.setattr(TUNING, "attention_variant", "a16")
    q, k, v = (rng.standard_normal((70_000, 2, 4)).astype(np.float32) for _ in range(3))
    o, _ = attention_forward(*(wr.tensor(x) for x in (q, k, v)), 0.5, True)
    np.testing.assert_allclose(o.numpy(), attn64(q, k, v, True, q)[0], rtol=1e-4, atol=1e-5)


def test_flash_attention_op_uses_the_tiles(rng):
    """The autograd op takes this path in the GPU layout: same values as the kernels."""
    q, k, v = (rng.standard_normal((1, 2, 20, 8)).astype(np.float32) for _ in range(3))
    ts = [wr.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = flash_attention(*ts, causal=True)
    g = rng.standard_normal(out.shape).astype(np.float32)
    (out * wr.tensor(g)).sum().backward()
    want = attn64(q, k, v, True, g)
    for got, w in zip([out] + [t.grad for t in ts], want):
        np.testing.assert_allclose(got.numpy(), w, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_packed_qkv_views(rng, monkeypatch, causal):
    """MultiheadAttention / GPT's packed path (ops/attention.causal_self_attention): q, k, v are
    views at offsets into one buffer; the tiles give the unfused path's outputs and gradients."""
    from wgrumus.ops import attention
    fused = attention
    qkv = rng.standard_normal((2, 37, 3 * 18)).astype(np.float32)  # 2 heads of 9
    g = rng.standard_normal((2, 37, 18)).astype(np.float32)
    res = []
    for limit in (0, 1 << 40):
        monkeypatch.setattr(attention, "FUSED_SCORE_BYTES", limit)
        t = wr.tensor(qkv, requires_grad=True)
        y = fused.causal_self_attention(t, 2, causal)
        (y * wr.tensor(g)).sum().backward()
        res.append((y.numpy(), t.grad.numpy()))
    for a, b in zip(*res):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
