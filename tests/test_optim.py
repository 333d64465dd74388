"""Optimizers against a numpy transcription of torch.optim's formulas over several steps,
skipping of parameters without gradients, no recompiles on lr changes, state_dict round
trips, clip_grad_norm_ and the learning-rate schedules."""
import math

import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn, optim
from wgrumus.optim import lr_scheduler


# ----------------------------------------------------------------------------- numpy references
def ref_sgd(p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    p, buf = p.astype(np.float64), None
    for g in grads:
        g = g + weight_decay * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def ref_adam(p, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    p = p.astype(np.float64)
    m, v = np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(grads, 1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + eps
        p = p - lr / (1 - b1 ** t) * m / denom
    return p


CASES = [
    (optim.SGD, dict(lr=0.1), ref_sgd, {}),
    (optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01), ref_sgd, {}),
    (optim.SGD, dict(lr=0.05, momentum=0.8, dampening=0.3), ref_sgd, {}),
    (optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1), ref_sgd, {}),
    (optim.Adam, dict(lr=0.01), ref_adam, {}),
    (optim.Adam, dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), ref_adam, {}),
    (optim.AdamW, dict(lr=0.02), ref_adam, dict(weight_decay=0.01, decoupled=True)),
    (optim.AdamW, dict(lr=0.01, weight_decay=0.3), ref_adam, dict(decoupled=True)),
]


@pytest.mark.parametrize("cls,kw,ref,refkw", CASES)
@pytest.mark.parametrize("via", ["grad", "store"])
def test_matches_pytorch_formulas(cls, kw, ref, refkw, via, rng):
    p0 = rng.standard_normal((3, 5)).astype(np.float32)
    grads = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(5)]
    p = nn.Parameter(wr.tensor(p0))
    opt = cls([p], **kw)
    for g in grads:
        if via == "grad":
            p.grad = wr.tensor(g)
            opt.step()
        else:
            store = wr.GradientStore()
            store.accumulate(p, wr.tensor(g))
            opt.step(store)
    expect = ref(p0, [g.astype(np.float64) for g in grads], **{**kw, **refkw})
    np.testing.assert_allclose(p.numpy(), expect, rtol=2e-5, atol=2e-6)


def test_params_without_grad_are_skipped_and_versions_bump(rng):
    a, b = nn.Parameter(wr.ones(4)), nn.Parameter(wr.ones(4))
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = wr.tensor(np.full(4, 2.0, np.float32))
    v = a._storage.version
    opt.step()
    assert a._storage.version > v
    np.testing.assert_array_equal(b.numpy(), np.ones(4))
    assert b not in opt.state and opt.state[a]["step"] == 1
    opt.zero_grad()
    assert a.grad is None
    opt.step()  # nothing has a gradient: a no-op, not an error
    assert opt.state[a]["step"] == 1


def test_stale_forward_after_step_is_detected():
    lin = nn.Linear(3, 2)
    opt = optim.SGD(lin.parameters(), lr=0.1)
    x = wr.tensor(np.ones((2, 3), np.float32))
    loss = (lin(x) ** 2).sum()
    loss2 = (lin(x) ** 2).sum()
    opt.step(wr.autograd.backward(loss))
    with pytest.raises(wr.autograd.AutogradError, match="modified in place"):
        wr.autograd.backward(loss2)


def test_lr_changes_do_not_recompile(dev):
    p = nn.Parameter(wr.ones(8))
    opt = optim.AdamW([p], lr=0.1)
    p.grad = wr.ones(8)
    opt.step()
    n = len(dev._pipelines)
    for lr in (0.05, 0.01, 0.001):
        opt.param_groups[0]["lr"] = lr
        opt.step()
    assert len(dev._pipelines) == n


def test_state_dict_roundtrip_continues_identically(rng):
    p0 = rng.standard_normal(6).astype(np.float32)
    grads = [wr.tensor(rng.standard_normal(6).astype(np.float32)) for _ in range(6)]
    a = nn.Parameter(wr.tensor(p0))
    opt_a = optim.Adam([a], lr=0.05, weight_decay=0.1)
    for g in grads[:3]:
        a.grad = g
        opt_a.step()
    sd = opt_a.state_dict()
    assert sd["state"][0]["step"] == 3 and sd["param_groups"][0]["params"] == [0]
    b = nn.Parameter(wr.tensor(a.numpy()))
    opt_b = optim.Adam([b], lr=999.0)
    opt_b.load_state_dict(sd)
    assert opt_b.param_groups[0]["lr"] == 0.05
    for g in grads[3:]:
        a.grad = g
        b.grad = g
        opt_a.step()
        opt_b.step()
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(wr.WgrumusError, match="parameters"):
        optim.Adam([b, nn.Parameter(wr.ones(2))]).load_state_dict(sd)


