"""The GPU kernel variants of issue 22 (kernels/matmul_gpu.py VARIANTS, kernels/rows_gpu.py
ROW_VARIANTS) against numpy on this adapter: each forced in turn (lavapipe runs the GPU matmul
kernel when told to), aligned and ragged shapes, every load layout, f16, split-K over several
dispatches, more than 65,535 workgroups, and the tables that pick them per adapter class."""
import importlib
from types import SimpleNamespace

import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus.kernels import rows_gpu as rowops
from wgrumus.kernels.rows import layer_norm_backward
from wgrumus.ops import layer_norm, log_softmax, softmax
from wgrumus.runtime.profile import profile
from wgrumus.runtime.tuning import TUNING

mm = importlib.import_module("wgrumus.ops.matmul")
mg = importlib.import_module("wgrumus.kernels.matmul_gpu")
F32_VARIANTS = [k for k, v in mg.VARIANTS.items() if not v.get("half")]
HALF_VARIANTS = [k for k, v in mg.VARIANTS.items() if v.get("half")]


@pytest.fixture
def variant(request, monkeypatch):
    """Force one GPU matmul variant (on every adapter, CPU ones included)."""
    monkeypatch.setattr(TUNING, "cpu_matmul", False)
    monkeypatch.setattr(mg, "_pick_variant", lambda *a: mg.VARIANTS[request.param])
    return request.param


def _pair(rng, sa, sb, dt, bt=False, at=False):
    """Operands of shapes sa @ sb; at / bt: stored transposed (a transposed view)."""
    an = rng.standard_normal(sa[:-2] + (sa[-1], sa[-2]) if at else sa).astype(dt)
    bn = rng.standard_normal(sb[:-2] + (sb[-1], sb[-2]) if bt else sb).astype(dt)
    a, b = wr.tensor(an), wr.tensor(bn)
    if at:
        a, an = a.transpose(-1, -2), np.swapaxes(an, -1, -2)
    if bt:
        b, bn = b.transpose(-1, -2), np.swapaxes(bn, -1, -2)
    return a, b, an.astype(np.float32) @ bn.astype(np.float32)


def _close(out, ref, f16=False):
    tol = 4e-2 if f16 else 2e-4
    got = out.numpy().astype(np.float32)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=tol * max(1.0, float(np.abs(ref).max())), rtol=tol)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", F32_VARIANTS, indirect=True)
def test_matmul_variants_f32(variant, rng):
    # aligned (exact tiles where the variant allows them), A @ B.T, whole tiles over a ragged K,
    # ragged, A.T @ B, batched
    a, b, ref = _pair(rng, (256, 64), (64, 256), np.float32, bt=True)
    _close(a @ b, ref)
    a, b, ref = _pair(rng, (256, 100), (100, 256), np.float32)
    _close(a @ b, ref)
    a, b, ref = _pair(rng, (130, 68), (68, 36), np.float32)
    _close(a @ b, ref)
    a, b, ref = _pair(rng, (68, 96), (96, 20), np.float32, at=True)
    _close(a @ b, ref)
    a, b, ref = _pair(rng, (3, 64, 128), (3, 128, 64), np.float32)
    _close(a @ b, ref)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", HALF_VARIANTS + ["t128ak", "t64s4ak"], indirect=True)
def test_matmul_variants_f16(dev, variant, rng):
    if "shader-f16" not in dev.features:
        pytest.skip("adapter has no shader-f16")
    for sa, sb, bt in (((256, 128), (128, 256), True), ((70, 36), (36, 20), False)):
        a, b, ref = _pair(rng, sa, sb, np.float16, bt=bt)
        out = a @ b
        assert out.dtype == np.float16
        _close(out, ref, f16=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["t128ak", "t64s4"], indirect=True)
