"""wr.jit replays either do what the eager call does, step by step, or refuse with a
CaptureError naming what changed since the capture: .grad accumulation across calls, optimizer
and scaler state changed between calls, device-side index errors, rebound closure variables,
train/eval, requires_grad_ and new parameter groups."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn, optim
from wgrumus.nn import functional as F
from wgrumus.runtime.asserts import DeviceAssertError
from wgrumus.runtime.errors import CaptureError

pytestmark = pytest.mark.timeout(300)


def vec(v, n=3):
    return wr.tensor(np.full(n, v, np.float32))


def test_replayed_backward_sets_grad_after_clearing():
    w = wr.tensor(np.ones(3, np.float32), requires_grad=True)
    fb = wr.jit(lambda x: (w * x).sum().backward())
    for _ in range(4):  # eager, capture, then replays
        w.grad = None
        fb(vec(1.0))
        np.testing.assert_array_equal(w.grad.numpy(), [1, 1, 1])
        fb(vec(2.0))
        np.testing.assert_array_equal(w.grad.numpy(), [3, 3, 3])
    assert fb.replays == 6


def test_replayed_backward_accumulates_like_eager(rng):
    """Gradient accumulation over jitted forward + backward calls, stepped outside."""
    def run(jit):
        model = nn.Linear(4, 2, seed=3)
        opt = optim.SGD(model.parameters(), lr=0.1)

        def fb(x, y):
            F.mse_loss(model(x), y).backward()
        f = wr.jit(fb) if jit else fb
        out = []
        data = np.random.default_rng(5).standard_normal((12, 3, 4)).astype(np.float32)
        for s in range(6):
            opt.zero_grad()
            for k in range(2):
                x = wr.tensor(data[2 * s + k])
                f(x, wr.tensor(data[2 * s + k][:, :2] * 2))
            out.append([p.grad.numpy().copy() for p in model.parameters()])
            opt.step()
        return out, [p.numpy() for p in model.parameters()]
    eager, jitted = run(False), run(True)
    for a, b in zip(eager[0] + [eager[1]], jitted[0] + [jitted[1]]):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    w = wr.tensor(np.ones(3, np.float32), requires_grad=True)
    fb = wr.jit(lambda x: (w * x).sum().backward())
    for v in (1, 2, 4, 8):
        fb(vec(v))
    np.testing.assert_array_equal(w.grad.numpy(), [15, 15, 15])


def test_the_usual_step_replays_and_leaves_the_grads(rng):
    model = nn.Linear(4, 2, seed=1)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @wr.jit
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    ref = nn.Linear(4, 2, seed=1)
    ropt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for s in range(5):
        x = rng.standard_normal((3, 4)).astype(np.float32)
        y = rng.standard_normal((3, 2)).astype(np.float32)
        step(wr.tensor(x), wr.tensor(y))
        ropt.zero_grad()
        F.mse_loss(ref(wr.tensor(x)), wr.tensor(y)).backward()
        ropt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-6, atol=1e-7)
        if s == 3:  # momentum values may change between replays (re-read per replay)
            opt.param_groups[0]["momentum"] = ropt.param_groups[0]["momentum"] = 0.5


def test_sgd_momentum_switched_on_after_capture_is_refused():
    model = nn.Linear(3, 1, seed=0)
    opt = optim.SGD(model.parameters(), lr=0.1)

    @wr.jit
    def step(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    for _ in range(3):
        step(vec(1.0).reshape(1, 3))
    opt.param_groups[0]["momentum"] = 0.9
    with pytest.raises(CaptureError, match="momentum changed from 0.0 to 0.9"):
        step(vec(1.0).reshape(1, 3))
        model.weight.numpy()


def test_grad_scaler_load_state_dict_after_capture():
    def run(jit):
        model = nn.Linear(3, 1, seed=0)
        opt = optim.SGD(model.parameters(), lr=0.01)
        scaler = wr.amp.GradScaler(init_scale=4.0, growth_interval=1)

        def step(x):
            opt.zero_grad()
            scaler.scale(model(x).sum()).backward()
            scaler.step(opt)
            scaler.update()
        f = wr.jit(step) if jit else step
        scales = []
        for _ in range(3):
            f(vec(1.0).reshape(1, 3))
            scales.append(scaler.get_scale())
        sd = scaler.state_dict()
        sd["scale"] = 8.0
        scaler.load_state_dict(sd)
        for _ in range(3):
            f(vec(1.0).reshape(1, 3))
            scales.append(scaler.get_scale())
        return scales, scaler.state_dict()["scale"], model.weight.numpy()
    eager, jitted = run(False), run(True)
    assert eager[0] == [8.0, 16.0, 32.0, 16.0, 32.0, 64.0]
    assert jitted[0] == eager[0] and jitted[1] == eager[1] == 64.0
    np.testing.assert_allclose(jitted[2], eager[2], rtol=1e-6)


def test_device_index_errors_surface_at_the_replays_read():
    emb = wr.tensor(np.arange(16, dtype=np.float32).reshape(8, 2))
    f = wr.jit(lambda i: F.embedding(i, emb) * 2.0)

    def ids(*v):
        return wr.tensor(np.array(v, np.int32))
    for _ in range(3):  # eager, capture, replay
        np.testing.assert_array_equal(f(ids(1, 2)).numpy(), [[4, 6], [8, 10]])
    for _ in range(2):  # every bad replay raises at the read of its own result
        out = f(ids(1, 99))
        with pytest.raises(DeviceAssertError, match="embedding index 99 is out of range"):
            out.numpy()
    assert f.replays == 3
    np.testing.assert_array_equal(f(ids(7)).numpy(), [[28, 30]])  # reported once

    logits = wr.tensor(np.zeros((2, 3), np.float32))
    xe = wr.jit(lambda t: F.cross_entropy(logits, t))
    for _ in range(3):
        assert abs(xe(wr.tensor(np.array([0, 2], np.int32))).item() - np.log(3)) < 1e-6
    loss = xe(wr.tensor(np.array([7, 0], np.int32)))
    with pytest.raises(DeviceAssertError, match="cross_entropy target index 7"):
        loss.item()
    assert abs(xe(wr.tensor(np.array([1, 1], np.int32))).item() - np.log(3)) < 1e-6


def test_rebound_closure_tensor_is_refused():
    w = wr.tensor(np.ones(3, np.float32))
    f = wr.jit(lambda x: w * x)
    for _ in range(3):
        np.testing.assert_array_equal(f(vec(2.0)).numpy(), [2, 2, 2])
    w = wr.tensor(np.full(3, 5.0, np.float32))  # noqa: F841 (read by f's closure)
    with pytest.raises(CaptureError, match="closure variable 'w'"):
        f(vec(2.0))
    f.free()  # captures again: the new tensor is used
    for _ in range(3):
        np.testing.assert_array_equal(f(vec(2.0)).numpy(), [10, 10, 10])


MODEL = None


def test_rebound_global_module_is_refused():
    global MODEL
    MODEL = nn.Linear(3, 1, seed=0)
    f = wr.jit(lambda x: MODEL(x))
    for _ in range(3):
        f(vec(1.0).reshape(1, 3))
    MODEL = nn.Linear(3, 1, seed=1)
    with pytest.raises(CaptureError, match="global 'MODEL'"):
        f(vec(1.0).reshape(1, 3))


def test_eval_after_capture_is_refused_and_train_again_replays(rng):
    model = nn.Sequential(nn.Conv2d(1, 2, 3, seed=0), nn.BatchNorm2d(2))
    f = wr.jit(lambda x: model(x))
    x = wr.tensor(rng.standard_normal((2, 1, 5, 5)).astype(np.float32))
    for _ in range(3):
        f(x)
    model.eval()
    with pytest.raises(CaptureError, match=r"training \(train\(\) / eval\(\)\) changed "
                                           r"since the capture \(True -> False\)"):
        f(x)
    model.train()
    f(x)
    assert f.replays == 2


def _step_fn(model, opt):
    def step(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return wr.jit(step)


def test_requires_grad_off_after_capture_is_refused():
    model = nn.Linear(3, 2, seed=0)
    opt = optim.SGD(model.parameters(), lr=0.1)
    step = _step_fn(model, opt)
    for _ in range(3):
        step(vec(1.0).reshape(1, 3))
    model.bias.requires_grad_(False)
    with pytest.raises(CaptureError, match="requires_grad"):
        step(vec(1.0).reshape(1, 3))


def test_add_param_group_after_capture_is_refused():
    model = nn.Linear(3, 2, seed=0)
    extra = nn.Linear(2, 1, seed=1)
    opt = optim.Adam(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        extra(model(x)).sum().backward()
        opt.step()
    f = wr.jit(step)
    for _ in range(3):
        f(vec(1.0).reshape(1, 3))
    opt.add_param_group({"params": extra.parameters()})
    with pytest.raises(CaptureError, match="parameters of Adam's groups"):
        f(vec(1.0).reshape(1, 3))


def test_gradient_made_outside_and_read_inside_is_refused():
    model = nn.Linear(3, 1, seed=0)
    opt = optim.SGD(model.parameters(), lr=0.1)
    f = wr.jit(lambda: opt.step())
    for _ in range(2):
        opt.zero_grad()
        model(vec(1.0).reshape(1, 3)).sum().backward()
        f()
    opt.zero_grad()
    model(vec(1.0).reshape(1, 3)).sum().backward()  # new gradient tensors
    with pytest.raises(CaptureError, match=r"\.grad of a parameter"):
        f()
