"""A GradScaler whose scale, growth tracker and inf/NaN flags stay on the device: optimizer steps
skipped on the device (parameters, moments and Adam's step count untouched, so the next clean
step's bias corrections are those of numpy's Adam), growth and backoff, state_dict round trips,
and whole f16 steps captured by wr.jit giving the eager results, overflow steps included."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn, optim
from wgrumus.nn import functional as F
from wgrumus.optim import adam
from wgrumus.runtime.tuning import TUNING

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(
    "shader-f16" not in wr.devices()[0].features, reason="the adapter has no shader-f16")]

LR, B1, B2, EPS, WD = 0.1, 0.9, 0.999, 1e-8, 0.1


def adamw_ref(p, m, v, g, t):
    """torch.optim.AdamW's update in float64 (with the betas the kernel sees: float32)."""
    b1, b2 = float(np.float32(B1)), float(np.float32(B2))
    p = p * (1 - LR * WD)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - B2 ** t) + EPS
    return p - LR / (1 - B1 ** t) * m / denom, m, v


def _state(opt, ps):
    return [(p.numpy(), opt.state[p]["exp_avg"].numpy(), opt.state[p]["exp_avg_sq"].numpy())
            for p in ps]


@pytest.mark.parametrize("path", ["cpu", "gpu", "single"])
def test_adamw_skips_on_the_device_and_keeps_its_step_count(dev, rng, monkeypatch, path):
    """Clean, inf, NaN, clean steps: the bad ones leave everything as it was and back the scale
    off; the clean ones follow numpy's AdamW with the count of clean steps (1, then 2)."""
    if path == "gpu":  # the `main` entry (lavapipe otherwise takes the chunked `cpu` one)
        monkeypatch.setattr(TUNING, "update_chunk", 1)
    if path == "single":  # one dispatch per parameter (shaders/optim.wgsl)
        monkeypatch.setattr(adam, "multi_width", lambda d, amp=False: 1)
    shapes = [(5, 3), (7,), (2, 2)]
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ps = [nn.Parameter(wr.tensor(w)) for w in ws]
    opt = optim.AdamW(ps, lr=LR, weight_decay=WD)
    s = wr.amp.GradScaler(init_scale=8.0, growth_interval=100)
    ref = [(w.astype(np.float64), np.zeros(w.shape), np.zeros(w.shape)) for w in ws]
    clean = 0
    for bad in (None, np.inf, np.nan, None):
        gs = [rng.standard_normal(sh).astype(np.float32) for sh in shapes]
        before = _state(opt, ps) if clean else None
        for p, g in zip(ps, gs):
            p.grad = wr.tensor(g * np.float32(s.get_scale()))
        if bad is not None:
            bad_grad = gs[1].copy()
            bad_grad[3] = bad
            ps[1].grad = wr.tensor(bad_grad)
        s.step(opt)
        s.update()
        if bad is None:
            clean += 1
            ref = [adamw_ref(*r, g.astype(np.float64), clean) for r, g in zip(ref, gs)]
            for (p, m, v), (rp, rm, rv) in zip(_state(opt, ps), ref):
                np.testing.assert_allclose(p, rp, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(m, rm, rtol=1e-5, atol=1e-7)
                np.testing.assert_allclose(v, rv, rtol=1e-5, atol=1e-9)
        else:
            for a, b in zip(_state(opt, ps), before):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y)
        steps = {k: st["step"] for k, st in opt.state_dict()["state"].items()}
        assert steps == {0: clean, 1: clean, 2: clean}
    assert s.get_scale() == 2.0 and s.skipped_steps == 2


def test_device_steps_match_the_host_bias_corrections(dev, rng):
    """Without overflow, a scaler's steps (counts and bias corrections on the device) give
    plain AdamW's steps (host float64 words) to float32 rounding."""
    w = rng.standard_normal((9, 4)).astype(np.float32)
    runs = []
    for scaled in (False, True):
        p = nn.Parameter(wr.tensor(w))
        opt = optim.AdamW([p], lr=LR, weight_decay=WD)
        s = wr.amp.GradScaler(init_scale=2.0, growth_interval=3)
        for k in range(7):
            g = np.cos(w * (k + 1)).astype(np.float32)
            if scaled:
                p.grad = wr.tensor(g * np.float32(s.get_scale()))
                s.step(opt)
                s.update()
            else:
                p.grad = wr.tensor(g)
                opt.step()
        runs.append(p.numpy())
    np.testing.assert_allclose(runs[1], runs[0], rtol=2e-6, atol=1e-7)
    assert s.get_scale() == 8.0  # grew after steps 3 and 6