def test_matmul_variant_gradients_and_epilogue(variant, rng):
    """Backward runs the same variants (A.T @ G and G @ B.T); split-K leaves the fused
    Linear epilogue to the one-slice kernel."""
    an = rng.standard_normal((64, 96)).astype(np.float32)
    bn = rng.standard_normal((96, 64)).astype(np.float32)
    a, b = wr.tensor(an, requires_grad=True), wr.tensor(bn, requires_grad=True)
    g = rng.standard_normal((64, 64)).astype(np.float32)
    ((a @ b) * wr.tensor(g)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), g @ bn.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(b.grad.numpy(), an.T @ g, rtol=1e-4, atol=1e-3)
    bias = rng.standard_normal(64).astype(np.float32)
    got = mm.linear_2d(wr.tensor(an), wr.tensor(bn), wr.tensor(bias), None, "max({z}, 0.0)")
    np.testing.assert_allclose(got.numpy(), np.maximum(an @ bn + bias, 0), rtol=1e-4, atol=1e-3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["t64s3"], indirect=True)
def test_split_k_batches_over_several_dispatches(variant, rng, monkeypatch):
    """Batches past the per-dispatch workgroup limit (here made 7, so 2 batches of 3 slices
    per dispatch) keep their slices and offsets apart."""
    monkeypatch.setattr(mg, "MAX_WG_PER_DIM", 7)
    a, b, ref = _pair(rng, (5, 16, 192), (5, 192, 12), np.float32)
    _close(a @ b, ref)


def test_variant_table_picks_per_adapter_class(monkeypatch):
    nv = SimpleNamespace(adapter_info={"adapter_type": "DiscreteGPU", "vendor_id": 0x10DE})
    amd = SimpleNamespace(adapter_info={"adapter_type": "DiscreteGPU", "vendor": "AMD"})
    cpu = SimpleNamespace(adapter_info={"adapter_type": "CPU"})
    assert [profile(d).adapter_class for d in (nv, amd, cpu)] == ["nvidia", "amd", "cpu"]
    monkeypatch.setattr(mg, "MATMUL_TABLE", {("nvidia", "f32"): ((1024 * 1024, "t64s4"),
                                                                  (1 << 62, "t128ak"))})
    assert mg._pick_variant(nv, 512, 512, 1, False) is mg.VARIANTS["t64s4"]
    assert mg._pick_variant(nv, 4096, 4096, 1, False) is mg.VARIANTS["t128ak"]
    assert mg._pick_variant(nv, 512, 512, 1, True) is None  # no f16 row: the default kernel
    assert mg._pick_variant(amd, 512, 512, 1, False) is None
    for rows in mg.MATMUL_TABLE.values():
        assert all(name in mg.VARIANTS or name == "default" for _, name in rows)



def test_shipped_matmul_rules_follow_the_measured_shapes():
    """The NVIDIA f32 rules pick what the H100 measured best for the GPT-2-width products:
    split-K for few output tiles over a long K, 128x192 tiles (or their split-K slices) where
    they fill whole waves of 132 workgroups, 128x64 tiles for 64-wide or two-wave outputs,
    128x128 only with enough of them; every rule names a variant."""
    nv = SimpleNamespace(adapter_info={"adapter_type": "DiscreteGPU", "vendor_id": 0x10DE})
    pick = lambda M, N, K, nb=1: next(k for k, v in mg.VARIANTS.items()
                                      if v is mg._pick_variant(nv, M, N, nb, False, K))
    assert pick(768, 3072, 4096) == "t128x192s4"  # weight gradient: 96 tiles x 4 slices
    assert pick(768, 3072, 1024) == "t128x64"  # (K under 2048: no slices)
    assert pick(768, 2304, 4096) == "t64s2"  # 72 x 4 slices: a quarter of a third wave
    assert pick(768, 768, 4096) == "t64s4"  # 144 tiles: as many slices as there are names
    assert pick(4096, 768, 3072) == "t128x192ak"  # 128 128x192 tiles: one wave
    assert pick(4096, 3072, 768) == pick(4096, 2304, 768) == "t128x192ak"  # 3.9 / 2.9 waves
    assert pick(1536, 2304, 768) == "t128x64"  # 144 128x192 tiles: a second wave of 12
    assert pick(2048, 768, 768) == "t128x64"  # 64 128x192 tiles: half a wave
    assert pick(4096, 4096, 768) == pick(2048, 2048, 2048) == "t128k24akp"  # 192 does not divide
    assert pick(1536, 1408, 4096) == "t128k24akp"  # 132 tiles of 128x128: one whole wave
    assert pick(512, 512, 64, nb=96) == "t128k16ak"  # attention's scores: K too short for k24
    assert pick(512, 64, 512, nb=96) == "t128x64"  # a 128-wide tile would be half padding
    assert pick(4096, 65, 768) == "t64e"  # too little to fill either big tile
    assert pick(512, 512, 512) == "t64s2"
    for rows in mg.MATMUL_TABLE.values():
        for row in rows:
            names = [n for x in row[1:] for n in (x if isinstance(x, tuple) else (x,))
                     if isinstance(n, str)]
            assert names and all(n in mg.VARIANTS for n in names), row


