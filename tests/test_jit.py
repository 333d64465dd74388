"""wr.jit: captured steps replayed without Python per op give exactly the eager results (losses
and parameters, several steps, Adam/AdamW/SGD, clipping, LR schedules, MLP/CNN/GPT), re-capture
on new shapes, refuse what a replay cannot reproduce, and free their buffers."""
import gc

import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn, optim
from wgrumus.nn import functional as F
from wgrumus.optim import lr_scheduler

pytestmark = pytest.mark.timeout(300)


def _mlp(dev):
    wr.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)).to(dev)


def _cnn(dev):
    wr.manual_seed(2)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).to(dev)


def _gpt(dev):
    wr.manual_seed(3)
    return nn.GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16).to(dev)


def _batches(kind, n, batch, rng):
    out = []
    for _ in range(n):
        if kind == "gpt":
            ids = rng.integers(0, 11, (batch, 9))
            out.append((ids[:, :-1], ids[:, 1:]))
        else:
            shape = (batch, 6) if kind == "mlp" else (batch, 1, 8, 8)
            out.append((rng.standard_normal(shape).astype(np.float32),
                        rng.integers(0, 3, batch)))
    return out


def _train(kind, dev, batches, use_jit, opt_name="adamw", clip=True, sched=True):
    model = {"mlp": _mlp, "cnn": _cnn, "gpt": _gpt}[kind](dev)
    params = list(model.parameters())
    opt = {"adamw": lambda: optim.AdamW(params, lr=3e-2, weight_decay=0.1),
           "adam": lambda: optim.Adam(params, lr=3e-2, weight_decay=0.01),
           "sgd": lambda: optim.SGD(params, lr=5e-2, momentum=0.9, nesterov=True)}[opt_name]()
    sch = lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches), warmup_steps=2) \
        if sched else None

    def step(x, y):
        opt.zero_grad()
        out = model(x)
        if kind == "gpt":
            out, y = out.reshape((-1, 11)), y.reshape((-1,))
        loss = F.cross_entropy(out, y)
        loss.backward()
        if clip:
            optim.clip_grad_norm_(params, 0.5)
        opt.step()
        return loss

    fn = wr.jit(step) if use_jit else step
    losses = []
    for x, y in batches:
        xt = wr.tensor(x, device=dev, dtype=wr.int32 if kind == "gpt" else None)
        losses.append(fn(xt, wr.tensor(y, device=dev, dtype=wr.int32)))
        if sch:
            sch.step()
    return [v.item() for v in losses], [p.numpy() for p in params], fn


def _same(a, b):
    (la, pa, _), (lb, pb, _) = a, b
    np.testing.assert_allclose(lb, la, rtol=1e-6, atol=0)
    for x, y in zip(pa, pb):
        np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opt_name", ["adamw", "adam", "sgd"])
def test_mlp_matches_eager(dev, rng, opt_name):
    batches = _batches("mlp", 6, 5, rng)
    eager = _train("mlp", dev, batches, False, opt_name)
    jitted = _train("mlp", dev, batches, True, opt_name)
    _same(eager, jitted)
    assert jitted[2].captures == 1 and jitted[2].replays == 4  # warm-up, capture, 4 replays
    assert eager[0][0] != eager[0][-1]


@pytest.mark.parametrize("kind", ["cnn", "gpt"])
def test_cnn_gpt_match_eager(dev, rng, kind):
    batches = _batches(kind, 5, 4, rng)
    _same(_train(kind, dev, batches, False), _train(kind, dev, batches, True))