def test_grows_after_growth_interval_and_state_dict_round_trip(dev):
    s = wr.amp.GradScaler(init_scale=4.0, growth_factor=3.0, backoff_factor=0.25,
                          growth_interval=3)
    p = nn.Parameter(wr.tensor(np.ones(4, np.float32)))
    opt = optim.Adam([p], lr=1e-2)
    seen = []
    for k in range(8):
        p.grad = wr.tensor(np.full(4, np.inf if k == 4 else 1.0, np.float32))
        s.step(opt)
        s.update()
        seen.append(s.get_scale())
    assert seen == [4.0, 4.0, 12.0, 12.0, 3.0, 3.0, 3.0, 9.0]
    p.grad = wr.tensor(np.ones(4, np.float32))
    s.step(opt)
    s.update()
    sd = s.state_dict()
    assert sd == {"scale": 9.0, "growth_factor": 3.0, "backoff_factor": 0.25,
                  "growth_interval": 3, "_growth_tracker": 1}
    for t in (wr.amp.GradScaler(), s):  # a fresh scaler and one with its device state
        t.load_state_dict(sd)
        assert t.state_dict() == sd
    fresh = wr.amp.GradScaler()
    fresh.load_state_dict(sd)
    for sc in (s, fresh):  # both grow after two more clean steps
        for _ in range(2):
            p.grad = wr.tensor(np.ones(4, np.float32))
            sc.step(opt)
            sc.update()
        assert sc.get_scale() == 27.0
    s.update(new_scale=5.0)
    assert s.get_scale() == 5.0 and s.state_dict()["_growth_tracker"] == 0


def test_optimizer_state_with_device_counts_round_trips(dev, rng):
    """state_dict reports a device count as an int; a loaded optimizer goes on as the original."""
    w = rng.standard_normal(6).astype(np.float32)
    gs = [rng.standard_normal(6).astype(np.float32) for _ in range(5)]

    def make(wv):
        p = nn.Parameter(wr.tensor(wv))
        return p, optim.AdamW([p], lr=LR), wr.amp.GradScaler(init_scale=2.0)

    def stepped(p, opt, s, g):
        p.grad = wr.tensor(g * np.float32(s.get_scale()))
        s.step(opt)
        s.update()

    p, opt, s = make(w)
    for g in gs[:3]:
        stepped(p, opt, s, g)
    sd, ssd = opt.state_dict(), s.state_dict()
    assert sd["state"][0]["step"] == 3 and isinstance(sd["state"][0]["step"], int)
    q, opt2, s2 = make(p.numpy())
    opt2.load_state_dict(sd)
    s2.load_state_dict(ssd)
    for g in gs[3:]:
        stepped(p, opt, s, g)
        stepped(q, opt2, s2, g)
    np.testing.assert_array_equal(q.numpy(), p.numpy())
    assert opt2.state_dict()["state"][0]["step"] == 5
    opt2.step()  # a plain step after scaled ones takes the count back to the host: 6
    assert opt2.state[q]["step"] == 6


def test_sgd_and_gradients_on_two_devices(devs):
    """SGD skips on the device too; gradients on two devices (the scale copied to the second,
    the flags agreed through the host) skip together."""
    d0, d1 = devs[0], devs[1]
    ps = [nn.Parameter(wr.tensor(np.ones(3, np.float32), device=d)) for d in (d0, d1)]
    opt = optim.SGD(ps, lr=0.5, momentum=0.9)
    s = wr.amp.GradScaler(init_scale=4.0)
    ps[0].grad = wr.tensor(np.full(3, 4.0, np.float32), device=d0)
    ps[1].grad = wr.tensor(np.array([4.0, np.nan, 4.0], np.float32), device=d1)
    s.step(opt)
    s.update()
    for p in ps:
        np.testing.assert_array_equal(p.numpy(), 1.0)
    assert s.get_scale() == 2.0
    for p, d in zip(ps, (d0, d1)):
        p.grad = wr.tensor(np.full(3, 2.0, np.float32), device=d)
    s.step(opt)
    s.update()
    for p in ps:  # (the momentum buffer starts at the gradient on the first executed step)
        np.testing.assert_allclose(p.numpy(), 0.5)


def test_optimizers_without_found_inf_are_stepped_after_a_host_read(dev):
    class Counting:
        def __init__(self, p):
            self.param_groups, self.calls = [{"params": [p]}], 0

        def step(self, grads=None):
            self.calls += 1

    p = nn.Parameter(wr.tensor(np.ones(2, np.float32)))
    opt, s = Counting(p), wr.amp.GradScaler(init_scale=2.0)
    for g, want in (([1.0, np.inf], 0), ([1.0, 2.0], 1)):
        p.grad = wr.tensor(np.array(g, np.float32))
        s.step(opt)
        s.update()
        assert opt.calls == want
    with pytest.raises(wr.WgrumusError, match="found_inf"):
        type("Plain", (optim.Optimizer,), {})([p], {"lr": 1.0}).step(found_inf=wr.zeros(
            1, dtype=wr.int32))


def _mlp(dev):
    wr.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3)).to(dev)


def _gpt(dev):
    wr.manual_seed(3)
    return nn.GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16).to(dev)


