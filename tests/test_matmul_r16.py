"""Autocast's matmul reads float32 operands and rounds them to f16 as its kernel loads them
(R16 in shaders/matmul.wgsl and matmul_cpu.wgsl), storing float32: against numpy on the
f16-rounded operands for the CPU kernel's blocks, the GPU kernel's tiles and variants (packed
f16 math, split-K, k-contiguous tiles), every load layout, the fused linear epilogue, and K past
llvmpipe's loop cap; and no cast passes of its own."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.nn import functional as F
from wgrumus.runtime.tuning import TUNING

mc = importlib.import_module("wgrumus.kernels.matmul_cpu")
mg = importlib.import_module("wgrumus.kernels.matmul_gpu")
pytestmark = pytest.mark.skipif("shader-f16" not in wr.devices()[0].features,
                                reason="the adapter has no shader-f16")

KERNELS = [("tile", (4, 16, 0)), ("tile", (8, 8, 3)), ("cpu", (8, 8, 4, 4, 0)),
           ("cpu", (4, 8, 2, 8, 0)), ("cpu", (1, 4, 1, 64, 1)), ("variant", "h64"),
           ("variant", "h64k32"), ("variant", "t64s2"), ("variant", "t64ak")]  # H100's f16 table


@pytest.fixture
def kernel(request, monkeypatch):
    kind, spec = request.param
    monkeypatch.setattr(TUNING, "cpu_matmul", kind == "cpu")
    if kind == "cpu":
        monkeypatch.setattr(mc, "_cpu_tile", lambda *a: spec)
    elif kind == "tile":
        monkeypatch.setattr(mg, "_pick_variant", lambda *a: None)
        monkeypatch.setattr(mg, "_pick_tile", lambda *a: spec)
    else:
        monkeypatch.setattr(mg, "_pick_variant", lambda *a: mg.VARIANTS[spec])
    return spec


def r16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _operand(rng, shape, transposed):
    if transposed:
        base = rng.standard_normal(shape[:-2] + (shape[-1], shape[-2])).astype(np.float32)
        return wr.tensor(base).transpose(-1, -2), np.swapaxes(base, -1, -2)
    a = rng.standard_normal(shape).astype(np.float32)
    return wr.tensor(a), a


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernel", KERNELS, indirect=True, ids=[str(k[1]) for k in KERNELS])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("sa,sb", [((64, 64), (64, 128)), ((37, 20), (20, 19)),
                                   ((3, 32, 24), (3, 24, 40)), ((5, 7, 9), (9, 6))])
def test_products_of_f16_rounded_operands(kernel, rng, ta, tb, sa, sb):
    a, an = _operand(rng, sa, ta)
    b, bn = _operand(rng, sb, tb)
    with wr.autocast():
        out = a @ b
    assert out.dtype == np.float32
    want = r16(an) @ r16(bn)
    half = isinstance(kernel, str) and mg.VARIANTS[kernel].get("half")  # packed f16 sums
    tol = 2e-2 if half else 1e-5 * np.sqrt(sa[-1])
    np.testing.assert_allclose(out.numpy(), want, rtol=tol, atol=tol * np.abs(want).max())
    assert np.abs(out.numpy() - an.astype(np.float64) @ bn).max() > 1e-4  # it did round


@pytest.mark.parametrize("kernel", [KERNELS[0], KERNELS[2]], indirect=True, ids=["tile", "cpu"])
@pytest.mark.parametrize("act", [None, "relu", "gelu_tanh"])
def test_linear_under_autocast_fuses_its_epilogue(kernel, rng, act):
    """Bias, residual, ReLU or gelu in the matmul's store (no map pass; gelu's store also
    keeps its argument), of the rounded product, with float32 gradients."""
    x = rng.standard_normal((2, 9, 20)).astype(np.float32)
    w = rng.standard_normal((12, 20)).astype(np.float32)
    bias = rng.standard_normal(12).astype(np.float32)
    res = rng.standard_normal((2, 9, 12)).astype(np.float32) if act is None else None
    xt, wt, bt = (wr.tensor(v, requires_grad=True) for v in (x, w, bias))
    dev = wr.devices()[0]
    before = dev.dispatches
    with wr.autocast():
        y = F.linear(xt, wt, bt, act, None if res is None else wr.tensor(res))
    dispatches = dev.dispatches - before
    z = r16(x) @ r16(w).T + bias + (0 if res is None else res)
    want = {None: z, "relu": np.maximum(z, 0),
            "gelu_tanh": 0.5 * z * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))}[act]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
    assert dispatches == 1
    g = rng.standard_normal(y.shape).astype(np.float32)
    with wr.autocast():
        (y * wr.tensor(g)).sum().backward()
    dz = g * (z > 0) if act == "relu" else g
    if act != "gelu_tanh":  # the gelu derivative is checked against f32 in test_amp.py
        np.testing.assert_allclose(wt.grad.numpy(), (r16(dz).reshape(-1, 12).T
                                                      @ r16(x).reshape(-1, 20)),
                                   rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(xt.grad.numpy(), r16(dz) @ r16(w), rtol=1e-3, atol=1e-3)


def test_no_cast_passes(dev, rng):
    """A matmul under autocast is one dispatch, as in float32."""
    a = wr.tensor(rng.standard_normal((16, 32)).astype(np.float32))
    b = wr.tensor(rng.standard_normal((32, 8)).astype(np.float32))
    before = dev.dispatches
    with wr.autocast():
        a @ b
    assert dev.dispatches - before == 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kernel", [KERNELS[2]], indirect=True, ids=["cpu"])
def test_k_past_loop_cap(kernel, rng):
    """K = 270,000 (past 65,535 vec4 steps per invocation): passes adding up in C, each
    rounding its operands."""
    K = 270_000
    an = rng.standard_normal((3, K)).astype(np.float32)
    bn = rng.standard_normal((K, 4)).astype(np.float32)
    with wr.autocast():
        out = (wr.tensor(an) @ wr.tensor(bn)).numpy()
    want = r16(an) @ r16(bn)
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=2e-3 * np.sqrt(K) / 10)


def test_rounding_to_f16_is_bit_exact_on_every_adapter(rng):
    """common.wgsl's round_f16_ (integer arithmetic, which drivers cannot fold away the way the
    NVIDIA driver folds f32 -> f16 -> f32 conversions) against numpy: every magnitude, ties,
    the overflow edge, subnormals, zeros, infinities, NaNs and random bit patterns."""
    from wgrumus.kernels.map import run_map
    x = np.concatenate([rng.standard_normal(512) * s for s in (1e-8, 1e-6, 6e-5, 1e-3, 1, 3e4)]
                       + [np.array([65504, 65519.99, 65520, -65520, 2.0 ** -24, 2.0 ** -25,
                                    3 * 2.0 ** -25, 2.0 ** -14, 0.0, -0.0, np.inf, -np.inf])])
    x = np.concatenate([x.astype(np.float32), np.frombuffer(
        rng.integers(0, 2 ** 32, 70_000, dtype=np.uint32).tobytes(), np.float32)])
    out = wr.zeros(x.shape)
    got = run_map("round_f16_(a)", out, [wr.tensor(x)]).numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), list(zip(x[~same][:5], got[~same][:5], want[~same][:5]))
