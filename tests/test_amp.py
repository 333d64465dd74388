"""Mixed precision (wgrumus/amp.py): autocast runs matmul / linear / conv / attention in f16
with f32 results and f32 gradients, keeps the row ops in f32; GradScaler's dynamic loss
scaling; the clear error without shader-f16; `wgrumus train --precision f16`."""
import json

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.nn import functional as F
from wgrumus.runtime.errors import AdapterLimitError, WgrumusError

pytestmark = pytest.mark.skipif(
    "shader-f16" not in wr.devices()[0].features, reason="the adapter has no shader-f16")


def f16(a):
    """Values rounded to f16 (what the f16 kernels see), back in f32."""
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def test_matmul_runs_in_f16_with_f32_result(rng):
    a = rng.standard_normal((33, 70)).astype(np.float32)
    b = rng.standard_normal((70, 20)).astype(np.float32)
    with wr.autocast(dtype=wr.float16):
        y = wr.tensor(a) @ wr.tensor(b)
    assert y.dtype == np.float32
    # f16 operands, f32 accumulation, the f16 result of the kernel cast back to f32
    np.testing.assert_allclose(y.numpy(), f16(f16(a) @ f16(b)), rtol=1e-3, atol=1e-3)
    assert np.abs(y.numpy() - a @ b).max() > 1e-4  # it did not run in f32
    y32 = wr.tensor(a) @ wr.tensor(b)  # outside the block: f32 again
    np.testing.assert_allclose(y32.numpy(), a @ b, rtol=1e-5, atol=1e-4)


def test_batched_broadcast_matmul(rng):
    a = rng.standard_normal((3, 5, 8)).astype(np.float32)
    b = rng.standard_normal((8, 6)).astype(np.float32)
    with wr.autocast():
        y = wr.tensor(a) @ wr.tensor(b)
    np.testing.assert_allclose(y.numpy(), f16(f16(a) @ f16(b)), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh"])
def test_linear_gradients_are_f32_and_close(rng, activation):
    """Parameters stay f32 and get f32 gradients within f16 rounding of the f32 ones."""
    x = rng.standard_normal((6, 4, 24)).astype(np.float32)
    lin = wr.nn.Linear(24, 16, seed=1)
    res = rng.standard_normal((6, 4, 16)).astype(np.float32) if activation is None else None
    grads = []
    for on in (True, False):
        xt = wr.tensor(x, requires_grad=True)
        lin.zero_grad()
        with wr.autocast(enabled=on):
            y = F.linear(xt, lin.weight, lin.bias, activation,
                         None if res is None else wr.tensor(res))
        assert y.dtype == np.float32
        (y * y).sum().backward()
        grads.append([y.numpy(), xt.grad, lin.weight.grad, lin.bias.grad])
    assert lin.weight.dtype == np.float32
    for lo, hi in zip(*grads):
        lo, hi = np.asarray(lo), np.asarray(hi)
        assert lo.dtype == np.float32
        np.testing.assert_allclose(lo, hi, rtol=2e-2, atol=2e-2 * np.abs(hi).max())
        assert not np.array_equal(lo, hi)


def test_conv_and_attention_under_autocast(rng):
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    conv = wr.nn.Conv2d(3, 4, 3, padding=1, seed=0)
    mha = wr.nn.MultiheadAttention(16, 2, causal=True, seed=0)
    s = rng.standard_normal((2, 10, 16)).astype(np.float32)
    with wr.autocast():
        c16, a16 = conv(wr.tensor(x)).numpy(), mha(wr.tensor(s)).numpy()
    c32, a32 = conv(wr.tensor(x)).numpy(), mha(wr.tensor(s)).numpy()
    for lo, hi in ((c16, c32), (a16, a32)):
        np.testing.assert_allclose(lo, hi, rtol=1e-2, atol=1e-2)
        assert not np.array_equal(lo, hi)


def test_row_ops_and_losses_stay_f32(rng):
    """Softmax, layer norm, reductions and cross-entropy give bit-identical f32 results."""
    x = rng.standard_normal((5, 33)).astype(np.float32)
    t = rng.integers(0, 33, 5).astype(np.int32)
    ln = wr.nn.LayerNorm(33)

    def run():
        xt = wr.tensor(x)
        return [xt.softmax(-1).numpy(), ln(xt).numpy(), xt.sum(-1).numpy(),
                F.cross_entropy(xt, wr.tensor(t)).numpy()]
    with wr.autocast():
        inside = run()
    for a, b in zip(inside, run()):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)