def _plain_step(model, opt, loss_fn):
    """zero_grad, forward, loss, backward, step: the step most tests capture."""
    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def test_replay_runs_no_python_ops(dev, rng, monkeypatch):
    """After capture, a call neither dispatches through Device.dispatch nor records autograd,
    and computes what the eager step would."""
    model = _mlp(dev)
    opt = optim.SGD(model.parameters(), lr=0.1)
    step = wr.jit(_plain_step(model, opt, F.mse_loss))
    x, y = wr.tensor(rng.standard_normal((4, 6))), wr.tensor(rng.standard_normal((4, 3)))
    step(x, y), step(x, y)
    n = step.stats()["captures"][0]
    with wr.no_grad():
        expected = F.mse_loss(model(x), y).item()
    before = dev.dispatches

    def no_dispatch(*a, **k):
        raise AssertionError("a replay dispatched through Python")
    monkeypatch.setattr(wr.Device, "dispatch", no_dispatch)
    monkeypatch.setattr(wr.autograd, "backward", no_dispatch)
    loss = step(x, y)
    monkeypatch.undo()
    assert dev.dispatches - before == n
    assert loss.shape == () and not loss.requires_grad
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_replay_through_wgpu_py_calls(dev, rng, monkeypatch):
    """Under WGRUMUS_CHECKED_PASS (no raw C pass) replays encode through wgpu-py's API."""
    monkeypatch.setattr(dev, "raw_pass", None)
    batches = _batches("mlp", 4, 5, rng)
    eager = _train("mlp", dev, batches, False)
    jitted = _train("mlp", dev, batches, True)
    assert jitted[2]._captures[next(iter(jitted[2]._captures))].replay_obj._raw is None
    _same(eager, jitted)


def test_outputs_and_inputs_are_not_aliased(dev, rng):
    """Each call returns new output tensors; the caller's input tensors are never written."""
    w = wr.tensor(rng.standard_normal((3,)).astype(np.float32))

    @wr.jit
    def f(x):
        return x * w + 1.0, (x.sum(), 7)

    xs = [wr.tensor(rng.standard_normal((3,)).astype(np.float32)) for _ in range(4)]
    outs = [f(x) for x in xs]
    for x, (a, (s, c)) in zip(xs, outs):
        np.testing.assert_allclose(a.numpy(), x.numpy() * w.numpy() + 1, rtol=1e-6)
        np.testing.assert_allclose(s.item(), x.numpy().sum(), rtol=1e-5)
        assert c == 7
    assert f.captures == 1 and f.replays == 2


def test_method_decorator_captures_per_instance(dev):
    class Scaler:
        def __init__(self, k):
            self.w = wr.tensor(np.full(3, k, np.float32))

        @wr.jit
        def apply(self, x):
            return x * self.w

    a, b = Scaler(2.0), Scaler(5.0)
    x = wr.tensor(np.arange(3, dtype=np.float32))
    for _ in range(3):
        ya, yb = a.apply(x), b.apply(x)
    np.testing.assert_array_equal(ya.numpy(), 2 * np.arange(3))
    np.testing.assert_array_equal(yb.numpy(), 5 * np.arange(3))
    assert Scaler.apply.captures == 2 and Scaler.apply.replays == 2


def test_recapture_on_new_shape(dev, rng):
    batches = _batches("mlp", 4, 5, rng) + _batches("mlp", 4, 3, rng) + _batches("mlp", 2, 5, rng)
    eager = _train("mlp", dev, batches, False, sched=False)
    jitted = _train("mlp", dev, batches, True, sched=False)
    _same(eager, jitted)
    assert jitted[2].captures == 2


def test_pool_never_hands_out_captured_buffers(dev, rng):
    """Eager tensors made between replays keep their values (the capture's intermediates stay
    out of the pool), and replays keep matching eager."""
    batches = _batches("mlp", 5, 5, rng)
    eager = _train("mlp", dev, batches, False)
    keep = []
    model = _mlp(dev)
    opt = optim.Adam(model.parameters(), lr=3e-2, weight_decay=0.01)
    step = wr.jit(_plain_step(model, opt, F.cross_entropy))
    vals = []
    for x, y in batches:
        vals.append(step(wr.tensor(x), wr.tensor(y, dtype=wr.int32)).item())
        for _ in range(3):  # the same sizes as the step's intermediates
            a = rng.standard_normal((5, 12)).astype(np.float32)
            keep.append((a, wr.tensor(a) * 1.0))
    for a, t in keep:
        np.testing.assert_array_equal(t.numpy(), a)
    ref = _train("mlp", dev, batches, False, "adam", clip=False, sched=False)
    np.testing.assert_allclose(vals, ref[0], rtol=1e-6)
    assert eager[0] != vals