def _amp_train(kind, dev, batches, use_jit):
    """AdamW steps under autocast + GradScaler with unscale_ and clipping; ``boost`` (a tensor
    input) multiplies the loss: 1e30 overflows that step's gradients."""
    model = (_mlp if kind == "mlp" else _gpt)(dev)
    params = list(model.parameters())
    opt = optim.AdamW(params, lr=3e-2, weight_decay=0.1)
    scaler = wr.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2)

    def step(x, y, boost):
        opt.zero_grad()
        with wr.autocast():
            out = model(x)
            if kind == "gpt":
                out, y = out.reshape((-1, 11)), y.reshape((-1,))
            loss = F.cross_entropy(out, y)
        scaler.scale(loss * boost).backward()
        scaler.unscale_(opt)
        optim.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        return loss

    fn = wr.jit(step) if use_jit else step
    losses, scales, snaps = [], [], []
    for k, (x, y) in enumerate(batches):
        boost = wr.tensor(np.array(1e30 if k in (3, 4) else 1.0, np.float32), device=dev)
        xt = wr.tensor(x, device=dev, dtype=wr.int32 if kind == "gpt" else None)
        losses.append(fn(xt, wr.tensor(y, device=dev, dtype=wr.int32), boost).item())
        scales.append(scaler.get_scale())
        snaps.append([p.numpy() for p in params])
    steps = sorted({st["step"] for st in opt.state_dict()["state"].values()})
    return losses, scales, snaps, steps, scaler.skipped_steps, fn


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_jit_captures_whole_f16_steps(dev, rng, kind):
    """Warm-up, capture and 5 replays, two of them overflowing: the eager losses, scales,
    parameters and step counts, and nothing changed by the overflowing steps."""
    batches = []
    for _ in range(7):
        if kind == "gpt":
            ids = rng.integers(0, 11, (4, 9))
            batches.append((ids[:, :-1], ids[:, 1:]))
        else:
            batches.append((rng.standard_normal((8, 6)).astype(np.float32),
                            rng.integers(0, 3, 8)))
    eager = _amp_train(kind, dev, batches, False)
    jitted = _amp_train(kind, dev, batches, True)
    assert jitted[5].captures == 1 and jitted[5].replays == 5
    np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6)
    assert jitted[1] == eager[1] == [2.0 ** 10, 2.0 ** 11, 2.0 ** 11, 2.0 ** 10, 2.0 ** 9,
                                     2.0 ** 9, 2.0 ** 10]
    for a, b in zip(jitted[2], eager[2]):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    for k in (3, 4):  # the overflowing steps left the parameters as they were
        for x, y in zip(jitted[2][k], jitted[2][k - 1]):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(jitted[2][5][0], jitted[2][4][0])
    assert jitted[3] == eager[3] == [5] and jitted[4] == eager[4] == 2


@pytest.mark.timeout(600)
@pytest.mark.parametrize("opt_cls", [optim.Adam, optim.SGD])
def test_unscale_and_skipped_step_past_65535_workgroups(dev, monkeypatch, opt_cls):
    """One parameter of 65,535 x 256 + 1000 elements: the unscale kernel and the update
    (adam_multi.wgsl's `main` entry, optim.wgsl's `sgd`) span more than 65,535 workgroups; an
    inf in the last element is found and skips the step, and a clean step reaches the last
    elements (Adam's first step and SGD's both move by lr * sign(g) here)."""
    monkeypatch.setattr(TUNING, "update_chunk", 1)
    n = 65535 * 256 + 1000
    p = nn.Parameter(wr.zeros(n))
    opt = opt_cls([p], lr=0.5)
    s = wr.amp.GradScaler(init_scale=4.0)
    g = np.full(n, 4.0, np.float32)
    g[-1] = np.inf
    p.grad = wr.tensor(g)
    s.step(opt)
    s.update()
    assert s.get_scale() == 2.0 and p.numpy()[-3:].tolist() == [0.0, 0.0, 0.0]
    g[-1] = -2.0  # unscaled: -1 (the scale is 2 after the backoff)
    g[:-1] = 2.0
    p.grad = wr.tensor(g)
    s.step(opt)
    s.update()
    np.testing.assert_allclose(p.numpy()[-3:], [-0.5, -0.5, 0.5], rtol=1e-5)
    if opt_cls is optim.Adam:
        assert opt.state_dict()["state"][0]["step"] == 1


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_cli_f16_jit_gives_the_eager_losses(model, capsys):
    """`wgrumus train --precision f16 --jit`, with clipping, a schedule and (gpt) two
    micro-batches: the losses of the eager f16 run."""
    import json

    from wgrumus.cli import main
    args = ["train", model, "--steps", "5", "--precision", "f16", "--clip", "0.5",
            "--lr-schedule", "cosine", "--warmup", "2", "--json"]
    if model == "gpt":
        args += ["--n-layer", "1", "--batch-size", "8", "--block-size", "16",
                 "--micro-batches", "2"]
    losses = []
    for jit in ("--no-jit", "--jit"):
        assert main(args + [jit]) == 0
        losses.append(json.loads(capsys.readouterr().out)["losses"])
    assert len(losses[0]) == 5 and losses[0][0] != losses[0][-1]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6, atol=0)
