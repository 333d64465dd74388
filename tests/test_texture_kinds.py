"""Operand textures bound as read-only storage textures (runtime/device.py TEX_STORAGE, the
default) or as sampled textures: the texture-operand matmul and a texture-read kernel (layer_norm)
match numpy either way, with odd sizes and a transposed operand."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.kernels import rows as row_kernels
from wgrumus.runtime import device as rdev
from wgrumus.runtime.tuning import TUNING

mc = importlib.import_module("wgrumus.kernels.matmul_cpu")


@pytest.fixture(params=[True, False], ids=["storage", "sampled"])
def kind(request, monkeypatch):
    monkeypatch.setattr(rdev, "TEX_STORAGE", request.param)
    mc.cpu_kernel_for.cache_clear()  # its OPERANDS text depends on the kind
    yield request.param
    mc.cpu_kernel_for.cache_clear()


def _decls_seen(monkeypatch, module, family: str, define: str) -> list:
    """The ``define`` of every ``family`` kernel that ``module`` builds from now on."""
    seen, orig = [], module.Kernel.of

    def of(fam, entry="main", **d):
        if fam == family:
            seen.append(d[define])
        return orig(fam, entry, **d)
    monkeypatch.setattr(module.Kernel, "of", staticmethod(of))
    return seen


def _declared(kind: bool) -> str:
    return "texture_storage_2d<rgba32float, read>" if kind else "texture_2d<f32>"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("m,k,n,bt", [(37, 20, 52, False), (64, 36, 72, True), (5, 8, 12, False)])
def test_texture_matmul_matches_numpy(monkeypatch, rng, kind, m, k, n, bt):
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    monkeypatch.setattr(TUNING, "matmul_textures", True)
    seen = _decls_seen(monkeypatch, mc, "matmul_cpu", "OPERANDS")
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    tb = wr.tensor(b.T.copy()).T if bt else wr.tensor(b)
    got = (wr.tensor(a) @ tb).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    assert seen and all(_declared(kind) in s for s in seen)


@pytest.mark.timeout(120)
def test_texture_layer_norm_matches_numpy(monkeypatch, rng, kind):
    if not mc.cpu_subgroup(wr.devices()[0]):
        pytest.skip("needs a CPU adapter with known subgroups")
    monkeypatch.setattr(TUNING, "row_mode", "thread")
    monkeypatch.setattr(TUNING, "texture_reads", True)
    seen = _decls_seen(monkeypatch, row_kernels, "layernorm_cpu", "IN_DECLS")
    x = (rng.standard_normal((19, 12)) * 2 + 1).astype(np.float32)
    w, b = rng.standard_normal(12).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    y = wr.ops.layer_norm(wr.tensor(x), 12, wr.tensor(w), wr.tensor(b)).numpy()
    xh = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, xh * w + b, rtol=1e-4, atol=1e-4)
    assert seen and all(_declared(kind) in s for s in seen)