def test_del_frees_captured_buffers(dev, rng):
    pool = dev.pool
    gc.collect()
    base = pool.stats()
    _, _, fn = _train("mlp", dev, _batches("mlp", 3, 5, rng), True)
    held = pool.stats()
    assert held["held_bytes"] > base["held_bytes"] and held["pinned"] > base["pinned"]
    del fn
    gc.collect()
    after = pool.stats()
    assert after["held_bytes"] == base["held_bytes"] and after["pinned"] == base["pinned"]


def _capture_error(fn, *args):
    f = wr.jit(fn)
    f(*args)  # warm-up: eager
    with pytest.raises(wr.CaptureError) as e:
        f(*args)
    return str(e.value)


def test_refuses_host_reads(dev):
    x = wr.tensor(np.ones(3, np.float32))
    msg = _capture_error(lambda t: (t * 2).sum().item(), x)
    assert "reading a tensor back" in msg and "test_jit.py" in msg

    def branch(t):
        return t * 2 if (t.sum() > 0) else t
    assert "reading a tensor back" in _capture_error(branch, x)


def test_refuses_global_rng_scheduler_and_new_parameters(dev):
    x = wr.tensor(np.ones((2, 3), np.float32))
    assert "random op" in _capture_error(lambda t: F.dropout(t, 0.5), x)
    # an explicit seed is deterministic: captured fine
    f = wr.jit(lambda t: F.dropout(t, 0.5, seed=5))
    np.testing.assert_array_equal(f(x).numpy(), f(x).numpy())
    np.testing.assert_array_equal(f(x).numpy(), F.dropout(x, 0.5, seed=5).numpy())
    assert "random op" in _capture_error(lambda t: nn.Linear(3, 2)(t), x)  # its init
    assert "new parameter" in _capture_error(lambda t: t * nn.Parameter(wr.zeros(3)), x)
    p = nn.Parameter(wr.tensor(np.ones(3, np.float32)))
    opt = optim.SGD([p], lr=0.1)
    sch = lr_scheduler.StepLR(opt, 1)

    def step(t):
        (p * t).sum().backward()
        opt.step()
        sch.step()
    assert "StepLR.step()" in _capture_error(step, x[0])
    # the failed capture left no recorder behind: the next eager work runs normally
    assert dev.recorder is None
    np.testing.assert_allclose((x * 2).numpy(), 2 * np.ones((2, 3)))


def test_refuses_optimizer_state_made_in_capture(dev):
    p = nn.Parameter(wr.tensor(np.ones(3, np.float32)))
    opt = optim.Adam([p], lr=0.1)

    def step(t):
        opt.zero_grad()
        (p * t).sum().backward()
        opt.step()
    f = wr.jit(step, warmup=0)
    with pytest.raises(wr.CaptureError, match="exp_avg"):
        f(wr.tensor(np.ones(3, np.float32)))


def test_large_dispatch_counts(dev, rng):
    """A capture longer than the eager arena (128 slots per batch) replays every dispatch;
    a 1-D kernel past 65,535 workgroups replays its folded grid."""
    n = 65_536 * 256 + 77
    big = rng.standard_normal(n).astype(np.float32)

    def f(t, b):
        for _ in range(150):
            t = t + 1.0
        return t, b * 2.0

    jf = wr.jit(f)
    small = wr.tensor(np.zeros(5, np.float32))
    outs = [jf(small, wr.tensor(big)) for _ in range(3)]
    assert jf.replays == 1 and jf.stats()["captures"] == [151]
    np.testing.assert_allclose(outs[2][0].numpy(), np.full(5, 150.0))
    idx = [0, 65_536 * 256, n - 1]
    np.testing.assert_allclose(outs[2][1].numpy()[idx], big[idx] * 2)


# ----------------------------------------------------------------------------- wgrumus train
def _train_cli(*args):
    import json
    import sys

    from _util import run_process
    p = run_process([sys.executable, "-m", "wgrumus.cli", "train", *args, "--json"], 280)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])["losses"]


