"""Pipeline executor: thread-per-stage runs of every schedule on logical devices.

Equivalence with the same model run unpipelined on one device (loss and every gradient), the
executed action order against the schedule, activation memory (1F1B vs GPipe), faults in any stage
and micro-batch (forward and backward), timeouts, bad inputs, and the model splitters.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.autograd.tape import record
from wgrumus.distributed.pipeline import (
    PipelineConfigError,
    PipelineError,
    PipelineExecutor,
    PipelineShapeError,
    PipelineStage,
    PipelineTimeoutError,
    StageChain,
    balanced_partition,
    get_schedule,
    split_gpt,
    split_sequential,
)

SCHEDULES = ["gpipe", "1f1b", "zb_h1", "interleaved"]
BATCH, WIDTH = 8, 8


class Dense:
    """y = x W^T + b (+ relu): a layer built from raw tensors with ``.to`` and ``.parameters``."""

    def __init__(self, w: np.ndarray, b: np.ndarray, relu: bool, device=None):
        self.W = wr.tensor(w, device=device, requires_grad=True)
        self.b = wr.tensor(b, device=device, requires_grad=True)
        self.relu = relu

    def to(self, device):
        with wr.no_grad():
            self.W = self.W.to(device).detach().requires_grad_(True)
            self.b = self.b.to(device).detach().requires_grad_(True)
        return self

    def parameters(self):
        return [self.W, self.b]

    def __call__(self, x):
        y = x @ self.W.T + self.b
        return y.relu() if self.relu else y


def mse(out, target):
    d = out - target
    return (d * d).mean()


def make_weights(n_layers: int, seed: int = 0, dims=None):
    rng = np.random.default_rng(seed)
    dims = dims or [WIDTH] * (n_layers + 1)
    return [(rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i),
             (0.1 * rng.standard_normal(o)).astype(np.float32)) for i, o in zip(dims, dims[1:])]


def make_layers(weights, device=None):
    n = len(weights)
    return [Dense(w, b, relu=i < n - 1, device=device) for i, (w, b) in enumerate(weights)]


def make_data(seed: int = 1, batch: int = BATCH, din: int = WIDTH, dout: int = WIDTH):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, din)).astype(np.float32),
            rng.standard_normal((batch, dout)).astype(np.float32))


def reference(weights, x, t, dev):
    """Loss and gradients of the whole model on one device, no pipeline."""
    layers = make_layers(weights, dev)
    h = wr.tensor(x, device=dev)
    for layer in layers:
        h = layer(h)
    loss = mse(h, wr.tensor(t, device=dev))
    store = wr.autograd.backward(loss)
    return loss.item(), [store.get(p).numpy() for l in layers for p in l.parameters()]


def pipeline_stages(layers, devs, p):
    """Layer k on device 1 + (k mod p): chunk c of stage s shares stage s's device."""
    return [PipelineStage(l, devs[1 + k % p]) for k, l in enumerate(layers)]


