"""matmul against numpy: every load mode (row-major, transposed, odd strides), both tile sizes,
shapes that are not multiples of the tiles, K=1, batches, broadcasting, gradients."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.runtime.tuning import TUNING

mm = importlib.import_module("wgrumus.ops.matmul")
mg = importlib.import_module("wgrumus.kernels.matmul_gpu")
mc = importlib.import_module("wgrumus.kernels.matmul_cpu")
TILES = [(4, 16, 0), (8, 8, 0), (4, 16, 3)]  # tiled kernel: (TM, BK, swizzle rows)
# CPU-adapter kernel (matmul_cpu.wgsl): (TM, TN, WGX, WGY, FLAT, operands in textures, A's
# rows shared over the subgroup (where A's K is contiguous; lavapipe's subgroups: 8 lanes))
CPU_TILES = [(8, 8, 4, 4, 0, False, False), (4, 8, 2, 8, 0, False, False),
             (1, 4, 1, 64, 1, False, False), (16, 8, 8, 1, 0, True, False),
             (8, 4, 4, 2, 0, True, False), (1, 4, 1, 64, 1, True, False),
             (32, 4, 8, 1, 0, True, True), (8, 4, 8, 1, 0, True, True),
             (32, 8, 8, 1, 0, True, True)]
# a storage-operand block that steps K one at a time (slow to compile: one test)
CPU_K1 = (16, 16, 4, 4, 0, False, False)


@pytest.fixture
def tile(request):
    """Force one kernel and its register tiling for the duration of a test."""
    cpu = len(request.param) == 7
    orig = mg._pick_tile, mc._cpu_tile, TUNING.cpu_matmul
    TUNING.cpu_matmul = cpu
    if cpu:
        mc._cpu_tile = lambda *a: request.param
    else:
        mg._pick_tile = lambda *a: request.param
    yield request.param
    mg._pick_tile, mc._cpu_tile, TUNING.cpu_matmul = orig


def _operand(rng, shape, transposed, dev):
    """A tensor of `shape`; transposed=True makes it a transposed view of a stored array."""
    if transposed:
        base = rng.standard_normal(shape[:-2] + (shape[-1], shape[-2])).astype(np.float32)
        return wr.tensor(base, device=dev).transpose(-1, -2), np.swapaxes(base, -1, -2)
    a = rng.standard_normal(shape).astype(np.float32)
    return wr.tensor(a, device=dev), a


def _check(out, ref, k):
    assert out.shape == ref.shape
    tol = 1e-5 * max(1.0, np.sqrt(k)) * max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(out.numpy(), ref, atol=tol, rtol=1e-4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tile", TILES + CPU_TILES + [CPU_K1], indirect=True)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("M,N,K", [(64, 64, 16), (68, 132, 40), (130, 68, 36), (5, 7, 3),
                                   (1, 9, 12), (12, 1, 8), (64, 64, 1), (17, 33, 129)])
def test_layouts_and_shapes(dev, rng, tile, ta, tb, M, N, K):
    a, an = _operand(rng, (M, K), ta, dev)
    b, bn = _operand(rng, (K, N), tb, dev)
    _check(a @ b, an @ bn, K)


def test_load_modes_are_specialised(dev, rng):
    """Contiguous and transposed operands take the vec4 paths; odd strides the gather path."""
    modes = []
    orig, cpu = mg.kernel_for, TUNING.cpu_matmul
    TUNING.cpu_matmul = False  # the tiled kernel (the CPU kernel: test_cpu_kernel_load_modes)
    mg.kernel_for = lambda tm, bk, am, bm, *r, **kw: (modes.append((am, bm)),
                                                      orig(tm, bk, am, bm, *r, **kw))[1]
    try:
        a = wr.tensor(rng.standard_normal((32, 16)).astype(np.float32), device=dev)
        b = wr.tensor(rng.standard_normal((16, 24)).astype(np.float32), device=dev)
        a @ b
        a.T.contiguous().T @ b.T.contiguous().T
        wr.tensor(rng.standard_normal((32, 18)).astype(np.float32), device=dev)[:, 1:17] @ b
    finally:
        mg.kernel_for, TUNING.cpu_matmul = orig, cpu
    assert modes == [(0, 0), (1, 1), (2, 0)]


@pytest.mark.timeout(60)
def test_strided_views(dev, rng):
    base = rng.standard_normal((40, 50)).astype(np.float32)
    t = wr.tensor(base, device=dev)
    a, an = t[1:34:2, 3:30], base[1:34:2, 3:30]  # odd row stride, offset 53
    b, bn = t[10:37, ::6], base[10:37, ::6]  # 27 x 9, column stride 6
    _check(a @ b, an @ bn, 27)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tile", TILES + CPU_TILES, indirect=True)
def test_batched_and_broadcast(dev, rng, tile):
    a, an = _operand(rng, (3, 20, 12), False, dev)
    b, bn = _operand(rng, (3, 12, 8), True, dev)
    _check(a @ b, an @ bn, 12)
    w, wn = _operand(rng, (12, 8), False, dev)  # one B for every batch entry
    _check(a @ w, an @ wn, 12)
    c, cn = _operand(rng, (2, 1, 20, 12), False, dev)
    d, dn = _operand(rng, (3, 12, 5), False, dev)
    _check(c @ d, cn @ dn, 12)


def test_vector_operands(dev, rng):
    a, an = _operand(rng, (6, 5), False, dev)
    v = rng.standard_normal(5).astype(np.float32)
    u = rng.standard_normal(6).astype(np.float32)
    tv, tu = wr.tensor(v, device=dev), wr.tensor(u, device=dev)
    _check(a @ tv, an @ v, 5)
    _check(tu @ a, u @ an, 6)
    np.testing.assert_allclose((tv @ tv).numpy(), v @ v, rtol=1e-5)


def test_k_zero_and_empty(dev):
    a = wr.zeros((3, 0), device=dev)
    b = wr.zeros((0, 4), device=dev)
    np.testing.assert_array_equal((a @ b).numpy(), np.zeros((3, 4), np.float32))
    assert (wr.zeros((0, 5), device=dev) @ wr.zeros((5, 2), device=dev)).shape == (0, 2)


def test_shape_error_names_both_shapes(dev):
    with pytest.raises(wr.ShapeError, match=r"\(3, 4\).*\(5, 2\)"):
        wr.zeros((3, 4), device=dev) @ wr.zeros((5, 2), device=dev)


@pytest.mark.timeout(60)
def test_gradients(dev, rng):
    a, an = _operand(rng, (2, 9, 6), False, dev)
    b, bn = _operand(rng, (6, 7), False, dev)
    a.requires_grad_()
    b.requires_grad_()
    g = rng.standard_normal((2, 9, 7)).astype(np.float32)
    ((a @ b) * wr.tensor(g, device=dev)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), g @ bn.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), np.einsum("bmk,bmn->kn", an, g),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tile", TILES[:2] + CPU_TILES, indirect=True)
def test_float16_storage(dev, rng, tile):
    """f16 @ f16 -> f16 with f32 accumulation (adapters with shader-f16)."""
    if "shader-f16" not in dev.features:
        pytest.skip("adapter has no shader-f16")
    an = rng.standard_normal((70, 36)).astype(np.float16)
    bn = rng.standard_normal((20, 36)).astype(np.float16)  # used transposed
    a = wr.tensor(an, device=dev)
    b = wr.tensor(bn, device=dev).transpose(0, 1)
    out = a @ b
    assert out.dtype == np.float16
    ref = an.astype(np.float32) @ bn.astype(np.float32).T
    np.testing.assert_allclose(out.numpy().astype(np.float32), ref, rtol=1e-2, atol=2e-2)
    mixed = a @ wr.tensor(bn.astype(np.float32), device=dev).transpose(0, 1)
    assert mixed.dtype == np.float32
    np.testing.assert_allclose(mixed.numpy(), ref, rtol=1e-4, atol=1e-3)


def test_tile_choice():
    from types import SimpleNamespace
    gpu = SimpleNamespace(adapter_info={"adapter_type": "DiscreteGPU"})
    cpu = SimpleNamespace(adapter_info={"adapter_type": "CPU"})
    assert mg._pick_tile(gpu, 64, 64, 1)[0] == 4
    assert mg._pick_tile(gpu, 1024, 1024, 1)[0] == 4  # 64 big tiles would leave SMs idle
    assert mg._pick_tile(gpu, 4096, 4096, 1)[0] == 8
    assert mg._pick_tile(gpu, 1024, 1024, 8)[0] == 8  # batches fill the GPU too
    assert mg._pick_tile(cpu, 4096, 4096, 1)[0] == 4


EPILOGUES = [(True, False, None), (False, True, None), (True, True, None), (True, False, "relu"),
             (False, False, "relu")]
# the 32x8 CPU block takes two of them (together every part): each of its epilogue kernels
# costs lavapipe seconds to compile, and the epilogue code is the same for every block
BIG_CPU_TILE = CPU_TILES[-1]


@pytest.mark.parametrize("tile,bias,residual,act", [
    (t, *e) for t in TILES + CPU_TILES for e in EPILOGUES
    if t != BIG_CPU_TILE or e in ((True, True, None), (True, False, "relu"))],
    indirect=["tile"])
@pytest.mark.parametrize("M,K,N", [(37, 20, 19), (130, 64, 132), (5, 0, 6)])
def test_linear_epilogue_matches_numpy(dev, tile, bias, residual, act, M, K, N):
    """Bias, residual and ReLU applied in the matmul's store, offsets included; K=0 too."""
    rng = np.random.default_rng(M + K + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    want = x @ w.T
    b = r = None
    if bias:
        bh = rng.standard_normal(N + 3).astype(np.float32)
        b = wr.tensor(bh, device=dev)[3:]  # a view at an offset
        want = want + bh[3:]
    if residual:
        rh = rng.standard_normal((M + 1, N)).astype(np.float32)
        r = wr.tensor(rh, device=dev)[1:]
        want = want + rh[1:]
    if act:
        want = np.maximum(want, 0)
    wt = wr.tensor(w, device=dev).transpose(0, 1)
    got = mm.linear_2d(wr.tensor(x, device=dev), wt, b, r, "max({z}, 0.0)" if act else None)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_cpu_kernel_load_modes(dev, rng, monkeypatch):
    """The CPU kernel reads contiguous and transposed operands as vec4, odd strides element-wise,
    and is the one CPU adapters get by default."""
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    modes = []
    orig = mc.cpu_kernel_for
    monkeypatch.setattr(mc, "cpu_kernel_for", lambda *a, **kw: (modes.append(a[4:6]),
                                                               orig(*a, **kw))[1])
    a = wr.tensor(rng.standard_normal((32, 16)).astype(np.float32), device=dev)
    b = wr.tensor(rng.standard_normal((16, 24)).astype(np.float32), device=dev)
    a @ b
    a.T.contiguous().T @ b.T.contiguous().T
    wr.tensor(rng.standard_normal((32, 18)).astype(np.float32), device=dev)[:, 1:17] @ b
    assert modes == [(0, 0), (1, 1), (2, 0)]
    assert ("VEC", "1") in orig(8, 8, 4, 4, 1, 1).defines
    assert ("VEC", "0") in orig(8, 8, 4, 4, 2, 0).defines
    from types import SimpleNamespace
    monkeypatch.setattr(TUNING, "cpu_matmul", None)
    assert mc.use_cpu_kernel(SimpleNamespace(adapter_info={"adapter_type": "CPU"}))
    assert not mc.use_cpu_kernel(SimpleNamespace(adapter_info={"adapter_type": "DiscreteGPU"}))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tile", CPU_TILES[:1] + CPU_TILES[2:4] + CPU_TILES[6:7],
                         indirect=True)
