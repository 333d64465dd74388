"""CPU-adapter matmul operands whose rows are not quads long (a [128, 65] logits gradient):
copied once into rows padded to quads (ops/matmul.py ``_padded``) and read as quads, a K % 4
tail element-wise; products against numpy, every layout, K past 65,535 quad steps."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.runtime.profile import profile
from wgrumus.runtime.tuning import TUNING

mm = importlib.import_module("wgrumus.ops.matmul")
mc = importlib.import_module("wgrumus.kernels.matmul_cpu")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def padded(monkeypatch):
    """Texture operands at every size (where padding applies) and the pads made."""
    monkeypatch.setattr(TUNING, "matmul_textures", True)
    made = []
    orig = mc._padded
    monkeypatch.setattr(mc, "_padded", lambda t, m: (lambda r: (made.append(r[1] != m), r)[1])(
        orig(t, m)))
    return made


def _operand(x, transposed):
    return wr.tensor(x.T.copy()).transpose(0, 1) if transposed else wr.tensor(x)


@pytest.mark.skipif(not profile(wr.devices()[0]).cpu, reason="CPU adapters only")
@pytest.mark.parametrize("m,k,n,ta,tb", [
    (128, 65, 64, False, False), (65, 128, 64, True, False), (128, 64, 65, False, False),
    (66, 130, 67, True, True), (130, 67, 66, False, True), (9, 5, 3, True, False)])
def test_padded_products_match_numpy(rng, padded, m, k, n, ta, tb):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = (_operand(a, ta) @ _operand(b, tb)).numpy()
    assert any(padded)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not profile(wr.devices()[0]).cpu, reason="CPU adapters only")
def test_linear_backward_pads_its_gradient_once(monkeypatch, rng, padded):
    """A 65-wide linear (the GPT's lm head): d(x) and d(W) read one padded copy of the
    gradient; a later product of the same tensor pads it anew."""
    from wgrumus.ops.linear import linear
    x = wr.tensor(rng.standard_normal((128, 64)).astype(np.float32), requires_grad=True)
    w = wr.tensor(rng.standard_normal((65, 64)).astype(np.float32), requires_grad=True)
    g = rng.standard_normal((128, 65)).astype(np.float32)
    y = linear(x, w)
    copies = []
    orig = mc.run_map
    monkeypatch.setattr(mc, "run_map", lambda *a, **k: (copies.append(1), orig(*a, **k))[1])
    gt = wr.tensor(g)
    grads = wr.autograd.backward_with_grad(y, gt)
    np.testing.assert_allclose(grads.get(x).numpy(), g @ w.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads.get(w).numpy(), g.T @ x.numpy(), rtol=1e-4, atol=1e-4)
    assert sum(padded) == 2 and len(copies) == 1
    for _ in range(2):  # dispatches in between: no reuse
        x + x
    np.testing.assert_allclose((gt @ w).numpy(), g @ w.numpy(), rtol=1e-4, atol=1e-4)
    assert len(copies) == 2


@pytest.mark.skipif(not profile(wr.devices()[0]).cpu, reason="CPU adapters only")
def test_padded_long_k(rng, padded):
    """K = 270,001: two passes of at most 65,000 quad steps each, then a 1-element tail."""
    a = rng.standard_normal((3, 270_001)).astype(np.float32)
    b = rng.standard_normal((270_001, 2)).astype(np.float32)
    got = (wr.tensor(a) @ wr.tensor(b)).numpy()
    assert sum(padded) == 2
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-3, atol=1e-2)


@pytest.mark.skipif(not profile(wr.devices()[0]).cpu, reason="CPU adapters only")
def test_no_pad_reuse_across_a_replay(rng, padded):
    """A replay that writes the operand in place (one dispatch, no version bump) between two
    products: the second pads the new values (it reused the stale pad within the window)."""
    a0, b0, w0 = (rng.standard_normal(s).astype(np.float32)
                  for s in ((16, 65), (16, 65), (65, 8)))
    a, w = wr.tensor(a0), wr.tensor(w0)

    def write(b):
        a[...] = b
    fn = wr.jit(write)
    for _ in range(3):  # warm-up, capture, a replay
        fn(wr.tensor(a0))
    a @ w  # pads a (its old values)
    fn(wr.tensor(b0))  # replayed: a = b0
    _, made_at, _ = mc._PADS[a._storage]  # the case: a's pad is within the reuse window
    assert a.device.dispatches - made_at <= mc.PAD_REUSE
    np.testing.assert_allclose((a @ w).numpy(), b0 @ w0, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not profile(wr.devices()[0]).cpu, reason="CPU adapters only")
def test_no_pad_past_one_binding(monkeypatch, rng, padded):
    """An operand that just fits the largest binding (a limit made that small here) whose
    padded rows would not: read unpadded (the pad raised an AdapterLimitError)."""
    a0, w0 = rng.standard_normal((16, 65)).astype(np.float32), \
        rng.standard_normal((65, 8)).astype(np.float32)
    a, w = wr.tensor(a0), wr.tensor(w0)
    monkeypatch.setattr(a.device, "max_binding", a0.nbytes)
    np.testing.assert_allclose((a @ w).numpy(), a0 @ w0, rtol=1e-4, atol=1e-4)
    assert padded == [False, False]
