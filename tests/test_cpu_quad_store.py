"""The CPU matmul's quad stores (issue 20): C and the epilogue's operands written / read a vec4
at a time where C's rows, offsets and strides are multiples of 4, per element elsewhere; both
against numpy, the choice checked, on whatever adapter runs the tests (the CPU kernel forced)."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.kernels import rows as row_kernels
from wgrumus.kernels import texture
from wgrumus.ops.matmul import linear_2d, matmul_into
from wgrumus.runtime.tuning import TUNING
from wgrumus.tensor import Tensor

mc = importlib.import_module("wgrumus.kernels.matmul_cpu")


@pytest.fixture
def quads(monkeypatch):
    """Forces the CPU kernel; returns the list of v4 flags of the kernels launched."""
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    seen = []
    orig = mc.cpu_kernel_for

    def spy(*a, **kw):
        seen.append(kw.get("v4", False))
        return orig(*a, **kw)
    monkeypatch.setattr(mc, "cpu_kernel_for", spy)
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("M,K,N,v4,epi", [
    (M, K, N, v4, epi) for M, K, N in [(37, 13, 20), (130, 9, 68), (5, 3, 4), (9, 11, 10)]
    for v4 in (None, False) for epi in ("none", "bias_relu", "residual", "pre_gelu")
    # (130 rows take the 16x8 block, whose element stores with a residual or a pre-activation
    # cost lavapipe ~20 s each to compile; tests/test_matmul.py runs that block's epilogues)
    if not (M == 130 and v4 is False and epi in ("residual", "pre_gelu"))])
def test_epilogues_match_numpy(monkeypatch, quads, rng, M, K, N, v4, epi):
    """Every epilogue, odd M and K; N a multiple of 4 takes quads unless
    TUNING.matmul_quad_stores is False."""
    monkeypatch.setattr(TUNING, "matmul_quad_stores", v4)
    x = rng.standard_normal((M, K)).astype(np.float32)
    wt = rng.standard_normal((K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    r = rng.standard_normal((M, N)).astype(np.float32)
    z = x.astype(np.float64) @ wt
    pre = Tensor.empty((M, N)) if epi == "pre_gelu" else None
    args = {"none": (None, None, None), "bias_relu": (b, None, "max({z}, 0.0)"),
            "residual": (b, r, None), "pre_gelu": (b, None, "gelu_({z})")}[epi]
    y = linear_2d(wr.tensor(x), wr.tensor(wt), *(wr.tensor(t) if t is not None else None
                                                 for t in args[:2]), args[2], pre=pre)
    want = {"none": z, "bias_relu": np.maximum(z + b, 0), "residual": z + b + r}.get(epi)
    if epi == "pre_gelu":
        from math import erf
        np.testing.assert_allclose(pre.numpy(), z + b, rtol=1e-4, atol=1e-4)
        want = (z + b) * 0.5 * (1 + np.vectorize(erf)((z + b) / np.sqrt(2)))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
    assert quads == [v4 is None and N % 4 == 0]


@pytest.mark.timeout(120)
def test_misaligned_operands_store_per_element(quads, rng):
    """A bias view at an offset that is not a multiple of 4, and a strided C at such an offset:
    per-element stores, still exact."""
    x = rng.standard_normal((6, 5)).astype(np.float32)
    wt = rng.standard_normal((5, 8)).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32)
    y = linear_2d(wr.tensor(x), wr.tensor(wt), wr.tensor(b)[1:])
    np.testing.assert_allclose(y.numpy(), x @ wt + b[1:], rtol=1e-5, atol=1e-5)
    a = rng.standard_normal((1, 2, 3, 5)).astype(np.float32)
    w = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    big = Tensor.empty((1 + 3 * 2 * 4,))
    out = Tensor(big._storage, (1, 2, 3, 4), (24, 4, 8, 1), 1)  # [B, T, H, d] at offset 1
    matmul_into(wr.tensor(a), wr.tensor(w), out)
    np.testing.assert_allclose(out.numpy(), a @ w, rtol=1e-5, atol=1e-5)
    assert quads == [False, False]


@pytest.mark.timeout(180)
def test_quads_with_k_in_passes(monkeypatch, quads, rng):
    """K in passes (llvmpipe's loop cap, here 16 a pass): the later passes add C's quads."""
    monkeypatch.setattr(mc, "CPU_KPASS", (16, 16))
    x = rng.standard_normal((9, 70)).astype(np.float32)
    wt = rng.standard_normal((70, 12)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    y = linear_2d(wr.tensor(x), wr.tensor(wt), wr.tensor(b), None, "max({z}, 0.0)")
    np.testing.assert_allclose(y.numpy(), np.maximum(x.astype(np.float64) @ wt + b, 0),
                               rtol=1e-4, atol=1e-4)
    assert len(quads) == 6 and all(quads)  # the first launch, then one kernel per pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("R,L", [(7, 12), (300, 8), (5, 10)])
@pytest.mark.parametrize("cpu", [True, False])
@pytest.mark.parametrize("act", [None, "gelu_tanh"])
@pytest.mark.parametrize("tex", [None, False])
def test_linear_epilogue_grad_quads_match_numpy(monkeypatch, rng, R, L, cpu, act, tex):
    """kernels/linear.epilogue_grad (dz = g * act'(z + b) and the bias gradient): a column quad
    an invocation on CPU adapters where L and the offsets are multiples of 4, g and z read
    through textures (kernels/texture.py) unless TUNING.texture_reads is False (R 300: two row
    chunks, partial sums added by colsum), a column an invocation elsewhere."""
    lk = importlib.import_module("wgrumus.kernels.linear")
    monkeypatch.setattr(lk, "use_cpu_kernel", lambda dev: cpu)
    monkeypatch.setattr(TUNING, "texture_reads", tex)
    g = rng.standard_normal((R, L)).astype(np.float32)
    z = rng.standard_normal((R, L)).astype(np.float32)
    b = rng.standard_normal(L).astype(np.float32)
    grad = importlib.import_module("wgrumus.ops.linear").ACTIVATIONS[act][1]
    dz, db = lk.epilogue_grad(wr.tensor(g), wr.tensor(z) if act else None,
                              wr.tensor(b) if act else None, grad,
                              wr.empty((R, L)) if act else None, wr.empty((L,)))
    want = g
    if act:
        u = (z + b).astype(np.float64)
        t = np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3))
        want = g * (0.5 * (1 + t) + 0.5 * u * (1 - t ** 2) * np.sqrt(2 / np.pi)
                    * (1 + 3 * 0.044715 * u ** 2))
    np.testing.assert_allclose(dz.numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db.numpy(), want.sum(0), rtol=1e-4, atol=1e-3)


def _ln_ref(x, w, b, g):
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    rstd = 1 / np.sqrt(v + 1e-5)
    xh = (x - m) * rstd
    gw = g * w
    dx = rstd * (gw - gw.mean(-1, keepdims=True) - xh * (gw * xh).mean(-1, keepdims=True))
    return xh * w + b, dx, (g * xh).sum(0), g.sum(0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("R,L,off,tex", [(37, 12, 0, None), (37, 12, 0, False), (9, 64, 0, None),
                                         (5, 12, 1, None), (11, 10, 0, None),
                                         (64 * 65535 + 7, 4, 0, None)])
def test_layer_norm_cpu_rows_match_numpy(monkeypatch, rng, R, L, off, tex):
    """layer_norm forward and gradients through shaders/layernorm_cpu.wgsl: quads where L and
    the offsets are multiples of 4, the inputs read through textures unless TUNING.texture_reads
    is False (off 1: the input a view at offset 1, element-wise from storage), odd R;
    64 * 65,535 + 7 rows: the launch folds into (x, y) workgroups."""
    if not mc.cpu_subgroup(wr.devices()[0]):
        pytest.skip("needs a CPU adapter with known subgroups")
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    monkeypatch.setattr(TUNING, "texture_reads", tex)
    seen = []
    orig = row_kernels.Kernel.of

    def of(family, entry="main", **d):
        if family == "layernorm_cpu":
            seen.append((d["V"], "textureLoad" in d["IN_DECLS"]))
        return orig(family, entry, **d)
    monkeypatch.setattr(row_kernels.Kernel, "of", staticmethod(of))
    x = (rng.standard_normal((R, L)) * 3 + 2).astype(np.float32)
    w, b = rng.standard_normal(L).astype(np.float32), rng.standard_normal(L).astype(np.float32)
    g = rng.standard_normal((R, L)).astype(np.float32)
    xt = wr.tensor(np.concatenate([np.zeros(off, np.float32), x.ravel()]))[off:].reshape(R, L)
    ts = [wr.tensor(a, requires_grad=True) for a in (w, b)]
    xt.requires_grad = True
    y = wr.ops.layer_norm(xt, L, *ts)
    grads = wr.autograd.backward_with_grad(y, wr.tensor(g))
    quad = L % 4 == off == 0
    from wgrumus.kernels.bounds import LOOP_BUDGET  # (more subgroup partials: the `wb` pass)
    assert seen == [(4 if quad else 1, quad and tex is None)] * (1 + (R <= 8 * LOOP_BUDGET))
    tol = 1e-3 if R > 1000 else 1e-4
    for got, want in zip([y] + [grads.get(t) for t in [xt] + ts], _ln_ref(x, w, b, g)):
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol * (1 + R // 10000))


def _xent_grad_ref(a, t):
    e = np.exp(a - a.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    p[np.arange(len(t)), t] -= 1
    return p / len(t)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("N,C", [(5, 7), (2, 32768), (64 * 65535 + 7, 2)])
def test_cross_entropy_backward_rows(monkeypatch, rng, N, C):
    """cross_entropy's gradient with a row an invocation (thread row mode, xent.wgsl bwd_rows):
    odd sizes, a row at the loop budget (32,768 classes), 64 * 65,535 + 7 rows (the launch
    folds into (x, y) workgroups); ignored rows get 0 (the default-mode test_nnops cases)."""
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    a = rng.standard_normal((N, C)).astype(np.float32)
    t = rng.integers(0, C, N).astype(np.int32)
    x = wr.tensor(a, requires_grad=True)
    got = wr.autograd.backward(wr.ops.cross_entropy(x, wr.tensor(t))).get(x).numpy()
    np.testing.assert_allclose(got, _xent_grad_ref(a.astype(np.float64), t), rtol=1e-3,
                               atol=1e-6 / N ** 0.5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("off", [0, 1, 3])
@pytest.mark.parametrize("tex", [None, False])
@pytest.mark.parametrize("causal", [False, True])
def test_cached_softmax_reads_match_numpy(monkeypatch, rng, off, tex, causal):
    """softmax forward and backward through shaders/softmax_cpu.wgsl (thread row mode), the
    input a view at element offset ``off``: read through textures whose first element sits
    at that offset's place in its quad (texture.elements), or from storage (ENABLED False)."""
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    monkeypatch.setattr(TUNING, "texture_reads", tex)
    R, L = 7, 9
    x = rng.standard_normal((R, L)).astype(np.float32)
    g = rng.standard_normal((R, L)).astype(np.float32)
    xt = wr.tensor(np.concatenate([np.zeros(off, np.float32), x.ravel()]))[off:].reshape(R, L)
    xt.requires_grad = True
    y = wr.ops.softmax(xt, -1, scale=0.5, causal=causal)
    dx = wr.autograd.backward_with_grad(y, wr.tensor(g)).get(xt).numpy()
    s = x * 0.5
    if causal:
        s = np.where(np.arange(L)[None, :] <= np.arange(R)[:, None] + L - R, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(y.numpy(), p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, 0.5 * p * (g - (g * p).sum(-1, keepdims=True)), rtol=1e-4,
                               atol=1e-6)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tex", [None, False])
@pytest.mark.parametrize("n", [37, 70_001 * 16 + 5])
def test_map_texture_inputs_match_numpy(monkeypatch, rng, tex, n):
    """The chunked CPU map (16 outputs an invocation) reading contiguous f32 inputs through
    textures (views at offsets 1 and 2: their first element's place in the texture) unless
    TUNING.texture_reads is False; an in-place add (the input bound as the output) and a strided
    input read storage. 70,001 * 16 + 5 outputs: past 65,535 workgroups of 16 invocations."""
    from wgrumus.kernels import map as launch
    monkeypatch.setattr(TUNING, "map_chunk", 16)
    monkeypatch.setattr(launch, "CPU_WG", 1 if n > 1000 else 64)
    monkeypatch.setattr(TUNING, "texture_reads", tex)
    a, b = (rng.standard_normal(n + 3).astype(np.float32) for _ in range(2))
    ta, tb = wr.tensor(a)[1:n + 1], wr.tensor(b)[2:n + 2]
    np.testing.assert_allclose((ta * tb + 1.5).numpy(), a[1:n + 1] * b[2:n + 2] + 1.5,
                               rtol=1e-6, atol=1e-6)
    c = wr.tensor(a[:n].copy())
    c += tb
    np.testing.assert_allclose(c.numpy(), a[:n] + b[2:n + 2], rtol=1e-6, atol=1e-6)
    m = rng.standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_allclose((wr.tensor(m).T + wr.tensor(m.T.copy())).numpy(), 2 * m.T,
                               rtol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kpass", [None, (16, 16)])
@pytest.mark.parametrize("tex", [None, False])
def test_residual_through_texture_matches_numpy(monkeypatch, rng, kpass, tex):
    """Texture operands with quad stores: the residual read from a third operand texture too
    (in the last K pass only) unless TUNING.texture_reads is False; odd M and K."""
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    monkeypatch.setattr(TUNING, "matmul_textures", True)
    monkeypatch.setattr(TUNING, "texture_reads", tex)
    if kpass:
        monkeypatch.setattr(mc, "CPU_KPASS", kpass)
    seen = []
    orig = mc.cpu_kernel_for
    monkeypatch.setattr(mc, "cpu_kernel_for", lambda *a, **kw: seen.append(
        (kw.get("epilogue", (None, False, False))[2], kw.get("rtex"))) or orig(*a, **kw))
    M, K, N = 37, 41, 12
    x = rng.standard_normal((M, K)).astype(np.float32)
    wt = rng.standard_normal((K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    r = rng.standard_normal((M, N)).astype(np.float32)
    y = linear_2d(wr.tensor(x), wr.tensor(wt), wr.tensor(b), wr.tensor(r))
    np.testing.assert_allclose(y.numpy(), x.astype(np.float64) @ wt + b + r, rtol=1e-4,
                               atol=1e-4)
    on = texture.enabled(wr.devices()[0])  # (None: CPU adapters only)
    assert all(rt == (res and on) for res, rt in seen) and seen[-1][0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [4 * 13, 4 * 70_001])
def test_map_quads_match_numpy(monkeypatch, rng, n):
    """The chunked CPU map a quad at a time (entry `quads`: every input read through a texture
    from its start, the output a vec4 store) where every size and offset is in quads, the
    expression per component (named scalars, the element index i); per element where an input
    or the output starts mid-quad. 4 * 70,001 outputs with one quad an invocation: past 65,535
    workgroups."""
    from wgrumus.kernels import map as launch
    from wgrumus.kernels.map import run_map
    monkeypatch.setattr(TUNING, "texture_reads", True)
    monkeypatch.setattr(TUNING, "map_chunk", 4 if n > 1000 else 8)
    monkeypatch.setattr(launch, "CPU_WG", 1 if n > 1000 else 64)
    a, b, c = (rng.standard_normal(n + 4).astype(np.float32) for _ in range(3))
    ta, tb, tc = (wr.tensor(x) for x in (a, b, c))
    out = wr.zeros((n + 4,))
    seen = []
    orig = launch._cpu_kernel
    monkeypatch.setattr(launch, "_cpu_kernel", lambda *a: seen.append(a[8]) or orig(*a))
    got = run_map("a * b + s * c + f32(i % 3u)", Tensor.empty((n,), ta.device, wr.float32),
                  [ta[4:], tb[:n], tc[4:]], {"s": 0.5})
    want = a[4:] * b[:n] + 0.5 * c[4:] + np.arange(n) % 3
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((ta[1:n + 1] - tb[:n]).numpy(), a[1:n + 1] - b[:n], rtol=1e-6)
    run_map("a - b", out[4:], [ta[:n], tb[:n]])
    np.testing.assert_allclose(out.numpy()[4:], a[:n] - b[:n], rtol=1e-6)
    assert [q is not None for q in seen] == [True, False, True]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rows", [5, 70_001])
def test_map_quads_broadcast_over_leading_dims(monkeypatch, rng, rows):
    """An input repeated along the leading dims (a position embedding added over the batch)
    goes by quads too, modulo its period; one broadcast inside the row, or a period that is not
    whole quads, takes the element path. 70,001 rows of 3 quads, a quad an invocation: past
    65,535 workgroups."""
    from wgrumus.kernels import map as launch
    from wgrumus.kernels.map import run_map
    monkeypatch.setattr(TUNING, "texture_reads", True)
    monkeypatch.setattr(TUNING, "map_chunk", 4 if rows > 1000 else 8)
    monkeypatch.setattr(launch, "CPU_WG", 1 if rows > 1000 else 64)
    seen = []
    orig = launch._cpu_kernel
    monkeypatch.setattr(launch, "_cpu_kernel", lambda *a: seen.append(a[8]) or orig(*a))
    a, c = (rng.standard_normal((rows, 3, 4)).astype(np.float32) for _ in range(2))
    p = rng.standard_normal((3, 4)).astype(np.float32)
    ta, tc, tp = wr.tensor(a), wr.tensor(c), wr.tensor(p)
    np.testing.assert_allclose((ta + tp).numpy(), a + p, rtol=1e-6)
    assert seen[-1] == (False, True)
    got = run_map("a * b + c", Tensor.empty(a.shape, ta.device, wr.float32), [ta, tp, tc])
    np.testing.assert_allclose(got.numpy(), a * p + c, rtol=1e-5, atol=1e-6)
    assert seen[-1] == (False, True, False)
    np.testing.assert_allclose((tp[1:] - ta[:, 1:]).numpy(), p[1:] - a[:, 1:], rtol=1e-6)
    assert seen[-1] is None  # (the output's rows are 8 of a's 12: a strided input)
    np.testing.assert_allclose((ta + ta[:, :1]).numpy(), a + a[:, :1], rtol=1e-6)
    assert seen[-1] is None
    np.testing.assert_allclose((ta[..., :3] + tp[:, :3]).numpy(), a[..., :3] + p[:, :3],
                               rtol=1e-6)
    assert seen[-1] is None


@pytest.mark.timeout(120)
def test_map_quads_periods_word_per_input_and_replay(monkeypatch, rng):
    """Each input slot (a, b, c) takes its own period word (19, 28, 37): two inputs of
    different periods (10 and 2 quads) in every pair of slots, an output starting a quad into
    its buffer and the element index in the expression. A captured replay copies a periodic
    input anew: updated in place between replays, the replay adds the new values."""
    from wgrumus.kernels import map as launch
    from wgrumus.kernels.map import run_map
    monkeypatch.setattr(TUNING, "texture_reads", True)
    monkeypatch.setattr(TUNING, "map_chunk", 8)
    seen = []
    orig = launch._cpu_kernel
    monkeypatch.setattr(launch, "_cpu_kernel", lambda *a: seen.append(a[8]) or orig(*a))
    full = rng.standard_normal((3, 5, 8)).astype(np.float32)
    p = rng.standard_normal((5, 8)).astype(np.float32)  # 10 quads
    r = rng.standard_normal(8).astype(np.float32)  # 2 quads
    arrays = {"f": full, "p": p, "r": r}
    ts = {k: wr.tensor(v) for k, v in arrays.items()}
    iota = np.arange(full.size, dtype=np.float32).reshape(full.shape) % 7
    for order, periodic in [("rfp", (True, False, True)), ("fpr", (False, True, True)),
                            ("prf", (True, True, False))]:
        buf = Tensor.empty((4 + full.size,), ts["f"].device, wr.float32)
        out = buf[4:].reshape(full.shape)
        run_map("a * b + c + f32(i % 7u)", out, [ts[k] for k in order])
        x, y, z = (arrays[k] for k in order)
        np.testing.assert_allclose(out.numpy(), x * y + z + iota, rtol=1e-5, atol=1e-5)
        assert seen[-1] == periodic
    step, n0 = wr.jit(lambda x: x * ts["p"] + ts["r"]), len(seen)
    for k in range(4):
        x = rng.standard_normal(full.shape).astype(np.float32)
        np.testing.assert_allclose(step(wr.tensor(x)).numpy(), x * (p + k) + r, rtol=1e-5,
                                   atol=1e-5)
        run_map("a + 1.0", ts["p"], [ts["p"]])  # in place, between the replays
    assert seen[n0] == (False, True)  # (the eager call; the capture and replays compile none)


@pytest.mark.timeout(120)
def test_sparse_strided_map_inputs_read_storage(monkeypatch, rng):
    """A strided input reads through a texture only where the span copied is at most
    TEX_SPAN_MAX times its elements: a column of a wide matrix reads storage (it copied the
    whole matrix), a transpose or every other column the texture; a broadcast expand counts
    its elements once."""
    from wgrumus.kernels import map as launch
    monkeypatch.setattr(TUNING, "texture_reads", True)
    monkeypatch.setattr(TUNING, "map_chunk", 16)
    seen = []
    orig = launch._texture_inputs
    monkeypatch.setattr(launch, "_texture_inputs", lambda *a: seen.append(orig(*a)) or seen[-1])
    m = rng.standard_normal((64, 256)).astype(np.float32)
    t = wr.tensor(m)
    for view, ref, textured in [(t[:, 3:4], m[:, 3:4], False), (t[:, ::8], m[:, ::8], False),
                                (t.T, m.T, True), (t[:, ::2], m[:, ::2], True),
                                (t[5:6].expand(7, 256), np.repeat(m[5:6], 7, 0), True)]:
        np.testing.assert_array_equal((view * 2.0).numpy(), ref * 2.0)
        assert bool(seen[-1]) == textured, (view.shape, view.strides)