def test_backward_keeps_the_forward_precision(rng):
    """An f32 forward's backward stays f32 even when backward() is called under autocast."""
    a = rng.standard_normal((7, 9)).astype(np.float32)
    b = rng.standard_normal((9, 5)).astype(np.float32)
    ta = wr.tensor(a, requires_grad=True)
    y = ta @ wr.tensor(b)
    with wr.autocast():
        y.sum().backward()
    np.testing.assert_allclose(ta.grad.numpy(), np.ones((7, 5)) @ b.T, rtol=1e-5, atol=1e-5)


def test_without_shader_f16_a_clear_error(dev, monkeypatch):
    """Simulated through the device's feature set: autocast and the f16 casts refuse."""
    monkeypatch.setattr(dev, "features", dev.features - {"shader-f16"})
    with pytest.raises(AdapterLimitError, match="shader-f16"), wr.autocast(device=dev):
        pass
    with pytest.raises(AdapterLimitError, match="shader-f16"):
        wr.tensor(np.ones(3, np.float32), device=dev).half()
    with pytest.raises(ValueError, match="float16 only"):
        wr.autocast(dtype=wr.float32)


def _param(value):
    p = wr.nn.Parameter(wr.tensor(np.full(3, value, np.float32)))
    return p, wr.optim.SGD([p], lr=1.0)


def test_grad_scaler_defaults_and_scaling():
    s = wr.amp.GradScaler()
    assert (s.get_scale(), s.growth_factor, s.backoff_factor, s.growth_interval) == \
        (2.0 ** 16, 2.0, 0.5, 2000)
    p, opt = _param(1.0)
    loss = (p * p).sum()
    s.scale(loss).backward()  # d/dp = 2p, times the scale
    np.testing.assert_allclose(p.grad.numpy(), 2.0 * 2 ** 16)
    s.step(opt)  # unscaled before the update: p -= 2
    np.testing.assert_allclose(p.numpy(), -1.0)
    s.update()
    assert s.get_scale() == 2.0 ** 16


def test_grad_scaler_skips_inf_and_nan_steps_and_backs_off():
    s = wr.amp.GradScaler(init_scale=8.0, growth_interval=2)
    p, opt = _param(1.0)
    for bad in (np.inf, np.nan):
        p.grad = wr.tensor(np.array([1.0, bad, 1.0], np.float32))
        s.step(opt)
        np.testing.assert_array_equal(p.numpy(), 1.0)  # untouched
        s.update()
    assert s.get_scale() == 2.0 and s.skipped_steps == 2
    for want in (2.0, 4.0, 4.0, 8.0):  # grows after growth_interval clean steps in a row
        p.grad = wr.tensor(np.zeros(3, np.float32))
        s.step(opt)
        s.update()
        assert s.get_scale() == want


def test_overflow_in_f16_backward_is_caught(rng):
    """A scale that overflows the f16 backward matmul: inf gradients, the step is skipped."""
    lin = wr.nn.Linear(8, 8, seed=0)
    opt = wr.optim.SGD(lin.parameters(), lr=0.1)
    w0 = lin.weight.numpy().copy()
    s = wr.amp.GradScaler(init_scale=2.0 ** 40)
    x = wr.tensor(rng.standard_normal((4, 8)).astype(np.float32))
    with wr.autocast():
        loss = lin(lin(x)).square().sum()
    s.scale(loss).backward()
    s.step(opt)
    np.testing.assert_array_equal(lin.weight.numpy(), w0)
    s.update()
    assert s.get_scale() == 2.0 ** 39


def test_unscale_before_clipping_and_once_per_step():
    s = wr.amp.GradScaler(init_scale=4.0)
    p, opt = _param(0.0)
    p.grad = wr.tensor(np.array([4.0 * 3, 4.0 * 4, 0.0], np.float32))
    s.unscale_(opt)
    np.testing.assert_allclose(p.grad.numpy(), [3.0, 4.0, 0.0])
    wr.optim.clip_grad_norm_([p], 1.0)
    with pytest.raises(WgrumusError, match="already"):
        s.unscale_(opt)
    s.step(opt)  # not unscaled a second time
    np.testing.assert_allclose(p.numpy(), [-0.6, -0.8, 0.0], rtol=1e-4)
    s.update()


