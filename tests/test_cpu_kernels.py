"""The CPU-adapter kernel variants (issue 20) against numpy and against their GPU-shaped
counterparts, each forced on whatever adapter runs the tests: the chunked multi-tensor AdamW
(entry `cpu` of shaders/adam_multi.wgsl) and the chunked elementwise map
(shaders/map_cpu.wgsl), each with a launch past 65,535 workgroups."""
import numpy as np
import pytest
from test_optim import ref_adam

import wgrumus as wr
from wgrumus import nn, optim
from wgrumus.kernels import map as launch
from wgrumus.kernels import texture
from wgrumus.optim import adam
from wgrumus.runtime import profile as profile_mod
from wgrumus.runtime.tuning import TUNING

# sizes that end mid-chunk, one longer than several chunks, a scalar-sized one
SHAPES = [(3, 5), (7,), (33, 9), (1,), (64,), (5, 13)]


def _run(monkeypatch, chunk, wg, shapes, cls, kw, steps, rng, views=False):
    monkeypatch.setattr(TUNING, "update_chunk", chunk)
    monkeypatch.setattr(adam, "CPU_WG", wg)
    p0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gs = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(steps)]
    ps = [nn.Parameter(wr.tensor(x)) for x in p0]
    opt = cls(ps, **kw)
    for step in gs:
        for p, g in zip(ps, step):
            if views:  # gradients at odd offsets inside one larger buffer
                flat = wr.tensor(np.concatenate([[0.0] * 3, g.ravel()]).astype(np.float32))
                p.grad = flat[3:].reshape(g.shape)
            else:
                p.grad = wr.tensor(g)
        opt.step()
    return p0, gs, ps


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chunk", [1, 4, 16])
@pytest.mark.parametrize("cls,kw,refkw", [
    (optim.AdamW, dict(lr=0.02, weight_decay=0.1), dict(weight_decay=0.1, decoupled=True)),
    (optim.Adam, dict(lr=0.01, weight_decay=0.05), dict(weight_decay=0.05))])
def test_chunked_adam_matches_reference(monkeypatch, rng, chunk, cls, kw, refkw):
    p0, gs, ps = _run(monkeypatch, chunk, 64, SHAPES, cls, kw, 3, rng, views=chunk == 16)
    for j, p in enumerate(ps):
        want = ref_adam(p0[j], [g[j].astype(np.float64) for g in gs], lr=kw["lr"], **refkw)
        np.testing.assert_allclose(p.numpy(), want, rtol=2e-5, atol=2e-6)


@pytest.mark.timeout(300)
def test_chunked_adam_past_65535_workgroups(monkeypatch, rng):
    """One invocation per workgroup, 2 elements each: 70,001 workgroups fold into (x, y)."""
    n = 140_002
    p0, gs, ps = _run(monkeypatch, 2, 1, [(n,), (3,)], optim.AdamW, dict(lr=0.01), 1, rng)
    for j, p in enumerate(ps):
        want = ref_adam(p0[j], [gs[0][j].astype(np.float64)], lr=0.01, weight_decay=0.01,
                        decoupled=True)
        np.testing.assert_allclose(p.numpy(), want, rtol=2e-5, atol=2e-6)


def test_cpu_chunks_are_per_adapter_type(dev):
    cpu = str(dev.adapter_info.get("adapter_type", "")).lower() == "cpu"
    assert adam.cpu_chunk(dev) == (profile_mod.CPU_UPDATE_CHUNK if cpu else 1)
    assert launch.cpu_chunk(dev) == (profile_mod.CPU_MAP_CHUNK if cpu else 1)