def wait_threads(baseline: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    return threading.active_count()


# ---------------------------------------------------------------------------------------------
# equivalence with the unpipelined model
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_matches_single_device(devs, schedule, p, m):
    n_layers = 2 * p if schedule == "interleaved" else p
    weights = make_weights(n_layers)
    x, t = make_data()
    ref_loss, ref_grads = reference(weights, x, t, devs[0])
    layers = make_layers(weights)
    stages = pipeline_stages(layers, devs, p)
    if schedule == "interleaved" and m % p:
        with pytest.raises(PipelineConfigError, match="must be a multiple of the number of stages"):
            PipelineExecutor(stages, m, schedule=schedule)
        return
    baseline = threading.active_count()
    ex = PipelineExecutor(stages, m, schedule=schedule, timeout=30)
    loss, store = ex.run(x, t, mse)
    assert wait_threads(baseline) == baseline
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    params = [prm for l in layers for prm in l.parameters()]
    assert len(store) == len(params)
    for k, (prm, g_ref) in enumerate(zip(params, ref_grads)):
        assert prm.device is stages[k // 2].device
        np.testing.assert_allclose(store.get(prm).numpy(), g_ref, rtol=1e-4, atol=1e-6,
                                   err_msg=f"parameter {k} ({schedule}, p={p}, m={m})")
    # the run followed its schedule, action for action
    assert ex.last_trace.executed() == [list(a) for a in ex.schedule]


@pytest.mark.timeout(30)
def test_two_steps_and_grad_accumulation(devs):
    """Run twice with accumulate_grad: .grad holds the sum, the store holds one step."""
    weights = make_weights(2)
    x, t = make_data()
    _, ref_grads = reference(weights, x, t, devs[0])
    layers = make_layers(weights)
    ex = PipelineExecutor(pipeline_stages(layers, devs, 2), 4, schedule="1f1b")
    for _ in range(2):
        _, store = ex.run(wr.tensor(x, device=devs[3]), wr.tensor(t, device=devs[5]), mse,
                          accumulate_grad=True)
    params = [prm for l in layers for prm in l.parameters()]
    for prm, g_ref in zip(params, ref_grads):
        np.testing.assert_allclose(store.get(prm).numpy(), g_ref, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(prm.grad.numpy(), 2 * g_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(30)
def test_hand_written_schedule_with_out_of_order_messages(devs):
    """A Schedule given as data runs as written, even when a stage takes its gradients in another
    order than its neighbour sends them (stage 0 wants B1 first, stage 1 sends B0 first)."""
    weights = make_weights(2)
    x, t = make_data()
    ref_loss, ref_grads = reference(weights, x, t, devs[0])
    layers = make_layers(weights)
    sched = [["F0", "F1", "B1", "B0"], ["F0", "F1", "B0", "B1"]]
    ex = PipelineExecutor(pipeline_stages(layers, devs, 2), 2, schedule=sched)
    loss, store = ex.run(x, t, mse)
    assert ex.last_trace.to_strings() == sched
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for prm, g_ref in zip([q for l in layers for q in l.parameters()], ref_grads):
        np.testing.assert_allclose(store.get(prm).numpy(), g_ref, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# the executed order, the timeline and activation memory
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_1f1b_order_and_dependencies(devs):
    p, m = 4, 8
    layers = make_layers(make_weights(p))
    ex = PipelineExecutor(pipeline_stages(layers, devs, p), m, schedule="1f1b")
    x, t = make_data(batch=16)
    ex.run(x, t, mse)
    trace = ex.last_trace
    expected = get_schedule("1f1b", p, m)
    print("\n" + expected.format() + "\n" + trace.format())
    assert trace.to_strings() == expected.to_strings()
    # causality in the recorded timestamps: F(mb) on stage s got its input after stage s - 1
    # sent it; B(mb) on stage s - 1 got its gradient after stage s sent it
    rec = {(r.stage, repr(r.action)): r for recs in trace.records for r in recs}
    for s in range(1, p):
        for mb in range(m):
            assert rec[(s, f"F{mb}")].received >= rec[(s - 1, f"F{mb}")].sent
            assert rec[(s - 1, f"B{mb}")].received >= rec[(s, f"B{mb}")].sent
            assert rec[(s, f"F{mb}")].end > rec[(s - 1, f"F{mb}")].start
    # stages really overlap: the whole step is shorter than the sum of all stages' busy time
    assert trace.makespan < sum(trace.busy())
    assert all(0 <= f < 1 for f in trace.stage_bubble_fractions())


@pytest.mark.timeout(30)
def test_peak_activation_memory_1f1b_vs_gpipe(devs):
    """Stage 0 holds min(p, m) micro-batches under 1F1B and all m under GPipe."""
    p, m = 2, 8
    x, t = make_data(batch=16)
    peaks = {}
    for name in ("1f1b", "gpipe"):
        ex = PipelineExecutor(pipeline_stages(make_layers(make_weights(p)), devs, p), m,
                              schedule=name)
        ex.run(x, t, mse)
        recs = ex.last_trace.records[0]
        one = recs[0].live_bytes  # after F0: one micro-batch in flight
        assert one > 0
        peaks[name] = ex.last_trace.peak_activation_bytes()[0] / one
        assert recs[-1].live_bytes == 0  # everything released after the last backward
    assert peaks == {"1f1b": min(p, m), "gpipe": m}


# ---------------------------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------------------------


class Boom(RuntimeError):
    pass


class FaultyDense(Dense):
    """Raises in the forward (or in the backward) of one micro-batch."""

    def __init__(self, w, b, relu, fail_mb: int, phase: str):
        super().__init__(w, b, relu)
        self.fail_mb, self.phase, self.calls = fail_mb, phase, 0

    def __call__(self, x):
        mb, self.calls = self.calls, self.calls + 1
        if self.phase == "forward" and mb == self.fail_mb:
            raise Boom(f"injected forward fault at micro-batch {mb}")
        y = super().__call__(x)
        if self.phase == "backward":
            out = y + 0.0

            def bw(g, mb=mb):
                if mb == self.fail_mb:
                    raise Boom(f"injected backward fault at micro-batch {mb}")
                return (g,)
            record("fault_probe", out, [y], bw)
            return out
        return y


@pytest.mark.timeout(30)
@pytest.mark.parametrize("schedule,stage,mb,phase", [
    ("1f1b", 0, 0, "forward"),
    ("1f1b", 2, 3, "forward"),
    ("1f1b", 1, 2, "backward"),
    ("1f1b", 0, 3, "backward"),
    ("gpipe", 2, 0, "backward"),
    ("zb_h1", 1, 1, "backward"),
])
def test_fault_in_any_stage_stops_all(devs, schedule, stage, mb, phase):
    p, m = 3, 4
    weights = make_weights(p)
    layers = make_layers(weights)
    w, b = weights[stage]
    layers[stage] = FaultyDense(w, b, stage < p - 1, mb, phase)
    baseline = threading.active_count()
    ex = PipelineExecutor(pipeline_stages(layers, devs, p), m, schedule=schedule, timeout=20)
    x, t = make_data()
    t0 = time.monotonic()
    with pytest.raises(PipelineError) as info:
        ex.run(x, t, mse)
    elapsed = time.monotonic() - t0
    err = info.value
    msg = str(err)
    print("\n" + msg)
    assert f"stage {stage}" in msg and f"micro-batch {mb}" in msg
    assert err.stage == stage and err.micro_batch == mb
    assert isinstance(err.__cause__, Boom)
    assert elapsed < 10, "the other stages were not stopped by the abort event"
    assert wait_threads(baseline) == baseline
    # the same executor works again once the fault is gone
    layers[stage].fail_mb = -1
    layers[stage].calls = 0
    loss, _ = ex.run(x, t, mse)
    assert np.isfinite(loss)


@pytest.mark.timeout(30)
def test_stuck_neighbour_times_out(devs):
    class Slow:
        def __init__(self):
            self.calls = 0

        def __call__(self, x):
            self.calls += 1
            if self.calls == 1:
                time.sleep(1.5)
            return x * 2.0

    layers = make_layers(make_weights(1))
    stages = [PipelineStage(Slow(), devs[1]), PipelineStage(layers[0], devs[2])]
    baseline = threading.active_count()
    ex = PipelineExecutor(stages, 2, schedule="1f1b", timeout=0.4)
    x, t = make_data()
    with pytest.raises(PipelineTimeoutError, match=r"stage 1.*micro-batch 0.*waited more than"):
        ex.run(x, t, mse)
    assert wait_threads(baseline) == baseline


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_batch_not_divisible(devs):
    ex = PipelineExecutor(pipeline_stages(make_layers(make_weights(2)), devs, 2), 4)
    x, t = make_data(batch=6)
    with pytest.raises(PipelineConfigError, match=r"batch size 6 .* not divisible by "
                                                   r"num_micro_batches=4"):
        ex.run(x, t, mse)


@pytest.mark.timeout(30)
def test_wrong_number_of_stages_for_schedule(devs):
    stages = pipeline_stages(make_layers(make_weights(3)), devs, 3)
    with pytest.raises(PipelineConfigError, match="multiple of 2"):
        PipelineExecutor(stages, 4, schedule="interleaved")
    with pytest.raises(PipelineConfigError, match="num_chunks"):
        PipelineExecutor(stages, 4, schedule="1f1b", num_chunks=2)
    with pytest.raises(PipelineConfigError, match="4 model pieces"):
        PipelineExecutor(stages, 4, schedule=get_schedule("1f1b", 4, 4))
    with pytest.raises(PipelineConfigError, match="unknown pipeline schedule"):
        PipelineExecutor(stages, 4, schedule="2f2b")
    with pytest.raises(PipelineConfigError, match="PipelineStage"):
        PipelineExecutor(make_layers(make_weights(2)), 4)
    with pytest.raises(PipelineConfigError, match="num_micro_batches"):
        PipelineExecutor(stages, 0)
    ex = PipelineExecutor(stages, 4)
    x, t = make_data()
    with pytest.raises(PipelineConfigError, match="one per PipelineStage"):
        ex.run(x, t, mse, optimizers=[None])


@pytest.mark.timeout(30)
def test_stage_output_shape_mismatch_names_both_stages(devs):
    weights = make_weights(2, dims=[8, 16, 4])
    w1, b1 = make_weights(1, dims=[8, 4])[0]  # expects 8 features, gets 16
    layers = [Dense(*weights[0], relu=True), Dense(w1, b1, relu=False)]
    baseline = threading.active_count()
    ex = PipelineExecutor(pipeline_stages(layers, devs, 2), 2, schedule="1f1b")
    x, t = make_data(dout=4)
    with pytest.raises(PipelineShapeError) as info:
        ex.run(x, t, mse)
    msg = str(info.value)
    print("\n" + msg)
    assert "stage 1 cannot take the output of stage 0" in msg
    assert "(4, 16)" in msg and "micro-batch 0" in msg
    assert isinstance(info.value, wr.ShapeError)
    assert wait_threads(baseline) == baseline


@pytest.mark.timeout(30)
def test_loss_fn_must_return_scalar(devs):
    ex = PipelineExecutor(pipeline_stages(make_layers(make_weights(2)), devs, 2), 2)
    x, t = make_data()
    with pytest.raises(PipelineShapeError, match="one-element tensor"):
        ex.run(x, t, lambda o, tt: o - tt)


# ---------------------------------------------------------------------------------------------
# splitting a model into stages
# ---------------------------------------------------------------------------------------------


def test_balanced_partition():
    assert balanced_partition([1, 1, 1, 1], 2) == [0, 2, 4]
    assert balanced_partition([4, 1, 1, 1, 1], 2) == [0, 1, 5]
    assert balanced_partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [0, 5, 7, 9]
    with pytest.raises(ValueError, match="cannot cut 2 layer"):
        balanced_partition([1, 1], 3)


@pytest.mark.timeout(30)
def test_split_sequential_balances_and_runs(devs):
    dims = [8, 32, 8, 8, 8, 8, 4]  # one heavy layer first, then light ones
    weights = make_weights(6, dims=dims)
    layers = make_layers(weights)
    parts = split_sequential(layers, 3)
    sizes = [sum(int(p.numel()) for p in part.parameters()) for part in parts]
    print("\nstage parameter counts:", sizes)
    assert [len(part) for part in parts] == [1, 1, 4]  # 288 | 264 | 3*72+36
    assert max(sizes) == min(max(s) for s in _all_cuts(layers, 3))
    with pytest.raises(ValueError, match="cannot cut 6 layer"):
        split_sequential(layers, 7)
    # the split stages pipeline to the same result as the whole model
    x, t = make_data(dout=4)
    ref_loss, ref_grads = reference(weights, x, t, devs[0])
    stages = split_sequential(layers, 3, devices=devs[1:4])
    loss, store = PipelineExecutor(stages, 4).run(x, t, mse)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    grads = [store.get(p).numpy() for l in layers for p in l.parameters()]
    for g, g_ref in zip(grads, ref_grads):
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6)


def _all_cuts(layers, p):
    import itertools
    counts = [sum(int(x.numel()) for x in l.parameters()) for l in layers]
    for cut in itertools.combinations(range(1, len(layers)), p - 1):
        bounds = (0,) + cut + (len(layers),)
        yield [sum(counts[a:b]) for a, b in zip(bounds, bounds[1:])]


def test_stage_chain_and_stage_placement(devs):
    layers = make_layers(make_weights(2))
    st = PipelineStage(StageChain(layers), devs[2])
    assert all(p.device is devs[2] for p in st.parameters())
    assert st.num_parameters() == 2 * (WIDTH * WIDTH + WIDTH)
    fn = PipelineStage(lambda x: x * 2.0, devs[1])
    assert fn.parameters() == []
    out = fn(wr.ones((2, 2), device=devs[0]))
    assert out.device is devs[1] and float(out.sum().item()) == 8.0
    with pytest.raises(TypeError, match="callable"):
        PipelineStage(42, devs[0])


# ---------------------------------------------------------------------------------------------
# with wgrumus.nn and wgrumus.optim
# ---------------------------------------------------------------------------------------------


def _mlp(seed: int):
    nn = wr.nn
    return nn.Sequential(nn.Linear(8, 16, seed=seed), nn.ReLU(), nn.Linear(16, 16, seed=seed + 1),
                         nn.ReLU(), nn.Linear(16, 16, seed=seed + 2), nn.ReLU(),
                         nn.Linear(16, 4, seed=seed + 3))


@pytest.mark.timeout(30)
def test_nn_sequential_split_pipeline_and_sgd_step(devs):
    """split_sequential on an nn.Sequential, one SGD per stage: same weights after one step as
    the unpipelined model trained on one device."""
    model, ref = _mlp(3), _mlp(100)
    ref.load_state_dict(model.state_dict())
    ref.to(devs[0])
    x, t = make_data(dout=4)
    out = ref(wr.tensor(x, device=devs[0]))
    ref_loss = wr.nn.functional.mse_loss(out, wr.tensor(t, device=devs[0]))
    ref_loss.backward()
    wr.optim.SGD(ref.parameters(), lr=0.1).step()

    stages = split_sequential(model, 2, devices=devs[1:3])
    assert all(isinstance(st.module, wr.nn.Sequential) for st in stages)
    assert [len(st.module) for st in stages] == [3, 4]  # L1 R L2 (416 params) | R L3 R L4 (340)
    opts = [wr.optim.SGD(st.parameters(), lr=0.1) for st in stages]
    loss, _ = PipelineExecutor(stages, 4).run(x, t, wr.nn.functional.mse_loss, optimizers=opts)
    assert loss == pytest.approx(ref_loss.item(), rel=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.timeout(60)
def test_split_gpt_matches_whole_model(devs):
    nn = wr.nn
    cfg = dict(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
    gpt, ref = nn.GPT(**cfg, seed=0), nn.GPT(**cfg, seed=1)
    ref.load_state_dict(gpt.state_dict())
    ref.to(devs[0])
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 16, size=(4, 8)).astype(np.int32)
    tgt = rng.integers(0, 16, size=(4, 8)).astype(np.int32)

    def loss_fn(logits, target):
        return nn.functional.cross_entropy(logits.reshape(-1, 16), target.reshape(-1))

    ref_loss = loss_fn(ref(wr.tensor(idx, device=devs[0])), wr.tensor(tgt, device=devs[0]))
    ref_store = wr.autograd.backward(ref_loss)

    with pytest.raises(ValueError, match="cannot be cut into 6 stages"):
        split_gpt(gpt, 6)
    stages = split_gpt(gpt, 3, devices=devs[1:4])  # embedding, 2 blocks, ln_f, head -> 3 stages
    counts = [st.num_parameters() for st in stages]
    print("\nGPT stage parameter counts:", counts)
    assert sum(counts) == sum(int(p.numel()) for p in ref.parameters())
    loss, store = PipelineExecutor(stages, 2, schedule="1f1b").run(idx, tgt, loss_fn)
    assert loss == pytest.approx(ref_loss.item(), rel=1e-5)
    for (name, p), (_, q) in zip(gpt.named_parameters(), ref.named_parameters()):
        np.testing.assert_allclose(store.get(p).numpy(), ref_store.get(q).numpy(), rtol=1e-3,
                                   atol=1e-5, err_msg=name)