# --------------------------------------------------------------------------- row ops

@pytest.fixture(params=list(rowops.ROW_VARIANTS))
def row_variant(request, monkeypatch):
    monkeypatch.setattr(TUNING, "row_variant", request.param)
    monkeypatch.setattr(TUNING, "subgroup_max", 8)  # lavapipe's subgroups are 8 wide
    return request.param


def _softmax_ref(z, log=False):
    m = z.max(-1, keepdims=True)
    e = np.exp(z - m)
    return z - m - np.log(e.sum(-1, keepdims=True)) if log else e / e.sum(-1, keepdims=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", [(6, 64), (3, 37), (5, 1024), (33, 8)])
def test_row_variants_softmax(row_variant, shape, rng):
    x = rng.standard_normal(shape)
    check_grad(lambda a: softmax(a * 1.0), _softmax_ref, [x[:2, :12]])
    g = rng.standard_normal(shape).astype(np.float32)
    for log in (False, True):
        t = wr.tensor(x.astype(np.float32), requires_grad=True)
        y = (log_softmax if log else softmax)(t, scale=0.5)
        (y * wr.tensor(g)).sum().backward()
        s = _softmax_ref(0.5 * x)
        np.testing.assert_allclose(y.numpy(), _softmax_ref(0.5 * x, log), rtol=1e-5, atol=1e-5)
        want = 0.5 * (g - s * g.sum(-1, keepdims=True)) if log \
            else 0.5 * s * (g - (g * s).sum(-1, keepdims=True))
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", [(2, 5, 8), (3, 7, 12), (2, 4, 9)])
def test_row_variants_causal(row_variant, shape, rng):
    x = rng.standard_normal(shape)
    tq, tk = shape[-2:]
    mask = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
    z = np.where(mask, -np.inf, 2.0 * x)
    np.testing.assert_allclose(softmax(wr.tensor(x.astype(np.float32)), scale=2.0,
                                       causal=True).numpy(), _softmax_ref(z), atol=1e-6)
    with np.errstate(invalid="ignore"):
        lref = _softmax_ref(z, True)
    got = log_softmax(wr.tensor(x.astype(np.float32)), scale=2.0, causal=True).numpy()
    np.testing.assert_allclose(got, lref, rtol=1e-5, atol=1e-5)
    check_grad(lambda a: softmax(a, scale=2.0, causal=True),
               lambda a: _softmax_ref(np.where(mask, -np.inf, 2.0 * a)), [x[:1]])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("L", [64, 37, 1024])
def test_row_variants_layer_norm(row_variant, L, rng):
    x = rng.normal(2.0, 3.0, size=(5, L))
    wb = rng.standard_normal(2 * L + 4).astype(np.float32)
    for off in (0, 1):  # weight and bias views at offsets (1: element loads)
        w, b = wr.tensor(wb)[off:off + L], wr.tensor(wb)[L + 4:]
        t = wr.tensor(x.astype(np.float32), requires_grad=True)
        y = layer_norm(t, (L,), w, b)
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        xh = (x - mu) / np.sqrt(var + 1e-5)
        wn, bn = wb[off:off + L], wb[L + 4:]
        np.testing.assert_allclose(y.numpy(), xh * wn + bn, rtol=1e-4, atol=1e-4)
        g = rng.standard_normal((5, L))
        (y * wr.tensor(g.astype(np.float32))).sum().backward()
        gw = g * wn
        dx = (gw - gw.mean(-1, keepdims=True) - xh * (gw * xh).mean(-1, keepdims=True)) \
            / np.sqrt(var + 1e-5)
        np.testing.assert_allclose(t.grad.numpy(), dx, rtol=1e-3, atol=1e-4)
    check_grad(lambda a: layer_norm(a, (9,)), lambda a: (a - a.mean(-1, keepdims=True))
               / np.sqrt(a.var(-1, keepdims=True) + 1e-5), [x[:1, :9]])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["v4sg", "s1"])