@pytest.mark.parametrize("K,aligned", [(270_000, True), (70_001, False)])
def test_cpu_kernel_k_past_loop_cap(dev, rng, tile, K, aligned):
    """K past llvmpipe's 65,535 loop back-edges per invocation (vec4 steps: 4 K a trip;
    element-wise: 1): split into passes that add up in C."""
    an = rng.standard_normal((3, K)).astype(np.float32)
    bn = rng.standard_normal((K, 4 if aligned else 6)).astype(np.float32)
    a, b = wr.tensor(an, device=dev), wr.tensor(bn, device=dev)
    if not aligned:  # a column-offset view: element-wise loads
        b = wr.tensor(np.pad(bn, ((0, 0), (1, 0))), device=dev)[:, 1:]
    out = (a @ b).numpy()
    ref = an.astype(np.float64) @ bn.astype(np.float64)
    tol = 2e-3 * np.sqrt(K) / 10
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=tol)
    bias = rng.standard_normal(bn.shape[1]).astype(np.float32)  # epilogue in the last pass only
    fused = mm.linear_2d(a, b, bias=wr.tensor(bias, device=dev), activation="max({z}, 0.0)")
    np.testing.assert_allclose(fused.numpy(), np.maximum(ref + bias, 0), rtol=1e-3, atol=tol)