MAP_CASES = {  # strided, broadcast and contiguous operands, rows that end mid-chunk
    "transpose": (lambda a, b: a.transpose(0, 2).contiguous(), lambda a, b: a.swapaxes(0, 2)),
    "broadcast": (lambda a, b: a * b[:, :1, :] + 1.0, lambda a, b: a * b[:, :1, :] + 1.0),
    "slice": (lambda a, b: a[:, 1:, ::2] - b[:, 1:, ::2],
              lambda a, b: a[:, 1:, ::2] - b[:, 1:, ::2]),
    "cat": (lambda a, b: wr.cat([a, b, a], dim=2), lambda a, b: np.concatenate([a, b, a], 2)),
    "two strided": (lambda a, b: a.permute(2, 0, 1) + b.permute(2, 1, 0).transpose(1, 2),
                    lambda a, b: a.transpose(2, 0, 1) + b.transpose(2, 1, 0).swapaxes(1, 2)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chunk", [1, 3])
def test_map_three_strided_operands_5d(monkeypatch, rng, chunk):
    """Attention's d(qkv) gather: three differently strided 5-D views (one with a zero
    stride) and a selecting expression, as ops/attention.py runs it."""
    from wgrumus.kernels.map import run_map
    from wgrumus.tensor import Tensor
    monkeypatch.setattr(TUNING, "map_chunk", chunk)
    B, T, H, d = 2, 3, 2, 5
    E = H * d
    parts = [rng.standard_normal((B * H, T, d)).astype(np.float32) for _ in range(3)]
    st = (H * T * d, d, 0, T * d, 1)
    views = [Tensor(wr.tensor(p)._storage, (B, T, 3, H, d), st, 0) for p in parts]
    out = Tensor.empty((B, T, 3, H, d), views[0].device, wr.float32)
    run_map("select(select(c, b, (i / u32(E)) % 3u == 1u), a, (i / u32(E)) % 3u == 0u)", out,
            views, {"E": E})
    ref = np.stack([p.reshape(B, H, T, d).transpose(0, 2, 1, 3) for p in parts], axis=2)
    np.testing.assert_array_equal(out.numpy(), ref)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chunk", [1, 3, 16])
@pytest.mark.parametrize("case", list(MAP_CASES))
def test_chunked_map_matches_numpy(monkeypatch, rng, chunk, case):
    monkeypatch.setattr(TUNING, "map_chunk", chunk)
    a, b = rng.standard_normal((2, 5, 7)), rng.standard_normal((2, 5, 7))
    a, b = a.astype(np.float32), b.astype(np.float32)
    ours, ref = MAP_CASES[case]
    np.testing.assert_allclose(ours(wr.tensor(a), wr.tensor(b)).numpy(), ref(a, b), rtol=1e-6)


@pytest.mark.timeout(300)
def test_chunked_map_past_65535_workgroups(monkeypatch, rng):
    """One invocation per workgroup, 2 outputs each: a transposing copy over 70,200
    workgroups (folded into (x, y)) whose chunks straddle rows."""
    monkeypatch.setattr(TUNING, "map_chunk", 2)
    monkeypatch.setattr(launch, "CPU_WG", 1)
    a = rng.standard_normal((117, 1200)).astype(np.float32)
    np.testing.assert_array_equal(wr.tensor(a).transpose(0, 1).contiguous().numpy(), a.T)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk,wg,shapes", [(4, 64, [(4, 8), (64,), (12, 4), (256,)]),
                                             (16, 64, [(8,), (36, 4)]),
                                             (4, 1, [(280_004,), (4,)])])
@pytest.mark.parametrize("tex", [None, False])
def test_quad_adam_matches_reference(monkeypatch, rng, chunk, wg, shapes, tex):
    """Every size and offset a multiple of 4: the update a quad at a time (vec4 arrays; ends
    and offsets in quads; p, g, m, v read through textures unless TUNING.texture_reads is False),
    against the reference and the element-wise kernel's choice when a gradient sits at offset
    3; (4, 1): 70,001 workgroups of one quad fold into (x, y)."""
    monkeypatch.setattr(TUNING, "texture_reads", tex)
    monkeypatch.setattr(adam, "CPU_TEX_MIN", 0)  # textures for the small shapes too
    seen = []
    orig = adam.cpu_kernel
    on = texture.enabled(wr.devices()[0])  # (None: CPU adapters only)
    monkeypatch.setattr(adam, "cpu_kernel", lambda *a: seen.append(a[4]) or seen.append(
        a[5] == (a[4] and on)) or orig(*a))
    for views in (False, True):
        p0, gs, ps = _run(monkeypatch, chunk, wg, shapes, optim.AdamW,
                          dict(lr=0.02, weight_decay=0.1), 2, rng, views=views)
        for j, p in enumerate(ps):
            want = ref_adam(p0[j], [g[j].astype(np.float64) for g in gs], lr=0.02,
                            weight_decay=0.1, decoupled=True)
            np.testing.assert_allclose(p.numpy(), want, rtol=2e-5, atol=2e-6)
        assert seen[::2] and all(q == (not views) for q in seen[::2]) and all(seen[1::2])
        seen.clear()


@pytest.mark.timeout(120)
def test_quad_adam_mixes_texture_and_storage_reads(monkeypatch, rng):
    """Parameters below CPU_TEX_MIN elements read storage and the others textures, in one
    dispatch (a branch each), against the reference."""
    monkeypatch.setattr(TUNING, "texture_reads", True)
    monkeypatch.setattr(adam, "CPU_TEX_MIN", 16)
    seen = []
    orig = adam.cpu_kernel
    monkeypatch.setattr(adam, "cpu_kernel", lambda *a: seen.append(a[5]) or orig(*a))
    shapes = [(4, 8), (8,), (12, 4), (4,), (16,)]
    p0, gs, ps = _run(monkeypatch, 4, 64, shapes, optim.AdamW, dict(lr=0.02, weight_decay=0.1),
                      2, rng)
    for j, p in enumerate(ps):
        want = ref_adam(p0[j], [g[j].astype(np.float64) for g in gs], lr=0.02,
                        weight_decay=0.1, decoupled=True)
        np.testing.assert_allclose(p.numpy(), want, rtol=2e-5, atol=2e-6)
    assert seen == [(True, False, True, False, True)] * 2