def test_sgd_momentum_state_dict_and_groups(rng):
    a, b = nn.Parameter(wr.ones(3)), nn.Parameter(wr.ones(2))
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    a.grad, b.grad = wr.ones(3), wr.ones(2)
    opt.step()
    np.testing.assert_allclose(a.numpy(), 0.9)
    np.testing.assert_allclose(b.numpy(), 0.5)
    sd = opt.state_dict()
    assert sd["param_groups"][1]["params"] == [1]
    np.testing.assert_allclose(sd["state"][1]["momentum_buffer"].numpy(), 1.0)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([a], lr=0.1, nesterov=True)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm(rng, norm_type):
    gs = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (5,), (2, 2))]
    ps = [nn.Parameter(wr.zeros(g.shape)) for g in gs]
    for p, g in zip(ps, gs):
        p.grad = wr.tensor(g)
    flat = np.concatenate([g.ravel() for g in gs]).astype(np.float64)
    total = np.abs(flat).max() if norm_type == float("inf") else \
        (np.abs(flat) ** norm_type).sum() ** (1 / norm_type)
    got = optim.clip_grad_norm_(ps, 0.5, norm_type)
    assert isinstance(got, wr.Tensor)
    np.testing.assert_allclose(got.item(), total, rtol=1e-5)
    for p, g in zip(ps, gs):
        np.testing.assert_allclose(p.grad.numpy(), g * 0.5 / (total + 1e-6), rtol=1e-5)
    # below the threshold: unchanged; GradientStore form
    store = wr.GradientStore()
    store.accumulate(ps[1], wr.tensor(gs[1]))
    optim.clip_grad_norm_(ps, 1e6, norm_type, grads=store)
    np.testing.assert_allclose(store.get(ps[1]).numpy(), gs[1], rtol=1e-6)


def test_clip_scales_a_shared_gradient_once():
    """autograd hands the same gradient tensor to both inputs of an add."""
    a, b = nn.Parameter(wr.ones(4)), nn.Parameter(wr.ones(4))
    store = wr.autograd.backward((a + b).sum() * 3.0)
    assert store.get(a) is store.get(b)
    total = optim.clip_grad_norm_([a, b], 1.0, grads=store).item()
    assert total == pytest.approx(math.sqrt(8 * 9), rel=1e-6)
    np.testing.assert_allclose(store.get(a).numpy(), 3 / total, rtol=1e-5)
    np.testing.assert_allclose(store.get(b).numpy(), 3 / total, rtol=1e-5)


def test_schedulers():
    def opt():
        return optim.SGD([nn.Parameter(wr.ones(1))], lr=1.0)

    def rates(o, s, n, last_lr=False):
        """The rate before each of ``n`` scheduler steps: the optimizer's, or get_last_lr()."""
        got = []
        for _ in range(n):
            got.append(s.get_last_lr()[0] if last_lr else o.param_groups[0]["lr"])
            s.step()
        return got

    o = opt()
    s = lr_scheduler.StepLR(o, step_size=2, gamma=0.5)
    lrs = rates(o, s, 6)
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    o = opt()
    s = lr_scheduler.CosineAnnealingLR(o, T_max=10, eta_min=0.1)
    got = rates(o, s, 11, last_lr=True)
    ref = [0.1 + 0.9 * (1 + math.cos(math.pi * t / 10)) / 2 for t in range(11)]
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    o = opt()
    s = lr_scheduler.CosineAnnealingLR(o, T_max=12, warmup_steps=4)
    got = rates(o, s, 13)
    np.testing.assert_allclose(got[:5], [0.0, 0.25, 0.5, 0.75, 1.0])
    assert got[12] == pytest.approx(0.0, abs=1e-12) and got[8] == pytest.approx(0.5)
    o = opt()
    w = lr_scheduler.LinearWarmup(o, warmup_steps=4, start_factor=0.2)
    got = rates(o, w, 6)
    np.testing.assert_allclose(got, [0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    # resuming from state_dict sets the same rate
    o2 = opt()
    w2 = lr_scheduler.LinearWarmup(o2, warmup_steps=4, start_factor=0.2)
    w2.load_state_dict(w.state_dict())
    assert o2.param_groups[0]["lr"] == o.param_groups[0]["lr"]