@pytest.mark.parametrize("model", ["mlp", "cnn", "gpt"])
def test_cli_jit_gives_the_eager_losses(model):
    args = [model, "--steps", "20", "--batch-size", "16"]
    if model == "gpt":
        args += ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8"]
    eager = _train_cli(*args, "--no-jit")
    jitted = _train_cli(*args, "--jit")
    assert len(eager) == 20
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=0)


def test_cli_jit_data_parallel_gives_the_eager_losses():
    args = ["mlp", "--steps", "6", "--batch-size", "16", "--dp", "2", "--devices", "2"]
    np.testing.assert_allclose(_train_cli(*args, "--jit"), _train_cli(*args, "--no-jit"),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("layout", [["mlp"], ["mlp", "--dp", "2", "--devices", "2"],
                                    ["gpt", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
                                     "--block-size", "8"]])
def test_cli_jit_follows_the_schedule_and_clipping(layout):
    """The schedule's rate changes every step outside the replayed recording: a capture that
    froze it (or the step count behind it) would drift from the eager losses."""
    args = [*layout, "--steps", "8", "--batch-size", "16", "--lr-schedule", "cosine",
            "--warmup", "3", "--clip", "0.5"]
    eager = _train_cli(*args, "--no-jit")
    np.testing.assert_allclose(_train_cli(*args, "--jit"), eager, rtol=1e-6, atol=0)


def test_readme_jit_example_runs(tmp_path):
    """The README's wr.jit block, run after the ten-line example that defines its model."""
    import sys

    from _util import ROOT, run_process
    text = (ROOT / "README.md").read_text()
    blocks = []
    for head in ("## About ten lines of Python", "### Captured steps: `wr.jit`"):
        start = text.index("```python", text.index(head)) + len("```python")
        blocks.append(text[start:text.index("```", start)])
    script = tmp_path / "readme_jit.py"
    script.write_text(blocks[0] + blocks[1] + "print('jit', loss.item(), train_step.replays)\n")
    p = run_process([sys.executable, script], 200)
    assert p.returncode == 0, p.stderr
    _, loss, replays = p.stdout.splitlines()[-1].split()
    assert float(loss) < 0.15 and int(replays) == 98


def test_refuses_data_parallel_inside_and_work_on_two_devices(devs, rng):
    """Wrapping a DataParallel step in wr.jit, or one function's work on two devices, fails
    clearly instead of replaying half a step (DataParallel(jit=True) is the composition)."""
    from wgrumus.parallel import DataParallel
    x = wr.tensor(rng.standard_normal((4, 6)).astype(np.float32))
    y = wr.tensor(rng.integers(0, 3, 4), dtype=wr.int32)
    with DataParallel(_mlp(devs[0]), devices=devs[:2]) as dp:
        msg = _capture_error(
            lambda a, b: dp.train_step(a, b, F.cross_entropy, optim.SGD), x, y)
        assert "DataParallel.train_step" in msg
    w1 = wr.tensor(np.ones(6, np.float32), device=devs[1])
    msg = _capture_error(lambda a: (a * 2.0, w1 * 3.0), x)
    assert "on 2 devices" in msg
    assert all(d.recorder is None for d in devs)


@pytest.mark.parametrize("world", [1, 3])
def test_data_parallel_jit_matches_eager(devs, rng, world):
    """Replicas replaying their captured steps, the bucket all-reduces launched and waited
    for inside the replays: the same losses and weights as eager DataParallel (bit for bit),
    replicas identical, several buckets."""
    from wgrumus.parallel import DataParallel
    batches = _batches("mlp", 5, 9, rng)  # 9 rows over 3 replicas: 3 each
    runs = []
    for use in (False, True):
        dp = DataParallel(_mlp(devs[0]), devices=devs[:world], jit=use, bucket_cap_mb=1e-4,
                          first_bucket_mb=1e-4)
        assert len(dp.plan.buckets) > 1
        opts = [optim.AdamW(r.parameters(), lr=3e-2) for r in dp.replicas]
        with dp:
            losses = [dp.train_step(x, y.astype(np.int32), F.cross_entropy, opts)
                      for x, y in batches]
            assert dp.replicas_identical()
            replays = sorted(j.replays for j in dp._jits.values())
            runs.append((losses, [p.numpy() for p in dp.parameters()], replays))
        assert not dp._jits  # close() freed the captures
    assert runs[1][2] == [3] * world  # one capture per replica: warm-up, capture, 3 replays
    np.testing.assert_array_equal(runs[1][0], runs[0][0])
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("opt_cls", [optim.Adam, optim.SGD])
def test_optimizer_state_replaced_after_capture_is_refused(dev, opt_cls):
    p = nn.Parameter(wr.tensor(np.ones(3, np.float32)))
    opt = opt_cls([p], lr=0.1, **({"momentum": 0.9} if opt_cls is optim.SGD else {}))

    @wr.jit
    def step(t):
        opt.zero_grad()
        (p * t).sum().backward()
        opt.step()
    x = wr.tensor(np.arange(3, dtype=np.float32))
    for _ in range(3):
        step(x)
    opt.load_state_dict(opt.state_dict())
    with pytest.raises(wr.CaptureError, match="load_state_dict"):
        step(x)
    step.free()
    before = p.numpy()
    for _ in range(3):  # eager again, capture again, replay
        step(x)
    assert step.replays == 2 and not np.array_equal(p.numpy(), before)


@pytest.mark.timeout(120)
def test_communication_inside_a_capture_runs_between_replayed_segments(devs):
    """Each rank captures a step with an all-reduce, a send and a receive in it: replays run
    them again on the new data (the results follow every call's inputs) with the device work
    before and after replayed around them."""
    from wgrumus.distributed import spawn

    def rank(group):
        dev = group.device

        @wr.jit(devices=[dev])
        def step(x):
            y = group.all_reduce(x * 2.0, "sum")
            if group.rank == 0:
                group.send(y + 1.0, 1, tag=3)
                return y
            return y + group.recv(0, tag=3, device=dev)
        outs = [step(wr.tensor(np.full(5, i + group.rank, np.float32), device=dev)).numpy()
                for i in range(4)]
        return outs, step.replays, step.stats()["captures"]

    res = spawn(rank, 2, devices=devs[:2], timeout=30)
    for i in range(4):
        s = 2.0 * i + 2.0 * (i + 1)  # the sum over the ranks of 2 (i + rank)
        np.testing.assert_array_equal(res[0][0][i], np.full(5, s))
        np.testing.assert_array_equal(res[1][0][i], np.full(5, 2 * s + 1))
    assert res[0][1] == res[1][1] == 2 and res[0][2] == [2] and res[1][2] == [2]


@pytest.mark.timeout(120)
def test_async_all_reduce_is_launched_and_joined_inside_the_replay(devs):
    """An all_reduce_async in a capture replays as a launch (after the work before it is
    submitted) and a join where the capture waited: the work in between is submitted before
    the replay waits, and the results follow every call's data. Not waiting for it inside the
    function is refused at capture."""
    from wgrumus.distributed import spawn

    def rank(group):
        dev = group.device

        @wr.jit(devices=[dev])
        def step(x):
            work = group.all_reduce_async(x * 2.0, "sum")
            y = x + 1.0  # independent of the all-reduce: replayed before the wait
            return work.wait(30.0) * y
        outs = [step(wr.tensor(np.full(3, i + group.rank, np.float32), device=dev)).numpy()
                for i in range(4)]
        trace = [e[0] for e in step.last_trace]
        unwaited = wr.jit(lambda x: [group.all_reduce_async(x, "sum")], warmup=0,
                          devices=[dev])
        with pytest.raises(wr.CaptureError, match="was not waited for inside it"):
            unwaited(wr.tensor(np.ones(3, np.float32), device=dev))
        return outs, trace

    res = spawn(rank, 2, devices=devs[:2], timeout=30)
    for r in range(2):
        for i in range(4):
            expect = (2.0 * i + 2.0 * (i + 1)) * (i + r + 1.0)
            np.testing.assert_array_equal(res[r][0][i], np.full(3, expect))
        assert res[r][1] == ["submit", "launch", "submit", "join", "submit"]