def test_row_variants_past_65535_workgroups(name, rng, monkeypatch):
    """70,000 rows, one workgroup each: the launch folds over (x, y) workgroups."""
    monkeypatch.setattr(TUNING, "row_variant", name)
    monkeypatch.setattr(TUNING, "subgroup_max", 8)
    x = rng.standard_normal((70_000, 8)).astype(np.float32)
    y = softmax(wr.tensor(x))
    np.testing.assert_allclose(y.numpy(), _softmax_ref(x), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(x.shape).astype(np.float32)
    from wgrumus.ops.softmax import softmax_backward
    s = _softmax_ref(x)
    np.testing.assert_allclose(softmax_backward(y, wr.tensor(g)).numpy(),
                               s * (g - (g * s).sum(-1, keepdims=True)), rtol=1e-4, atol=1e-5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(layer_norm(wr.tensor(x), 8).numpy(),
                               (x - mu) / np.sqrt(var + 1e-5), rtol=1e-3, atol=1e-3)
    dx = layer_norm_backward(wr.tensor(x), wr.tensor(g), None, wr.tensor(mu.ravel()),
                             wr.tensor((1 / np.sqrt(var + 1e-5)).ravel()), wr.empty(x.shape))
    assert np.isfinite(dx.numpy()).all()


def test_row_plan_bounds_and_defaults(dev, monkeypatch):
    """No forced variant and an empty table: CPU adapters (and GPUs) keep the kernels of
    softmax.wgsl / layernorm.wgsl; rows past one workgroup's loop budget get no plan."""
    monkeypatch.setattr(rowops, "ROW_TABLE", {})
    assert rowops.plan(dev, "sm_fwd", 1024, 16) is None
    monkeypatch.setattr(TUNING, "row_variant", "v4sgr8")
    k, groups = rowops.plan(dev, "sm_fwd", 64, 20, (0, 0))
    d = dict(k.defines)
    assert (d["G"], d["WG"], d["VEC"], groups) == ("32", "256", "4", (3, 1, 1))
    assert dict(rowops.plan(dev, "sm_fwd", 64, 20, (0, 2))[0].defines)["VEC"] == "1"
    assert rowops.plan(dev, "ln_fwd", 1 << 27, 1) is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["t64s2"], indirect=True)
def test_split_k_past_65535_workgroups(variant, rng):
    """33,000 batches x 2 slices: 66,000 workgroups along z, in two dispatches."""
    a, b, ref = _pair(rng, (33_000, 4, 64), (33_000, 64, 4), np.float32)
    _close(a @ b, ref)


def test_row_table_picks_per_adapter_class(monkeypatch):
    nv = SimpleNamespace(adapter_info={"adapter_type": "DiscreteGPU", "vendor_id": 0x10DE})
    cpu = SimpleNamespace(adapter_info={"adapter_type": "CPU"})
    table = ((1024, "v4sg"), (1 << 30, "default"))
    monkeypatch.setattr(rowops, "ROW_TABLE", {("nvidia", "sm_fwd"): table,
                                              ("cpu", "sm_fwd"): table})
    assert rowops._variant(nv, "sm_fwd", 512) == rowops.ROW_VARIANTS["v4sg"]
    assert rowops._variant(nv, "sm_fwd", 4096) is None
    assert rowops._variant(nv, "ln_fwd", 512) is None
    assert rowops._variant(cpu, "sm_fwd", 512) is None  # CPU adapters keep their kernels


@pytest.mark.timeout(300)
@pytest.mark.parametrize("N,C", [(6, 64), (5, 37), (70_000, 4)])
def test_row_variants_cross_entropy(row_variant, N, C, rng):
    """Row statistics by the variant, losses by xent.wgsl's loss_rows: ignore_index, label
    smoothing and the gradient as with the fused kernel; 70,000 rows pass 65,535 workgroups."""
    from wgrumus.ops import cross_entropy
    x = rng.standard_normal((N, C)).astype(np.float32)
    t = rng.integers(0, C, N)
    t[1] = -100
    lsm = _softmax_ref(x.astype(np.float64), True)
    nll = -lsm[np.arange(N), np.where(t < 0, 0, t)]
    rows = (0.9 * nll - 0.1 * lsm.mean(1)) * (t >= 0)
    xt = wr.tensor(x, requires_grad=True)
    loss = cross_entropy(xt, t, label_smoothing=0.1)
    np.testing.assert_allclose(loss.numpy(), rows.sum() / (t >= 0).sum(), rtol=1e-5)
    np.testing.assert_allclose(cross_entropy(wr.tensor(x), t, label_smoothing=0.1,
                                             reduction="none").numpy(), rows, atol=1e-5)
    loss.backward()
    p = np.exp(lsm)
    onehot = np.zeros_like(p)
    onehot[np.arange(N), np.where(t < 0, 0, t)] = 1
    want = (p - 0.9 * onehot - 0.1 / C) * (t >= 0)[:, None] / (t >= 0).sum()
    np.testing.assert_allclose(xt.grad.numpy(), want, atol=1e-6)


def test_row_variant_cross_entropy_device_target_check(rng, monkeypatch):
    """A device-held target out of range still raises at the next host read."""
    from wgrumus.ops import cross_entropy
    monkeypatch.setattr(TUNING, "row_variant", "v4sg")
    x = wr.tensor(rng.standard_normal((5, 40)).astype(np.float32))
    t = wr.tensor(np.array([0, 1, 2, 3, 40], np.int32))
    with pytest.raises(IndexError, match="index 40 is out of range for size 40"):
        cross_entropy(x, t).numpy()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["t128k16ak", "t128x64", "t64e", "t128x192ak", "t128k24akp"],
                         indirect=True)