@pytest.mark.timeout(120)
def test_tiny_batched_matrices(dev, rng):
    """(70000, 2, 2) @ (2, 2) runs as one 2-D product and (70000, 2, 2) @ (70000, 2, 2) as one
    FLAT launch (more batches than a dispatch dimension holds); gradients through the route."""
    an = rng.standard_normal((70_000, 2, 2)).astype(np.float32)
    bn = rng.standard_normal((70_000, 2, 2)).astype(np.float32)
    wn = rng.standard_normal((2, 2)).astype(np.float32)
    a, b = wr.tensor(an, device=dev), wr.tensor(bn, device=dev)
    w = wr.tensor(wn, device=dev, requires_grad=True)
    np.testing.assert_allclose((a @ b).numpy(), an @ bn, rtol=1e-5, atol=1e-5)
    out = a @ w
    np.testing.assert_allclose(out.numpy(), an @ wn, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.einsum("bmk,bmn->kn", an, np.ones_like(an)),
                               rtol=1e-3, atol=1e-2)
    v = rng.standard_normal(2).astype(np.float32)
    np.testing.assert_allclose((a @ wr.tensor(v, device=dev)).numpy(), an @ v, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tex", [False, True])
def test_cpu_kernel_past_65535_workgroups(dev, rng, monkeypatch, tex):
    """More batch entries than a dispatch dimension holds (launched in z slices of 65,535) and
    a texture operand past one row of TEX_W texels, storage and texture operands alike."""
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    monkeypatch.setattr(TUNING, "matmul_textures", tex)
    monkeypatch.setattr(mc, "_cpu_tile", lambda *a: (4, 4, 1, 1, 0))
    an = rng.standard_normal((70_000, 4, 3)).astype(np.float32)
    bn = rng.standard_normal((70_000, 3, 4)).astype(np.float32)
    a, b = wr.tensor(an, device=dev), wr.tensor(bn, device=dev)
    np.testing.assert_allclose((a @ b).numpy(), an @ bn, rtol=1e-5, atol=1e-5)


def test_cpu_textures_choice_and_fallbacks(dev, rng, monkeypatch):
    """CPU adapters read f32 operands from textures by default; an operand region taller than
    the adapter's textures takes the storage kernel, with the same results; a wr.jit capture
    keeps textures (it records the texture copies)."""
    from types import SimpleNamespace
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    texs = []
    orig = mc.cpu_kernel_for
    monkeypatch.setattr(mc, "cpu_kernel_for", lambda *a, **kw: (texs.append(kw["tex"]),
                                                               orig(*a, **kw))[1])
    an = rng.standard_normal((40, 300)).astype(np.float32)
    bn = rng.standard_normal((300, 24)).astype(np.float32)
    a, b = wr.tensor(an, device=dev), wr.tensor(bn, device=dev)
    cpu = SimpleNamespace(adapter_info={"adapter_type": "CPU"}, recorder=None)
    assert mc.use_cpu_textures(cpu, False) and not mc.use_cpu_textures(cpu, True)
    assert not mc.use_cpu_textures(cpu, False, mc.CPU_TEX_MIN - 1)  # copies cost more
    gpu = SimpleNamespace(adapter_info={"adapter_type": "DiscreteGPU"}, recorder=None)
    assert not mc.use_cpu_textures(gpu, False)
    monkeypatch.setattr(TUNING, "matmul_textures", True)
    np.testing.assert_allclose((a @ b).numpy(), an @ bn, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(dev, "raw_copy", None)  # the copies through wgpu-py's API
    np.testing.assert_allclose((a @ b).numpy(), an @ bn, rtol=1e-4, atol=1e-4)
    monkeypatch.setitem(dev.limits, "max-texture-dimension-2d", 2)  # A needs 3 rows
    np.testing.assert_allclose((a @ b).numpy(), an @ bn, rtol=1e-4, atol=1e-4)
    monkeypatch.undo()
    assert texs == [True, True, False]
    assert mc.use_cpu_textures(SimpleNamespace(adapter_info={"adapter_type": "CPU"},
                                               recorder=object()), False)  # capturing
    lp = lambda bits, feats: SimpleNamespace(adapter_info={
        "device": f"llvmpipe (LLVM 15.0.6, {bits} bits)"}, features=feats)
    assert mc.cpu_subgroup(lp(256, {"subgroup"})) == 8  # llvmpipe: its vector width
    assert mc.cpu_subgroup(lp(128, {"subgroup"})) == 4
    assert mc.cpu_subgroup(lp(256, set())) == 0
    assert mc.cpu_subgroup(SimpleNamespace(adapter_info={"device": "SwiftShader"},
                                           features={"subgroup"})) == 0


@pytest.mark.parametrize("sg", [False, True])
def test_cpu_textures_offset_views(dev, rng, monkeypatch, sg):
    """Texture operands of views that start inside their buffer: quad-aligned (vec4 loads,
    A rows shared over the subgroup or not), misaligned (element loads), transposed, batched."""
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    monkeypatch.setattr(TUNING, "matmul_textures", True)
    monkeypatch.setattr(TUNING, "matmul_subgroup_rows", None if sg else False)
    base = rng.standard_normal((3, 50, 64)).astype(np.float32)
    t = wr.tensor(base, device=dev)
    bn = rng.standard_normal((32, 40)).astype(np.float32)
    b = wr.tensor(np.pad(bn, ((2, 0), (4, 0))), device=dev)[2:, 4:]  # offset 92
    texs = []
    orig = mc.cpu_kernel_for
    monkeypatch.setattr(mc, "cpu_kernel_for", lambda *a, **kw: (texs.append(kw["tex"]),
                                                               orig(*a, **kw))[1])
    for sl, tr in ((np.s_[1, 1:45, 4:36], False), (np.s_[1, 1:45, 3:35], False),
                   (np.s_[2, 3:35, 8:52], True)):
        a, an = t[sl], base[sl]
        if tr:  # 44 x 32, M contiguous
            a, an = a.transpose(0, 1), an.T
        _check(a @ b, an @ bn, 32)
    _check(t[:, 2:34, 0:32] @ b, base[:, 2:34, 0:32] @ bn, 32)  # batched, batch stride 3200
    assert texs and all(texs)