def test_grad_scaler_with_a_gradient_store_and_disabled():
    p, opt = _param(1.0)
    s = wr.amp.GradScaler(init_scale=2.0)
    store = wr.autograd.backward(s.scale((p * 3.0).sum()))
    s.step(opt, store)
    np.testing.assert_allclose(p.numpy(), -2.0)
    off = wr.amp.GradScaler(enabled=False)
    loss = (p * 1.0).sum()
    assert off.scale(loss) is loss and off.get_scale() == 1.0
    s.update()
    assert s.state_dict()["scale"] == 2.0 and off.state_dict() == {}


def test_autocast_training_tracks_f32():
    """A small MLP trained 15 steps with autocast + GradScaler ends near the f32 run."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 10)).astype(np.float32)
    y = rng.integers(0, 4, 32).astype(np.int32)
    finals = []
    for f16_on in (True, False):
        net = wr.nn.Sequential(wr.nn.Linear(10, 32, seed=1), wr.nn.ReLU(),
                               wr.nn.Linear(32, 4, seed=2))
        opt = wr.optim.Adam(net.parameters(), lr=1e-2)
        scaler = wr.amp.GradScaler(enabled=f16_on)
        for _ in range(15):
            with wr.autocast(enabled=f16_on):
                loss = F.cross_entropy(net(wr.tensor(x)), wr.tensor(y))
            grads = wr.autograd.backward(scaler.scale(loss))
            scaler.step(opt, grads)
            scaler.update()
        finals.append(loss.item())
    assert finals[0] < 1.2  # it learned (ln 4 = 1.39 at the start)
    assert abs(finals[0] - finals[1]) < 0.02 * finals[1]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,extra", [
    ("mlp", []), ("gpt", ["--n-layer", "1", "--batch-size", "8", "--block-size", "16"])])
def test_cli_precision_f16_close_to_f32(model, extra, capsys):
    from wgrumus.cli import main
    losses = {}
    for p in ("f32", "f16"):
        assert main(["train", model, "--steps", "4", "--precision", p, "--json"] + extra) == 0
        losses[p] = json.loads(capsys.readouterr().out)["losses"]
    np.testing.assert_allclose(losses["f16"], losses["f32"], rtol=1e-2)
    assert losses["f16"] != losses["f32"]


def test_cli_precision_f16_errors(devs, monkeypatch, capsys):
    """Without shader-f16 both float16 flags are refused in one line, whatever the layout."""
    from wgrumus.cli import main
    for d in devs[:2]:
        monkeypatch.setattr(d, "features", d.features - {"shader-f16"})
    assert main(["train", "mlp", "--precision", "f16", "--steps", "1"]) == 2
    assert "shader-f16" in capsys.readouterr().err
    for flag in (["--precision", "f16", "--tp", "2"], ["--grad-comm", "f16", "--dp", "2"]):
        assert main(["train", "gpt", "--steps", "1"] + flag) == 2
        err = capsys.readouterr().err
        assert "shader-f16" in err and flag[0] in err and len(err.strip().splitlines()) == 1


def test_unscale_many_gradients_in_chunks(rng):
    """More gradients than one dispatch takes, odd sizes, views: every one is unscaled, and
    an inf in the last one is found."""
    from wgrumus.amp import unscale_check
    arrs = [rng.standard_normal(n).astype(np.float32) for n in range(1, 46)]
    gs = [wr.tensor(a) for a in arrs]
    gs[3] = wr.tensor(rng.standard_normal((4, 6)).astype(np.float32)).T  # a strided view
    us, flag = unscale_check(gs, 0.25)
    for g, u in zip(gs, us):
        np.testing.assert_array_equal(u.numpy(), g.numpy() * 0.25)
    assert flag.item() == 0
    gs[-1] = wr.tensor(np.array([1.0, -np.inf], np.float32))
    assert unscale_check(gs, 0.25)[1].item() != 0


def test_f16_copies_follow_weight_updates(dev, rng):
    """The f16 copy of a weight is shared inside a step and renewed after an optimizer step,
    and after a write that bypasses the storage version (as FSDP's re-gather does) once the
    next autocast block starts."""
    x = wr.tensor(rng.standard_normal((4, 8)).astype(np.float32))
    lin = wr.nn.Linear(8, 8, bias=False, seed=0)
    opt = wr.optim.SGD(lin.parameters(), lr=0.5)

    def check():
        with wr.autocast():
            y = lin(x)
        want = f16(f16(x.numpy()) @ f16(lin.weight.numpy()).T)
        np.testing.assert_allclose(y.numpy(), want, rtol=2e-3, atol=2e-3)
        return y
    check().sum().backward()
    opt.step()
    check()
    w = rng.standard_normal((8, 8)).astype(np.float32)
    dev.write(lin.weight._storage.buffer, w)  # no version bump
    check()