@pytest.mark.parametrize("T", [130, 256, 384])
def test_causal_matmul_parts_match_numpy(variant, rng, T):
    """matmul_into's causal parts against numpy (ragged and whole tiles, [B, H, T, d] head
    views of a packed projection, merged-head outputs): the scores on and below the diagonal,
    and products of a triangular A whose K ranges stop / start at it (T = 384, d = 128: whole
    tiles everywhere, and K ranges cut at the diagonal that k steps of 24 do not divide)."""
    B, H, d = (1, 1, 128) if T == 384 else (2, 3, 24)
    x = rng.standard_normal((B, T, 2, H, d)).astype(np.float32)
    q, k = (wr.tensor(x).permute(2, 0, 3, 1, 4)[i] for i in range(2))
    qn, kn = (x.transpose(2, 0, 3, 1, 4)[i] for i in range(2))
    s = mm.matmul_into(q, k.transpose(-1, -2), wr.Tensor.empty((B, H, T, T)), "out").numpy()
    lower = np.tril(np.ones((T, T), bool))
    np.testing.assert_allclose(s[:, :, lower], (qn @ kn.transpose(0, 1, 3, 2))[:, :, lower],
                               rtol=1e-4, atol=1e-4)
    p = rng.standard_normal((B, H, T, T)).astype(np.float32)
    tile = 16 * mg.VARIANTS[variant]["tm"]  # whole row tiles past the diagonal's hold NaN: the
    i, j = np.indices((T, T))  # kernel must not read them (the zeros it sums stand in for them)
    for part, keep, skip in (("a_lower", j <= i, j >= (i // tile + 1) * tile),
                             ("a_upper", j >= i, j < (i // tile) * tile)):
        a = np.where(keep, p, 0).astype(np.float32)
        y = wr.Tensor.empty((B, T, H, d))
        mm.matmul_into(wr.tensor(np.where(skip, np.nan, a).astype(np.float32)), q,
                       y.permute(0, 2, 1, 3), part)
        np.testing.assert_allclose(y.numpy(), (a @ qn).transpose(0, 2, 1, 3), rtol=1e-4,
                                   atol=1e-4)
    with pytest.raises(wr.WgrumusError, match="part 'a_lower' needs"):
        mm.matmul_into(q, k.transpose(-1, -2)[..., :d, :], wr.Tensor.empty((B, H, T, T)),
                       "a_lower")


@pytest.mark.parametrize("rows", [None, "v4", "v4sgr_q1"])
def test_causal_softmax_backward_ignores_masked_gradients(monkeypatch, rng, rows):
    """The gradient above a causal mask may be unwritten memory (the scores' matmul skips it):
    NaN there leaves d(input) finite, with the adapter's kernels and forced GPU row variants
    (whose last quad of a row straddles the mask)."""
    from wgrumus.ops.softmax import softmax_backward
    monkeypatch.setattr(TUNING, "row_variant", rows)
    monkeypatch.setattr(TUNING, "subgroup_max", 8)
    T = 132
    y = rng.standard_normal((3, T, T)).astype(np.float32)
    upper = np.triu(np.ones((T, T), bool), 1)
    got = softmax_backward(wr.tensor(np.where(upper, 0, y)), wr.tensor(np.where(upper, np.nan, y)),
                           False, 1.0, T).numpy()
    assert np.isfinite(got).all() and (got[:, upper] == 0).all()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rows", [None, "v4", "v4sgr_q1"])
def test_causal_attention_ignores_unwritten_scores(monkeypatch, rng, rows):
    """The unfused causal attention on the tiled GPU kernels leaves the scores and their
    gradient above the diagonal unwritten: with the pool's buffers full of NaN first (the
    scores' buffer is one of them), output and gradient still match the composition, with the
    adapter's own softmax kernels and forced GPU row variants."""
    from wgrumus.ops import attention as fused
    monkeypatch.setattr(TUNING, "cpu_matmul", False)
    monkeypatch.setattr(fused, "prefer_fused", lambda *a: False)
    monkeypatch.setattr(TUNING, "row_variant", rows)
    monkeypatch.setattr(TUNING, "subgroup_max", 8)
    B, T, H, d = 2, 132, 2, 8
    x = rng.standard_normal((B, T, 3 * H * d)).astype(np.float32)
    g = rng.standard_normal((B, T, H * d)).astype(np.float32)
    nan = [wr.tensor(np.full((B * H, T, T), np.nan, np.float32)) for _ in range(6)]
    del nan  # back to the pool, NaN inside
    xt = wr.tensor(x, requires_grad=True)
    y = fused.causal_self_attention(xt, H, True)
    (y * wr.tensor(g)).sum().backward()
    q, k, v = (x.reshape(B, T, 3, H, d).transpose(2, 0, 3, 1, 4)[i] for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + np.triu(np.full((T, T), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, H * d)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
    go = g.reshape(B, T, H, d).transpose(0, 2, 1, 3)
    dp = go @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(d)
    dq, dk, dv = ds @ k, ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ go
    want_g = np.stack([dq, dk, dv], 2).transpose(0, 3, 2, 1, 4).reshape(B, T, 3 * H * d)
    np.testing.assert_allclose(xt.grad.numpy(), want_g, rtol=1e-4, atol=1e-4)
