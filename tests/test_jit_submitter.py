"""Replays handed to a CPU adapter's submission thread (runtime/submitter.py): several steps
queued and read afterwards give the eager losses step by step, a failure in the thread is
raised on the host, and waits time out with a clear error."""
import threading
import time

import numpy as np
import pytest
from test_jit import _batches, _mlp, _plain_step, _same, _train

import wgrumus as wr
from wgrumus import optim
from wgrumus.nn import functional as F
from wgrumus.runtime import submitter
from wgrumus.runtime.errors import SubmitTimeout
from wgrumus.runtime.tuning import TUNING

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def queued(dev, monkeypatch):
    """Replays go through the submission thread (whatever the adapter) and every submit of
    the device takes 10 ms longer, so the host gets steps ahead of the queue."""
    monkeypatch.setattr(TUNING, "submitter", True)
    real = dev.submit
    monkeypatch.setattr(dev, "submit", lambda cb: (time.sleep(0.01), real(cb))[1])
    sub = dev.replay_submitter()
    sub.queued_max = 0
    yield sub
    monkeypatch.undo()
    sub.drain()


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_queued_replays_match_eager_step_by_step(dev, rng, queued, kind):
    """Losses kept as tensors while the next steps (with new input tensors, written behind the
    queued replays) are queued, and read only at the end, equal eager's one by one."""
    batches = _batches(kind, 8, 4, rng)
    eager = _train(kind, dev, batches, False)
    jitted = _train(kind, dev, batches, True)
    _same(eager, jitted)
    assert jitted[2].replays == 6 and queued.queued_max >= 3


def test_host_writes_wait_behind_queued_replays(dev, rng, queued):
    """Parameters loaded from host arrays while steps that update them are queued take effect
    after those steps, as in eager."""
    batches = _batches("mlp", 7, 4, rng)
    batches[5] = batches[0]  # from the initial weights again: the first step's loss

    def run(use_jit):
        model = _mlp(dev)
        init = {k: v.numpy() for k, v in model.state_dict().items()}
        step = _plain_step(model, optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
        fn = wr.jit(step) if use_jit else step
        losses = []
        for i, (x, y) in enumerate(batches):
            if i == 5:
                model.load_state_dict(init)
            losses.append(fn(wr.tensor(x), wr.tensor(y, dtype=wr.int32)))
        return [v.item() for v in losses]
    eager, jitted = run(False), run(True)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=0)
    assert eager[5] == pytest.approx(eager[0], rel=1e-6) and queued.queued_max >= 3


def _jitted_mlp(dev, rng):
    model = _mlp(dev)
    step = wr.jit(_plain_step(model, optim.SGD(model.parameters(), lr=0.1), F.mse_loss))
    x, y = wr.tensor(rng.standard_normal((4, 6))), wr.tensor(rng.standard_normal((4, 3)))
    step(x, y), step(x, y)  # warm-up, capture
    return step, next(iter(step._captures.values())).replay_obj, x, y


def test_failure_in_submission_thread_raises_on_host(dev, rng, queued, monkeypatch):
    step, rep, x, y = _jitted_mlp(dev, rng)

    def broken(*args):
        raise ValueError("injected submit failure")
    monkeypatch.setattr(rep, "_submit", broken)
    loss = step(x, y)  # queued: returns before the failure
    with pytest.raises(RuntimeError, match="failed in its submission thread.*injected") as e:
        loss.item()
    assert isinstance(e.value.__cause__, ValueError)
    monkeypatch.undo()  # the error was raised once; the device works on
    monkeypatch.setattr(TUNING, "submitter", True)
    step(x, y).item()


def test_wait_times_out_with_clear_error(dev, rng, queued, monkeypatch):
    step, rep, x, y = _jitted_mlp(dev, rng)
    release = threading.Event()
    real = rep._submit
    monkeypatch.setattr(rep, "_submit", lambda *a: (release.wait(30), real(*a)))
    monkeypatch.setattr(queued, "timeout", 0.3)
    loss = step(x, y)
    t = time.monotonic()
    with pytest.raises(SubmitTimeout, match="did not finish in 0.3 s.*WGRUMUS_SUBMIT_TIMEOUT"):
        loss.item()
    assert time.monotonic() - t < 10
    release.set()
    queued.drain()
    assert loss.item() > 0


def test_submitter_queue_is_bounded():
    """A full queue makes ``put`` wait (for a slot, with the timeout); jobs run in order."""
    sub = submitter.Submitter("test", depth=2, timeout=0.3)
    gate, done = threading.Event(), []
    sub.put(gate.wait, 30)
    sub.put(done.append, 1)
    sub.put(done.append, 2)  # the first job runs, two wait: the queue is full
    with pytest.raises(SubmitTimeout, match="a queue slot"):
        sub.put(done.append, 3)
    gate.set()
    sub.drain()
    assert done == [1, 2] and not sub.busy()


def test_drain_waits_for_a_job_leaving_the_queue():
    """drain() must not see 'nothing queued, nothing running' while the thread is taking a job
    off the queue (it would let later queue work overtake the step)."""
    import collections

    class SlowDeque(collections.deque):
        def popleft(self):
            item = super().popleft()
            time.sleep(0.05)  # the window between leaving the queue and running
            return item

    sub = submitter.Submitter("test", timeout=10)
    sub._jobs = SlowDeque()
    ran = []
    sub.put(ran.append, 1)
    time.sleep(0.01)  # the thread is inside popleft now
    sub.drain()
    assert ran == [1]


def test_gpu_timer_does_not_time_replays_queued_before_it(dev, queued):
    """A GpuTimer block waits for the replays queued before it: they are not its passes."""
    from wgrumus.runtime import GpuTimer
    if "timestamp-query" not in dev.features:
        pytest.skip("adapter without timestamp-query")
    a = wr.tensor(np.ones((64, 64), np.float32), device=dev)
    f = wr.jit(lambda x: x @ x)
    for _ in range(3):
        f(a)  # eager, capture, first replay
    dev.synchronize()
    for _ in range(6):
        f(a)
    with GpuTimer(dev) as t:
        time.sleep(0.2)
    assert t.passes == 0
