"""DataParallel on logical devices of one adapter: equivalence with one device (SGD, AdamW, uneven
shards), bit-identical replicas, bucket all-reduce overlapping backward (through recorded
events), no_sync accumulation, faults, AllReduceSync, the autograd on_leaf_grad hook, and the
MPI backend under mpiexec.

The model and optimizers here are small stand-ins written with wgrumus ops (the tests do not
depend on wr.nn / wr.optim); the GPU does all the math, numpy only builds data and compares."""
import sys
import textwrap
import time

import numpy as np
import pytest
from _util import mpiexec, run_process

import wgrumus as wr
from wgrumus.autograd import backward
from wgrumus.autograd.tape import record
from wgrumus.kernels.map import run_map
from wgrumus.parallel import AllReduceSync, DataParallel, ReplicaError, plan_buckets, shard_sizes


# ---------------------------------------------------------------------------------- stand-ins
class TinyMLP:
    """Module API subset DataParallel relies on: parameters(), named_parameters(), to(),
    state_dict(), __call__."""

    def __init__(self, sizes=(6, 16, 3), device=None, seed=0, fail=None):
        rng = np.random.default_rng(seed)
        self.names, self.params = [], []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            self.names += [f"{i}.weight", f"{i}.bias"]
            self.params += [
                wr.tensor(rng.standard_normal((b, a)).astype(np.float32) / np.sqrt(a),
                          device=device, requires_grad=True),
                wr.tensor(rng.standard_normal(b).astype(np.float32) * 0.1, device=device,
                          requires_grad=True)]
        self.fail = fail  # (replica device index, "forward" | "backward") to inject a fault

    def parameters(self):
        return list(self.params)

    def named_parameters(self):
        return list(zip(self.names, self.params))

    def state_dict(self):
        return dict(self.named_parameters())

    def to(self, device):
        dev = wr.runtime.get_device(device)
        for p in self.params:
            if p.device is not dev:
                m = p.detach().to(dev)
                p._storage, p.strides, p.offset = m._storage, m.strides, m.offset
        return self

    def __call__(self, x):
        dev = self.params[0].device
        if self.fail == (dev.index, "forward"):
            raise RuntimeError("injected forward failure")
        h = x
        for i in range(0, len(self.params), 2):
            h = h @ self.params[i].T + self.params[i + 1]
            if i + 2 < len(self.params):
                h = h.relu()
        if self.fail == (dev.index, "backward"):
            out = h * 1.0

            def bw(g):
                raise RuntimeError("injected backward failure")
            record("boom", out, [h], bw)
            return out
        return h


def mse(out, y):
    d = out - y
    return (d * d).mean()


class SGD:
    def __init__(self, params, lr=0.05, momentum=0.9):
        self.params, self.lr, self.mom = list(params), lr, momentum
        self.buf = [None] * len(self.params)

    def step(self, grads):
        with wr.no_grad():
            for i, p in enumerate(self.params):
                g = grads.get(p)
                if self.buf[i] is None:
                    self.buf[i] = g.clone()
                else:
                    run_map("a * pf(48u) + b", self.buf[i], [self.buf[i], g], [self.mom])
                run_map("a - pf(48u) * b", p, [p, self.buf[i]], [self.lr])


class AdamW:
    def __init__(self, params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params, self.lr, self.b, self.eps, self.wd = list(params), lr, betas, eps, weight_decay
        self.m = [wr.zeros(*p.shape, device=p.device) for p in self.params]
        self.v = [wr.zeros(*p.shape, device=p.device) for p in self.params]
        self.t = 0

    def step(self, grads):
        self.t += 1
        b1, b2 = self.b
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        with wr.no_grad():
            for p, m, v in zip(self.params, self.m, self.v):
                g = grads.get(p)
                run_map("a * pf(48u) + b * (1.0 - pf(48u))", m, [m, g], [b1])
                run_map("a * pf(48u) + b * b * (1.0 - pf(48u))", v, [v, g], [b2])
                run_map("a * (1.0 - pf(48u) * pf(49u)) - pf(48u) * (b / pf(50u)) / "
                        "(sqrt(c / pf(51u)) + pf(52u))", p, [p, m, v],
                        [self.lr, self.wd, c1, c2, self.eps])


OPTS = {"sgd": SGD, "adamw": AdamW}


def data(steps, batch, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 6)).astype(np.float32),
             rng.standard_normal((batch, 3)).astype(np.float32)) for _ in range(steps)]


def reference(dev, batches, opt_name, micro=1):
    """Plain single-device training on the global batches (``micro`` batches per step)."""
    model = TinyMLP(device=dev)
    opt = OPTS[opt_name](model.parameters())
    losses = []
    for s in range(0, len(batches), micro):
        total = None
        for x, y in batches[s:s + micro]:
            loss = mse(model(wr.tensor(x, device=dev)), wr.tensor(y, device=dev))
            g = backward(loss)
            if total is None:
                total = g
            else:
                total.merge_from(g)
            losses.append(loss.item())
        opt.step(total)
    return model, losses


# ---------------------------------------------------------------------------------- plan
def test_bucket_plan_is_reverse_order_plain_data():
    shapes = [(256, 256), (256,), (256, 512), (512,), (1000, 100)]
    ps = [wr.Tensor.empty(s) for s in shapes]
    for p in ps:
        p.requires_grad_(True)
    plan = plan_buckets(ps, bucket_cap_mb=0.6, first_bucket_mb=0.3,
                        names=[f"p{i}" for i in range(5)])
    order = [i for b in plan for i in b.params]
    assert order == [4, 3, 2, 1, 0]  # reverse parameter order
    # p4 (400 KB) alone exceeds the 0.3 MB first cap -> own bucket; then p3+p2+p1 (515 KB)
    # fit 0.6 MB; p0 (256 KB) would not, so it starts the last bucket.
    assert [b.params for b in plan] == [(4,), (3, 2, 1), (0,)]
    b1 = plan.buckets[1]
    assert b1.offsets == (0, 512, 512 + 256 * 512) and b1.numel == 512 + 256 * 512 + 256
    assert b1.names == ("p3", "p2", "p1") and b1.nbytes == 4 * b1.numel
    assert plan.bucket_of == {4: 0, 3: 1, 2: 1, 1: 1, 0: 2}
    assert "bucket 1" in plan.describe()
    default = plan_buckets(ps)  # 1 MB first bucket takes p4..p1 (~1.0 MB), 25 MB the rest
    assert sum(len(b.params) for b in default) == 5
    with pytest.raises(ValueError, match="> 0 MB"):
        plan_buckets(ps, bucket_cap_mb=0)


def test_shard_sizes_uneven_and_too_small():
    assert shard_sizes(10, 4) == [3, 3, 2, 2]
    assert shard_sizes(8, 4) == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="cannot be split over 4 replicas"):
        shard_sizes(3, 4)


# ---------------------------------------------------------------------------------- engine hook
def test_on_leaf_grad_reports_final_gradients_before_backward_ends(dev, rng):
    model = TinyMLP(device=dev)
    x = wr.tensor(rng.standard_normal((4, 6)).astype(np.float32), device=dev)
    w0 = model.params[0]
    # w0 feeds the graph twice (a second, later-recorded use), so its gradient has two parts.
    out = model(x).sum() + (w0 * w0).sum()
    calls = []
    store = backward(out, on_leaf_grad=lambda gid, g: calls.append((gid, g.numpy().copy())))
    ids = [gid for gid, _ in calls]
    assert sorted(ids) == sorted(p.grad_id for p in model.params) and len(set(ids)) == 4
    # Reverse order of use: the last layer is final before the first one.
    assert ids.index(model.params[2].grad_id) < ids.index(model.params[0].grad_id)
    for gid, g in calls:  # reported value == final accumulated value
        np.testing.assert_array_equal(g, store.get(gid).numpy())
    # A leaf used as the output itself gets its call too.
    leaf = wr.tensor(np.ones(1, np.float32), device=dev, requires_grad=True)
    seen = []
    backward(leaf, on_leaf_grad=lambda gid, g: seen.append(gid))
    assert seen == [leaf.grad_id]


# ---------------------------------------------------------------------------------- training
@pytest.mark.timeout(120)
@pytest.mark.parametrize("k,opt_name,batch", [(2, "sgd", 8), (4, "adamw", 10), (2, "adamw", 7),
                                              (4, "sgd", 8), (1, "adamw", 8)])
def test_equivalence_with_one_device(devs, k, opt_name, batch):
    batches = data(20, batch)
    ref, ref_losses = reference(devs[0], batches, opt_name)
    model = TinyMLP(device=devs[0])
    with DataParallel(model, devs[:k], first_bucket_mb=1e-4, bucket_cap_mb=1e-3,
                      timeout=30) as dp:
        assert len(dp.plan) >= 2
        for s, (x, y) in enumerate(batches):
            if k == 1:  # one replica: nothing to all-reduce, no comm round trip
                assert not dp.events.events(kind="allreduce_start")
            loss = dp.train_step(x, y, mse, OPTS[opt_name])
            assert loss == pytest.approx(ref_losses[s], rel=1e-4, abs=1e-6), s
            assert dp.replicas_identical(), f"replicas differ after step {s}"
        for p, q in zip(dp.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=2e-4, atol=2e-5)


@pytest.mark.timeout(60)
def test_first_bucket_all_reduce_starts_before_backward_ends(devs):
    model = TinyMLP(sizes=(6, 32, 32, 3), device=devs[0])
    (x, y), = data(1, 8)
    with DataParallel(model, devs[:2], first_bucket_mb=1e-4, bucket_cap_mb=1e-3) as dp:
        assert len(dp.plan) >= 3
        dp.train_step(x, y, mse, SGD)
        for r in range(2):
            evs = dp.events.events(r)
            kinds = [e.kind for e in evs]
            first = kinds.index("allreduce_start")
            end = kinds.index("backward_end")
            assert first < end, kinds
            assert evs[first].bucket == 0
            # ...and more than one bucket was already on its way before backward finished.
            launched = [e.bucket for e in evs[:end] if e.kind == "allreduce_start"]
            assert len(launched) >= 2 and launched == sorted(launched), kinds
            assert kinds.count("allreduce_start") == len(dp.plan)
            assert evs[first].t <= evs[end].t


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [2, 1])
def test_no_sync_accumulation_matches_one_device(devs, k):
    micro = 3
    batches = data(2 * micro, 8, seed=5)
    ref, _ = reference(devs[0], batches, "sgd", micro=micro)
    model = TinyMLP(device=devs[0])
    with DataParallel(model, devs[:k], first_bucket_mb=1e-4, bucket_cap_mb=1e-3) as dp:
        opts = [SGD(r.parameters()) for r in dp.replicas]
        for s in range(0, len(batches), micro):
            with dp.no_sync():
                for x, y in batches[s:s + micro - 1]:
                    dp.train_step(x, y, mse, opts)
                    assert not dp.events.events(kind="allreduce_start")  # nothing synced
            x, y = batches[s + micro - 1]
            dp.train_step(x, y, mse, opts)
            assert dp.replicas_identical()
        for p, q in zip(dp.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=2e-4, atol=2e-5)


def test_forward_gathers_on_device0_and_errors(devs, rng):
    model = TinyMLP(device=devs[0])
    x = rng.standard_normal((5, 6)).astype(np.float32)
    want = model(wr.tensor(x, device=devs[0])).numpy()
    with DataParallel(model, devs[:3]) as dp:
        out = dp(x)
        assert out.device is devs[0] and out.shape == (5, 3)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
        out2 = dp(wr.tensor(x, device=devs[1]))  # a device tensor is scattered too
        np.testing.assert_allclose(out2.numpy(), want, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="cannot be split over 3 replicas"):
            dp(x[:2])
        with pytest.raises(ValueError, match="one optimizer per local replica"):
            dp.train_step(x, np.zeros((5, 3), np.float32), mse, [SGD(model.parameters())])


def test_rumus_workflow_backward_through_gathered_output(devs, rng):
    """forward records the graph across replicas: each replica's gradient is its shard's part,
    and their sum is the single-device gradient of the global-batch loss."""
    model = TinyMLP(device=devs[0])
    ref = TinyMLP(device=devs[0])
    x = rng.standard_normal((7, 6)).astype(np.float32)
    y = rng.standard_normal((7, 3)).astype(np.float32)
    want = backward(mse(ref(wr.tensor(x, device=devs[0])), wr.tensor(y, device=devs[0])))
    with DataParallel(model, devs[:3]) as dp:
        store = backward(mse(dp(x), wr.tensor(y, device=devs[0])))
        for i in range(4):
            parts = [store.get(r.parameters()[i]) for r in dp.replicas]
            assert [g.device for g in parts] == devs[:3]
            np.testing.assert_allclose(sum(g.numpy() for g in parts),
                                       want.get(ref.params[i]).numpy(), rtol=1e-4, atol=1e-6)


def test_replicas_are_independent_copies_and_broadcast_weights(devs):
    model = TinyMLP(device=devs[0])
    with DataParallel(model, devs[:3]) as dp:
        assert dp.replicas[0] is model
        ids = {p.grad_id for r in dp.replicas for p in r.parameters()}
        assert len(ids) == 3 * 4  # every replica's parameters have their own GradIds
        for r, d in zip(dp.replicas, devs):
            assert all(p.device is d for p in r.parameters())
        assert dp.replicas_identical()
        with wr.no_grad():
            run_map("a + 1.0", model.params[1], [model.params[1]])
        assert not dp.replicas_identical()
        dp.broadcast_weights()
        assert dp.replicas_identical()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_failing_replica_raises_clearly_and_nobody_hangs(devs, where):
    (x, y), = data(1, 8)
    model = TinyMLP(device=devs[0], fail=(devs[1].index, where))
    with DataParallel(model, devs[:3], first_bucket_mb=1e-4, bucket_cap_mb=1e-3,
                      timeout=20) as dp:
        t0 = time.monotonic()
        with pytest.raises(ReplicaError, match=rf"replica 1 .* failed in {where}") as ei:
            dp.train_step(x, y, mse, SGD)
        assert time.monotonic() - t0 < 10  # aborted at once, not at the 20 s timeout
        assert ei.value.replica == 1 and ei.value.phase == where
        assert f"injected {where} failure" in str(ei.value)
        # Nothing stepped, and the wrapper is usable again once the fault is gone.
        assert dp.replicas_identical()
        for r in dp.replicas:
            r.fail = None
        dp.train_step(x, y, mse, SGD)
        assert dp.replicas_identical()
    # close() stopped every replica and comm thread: none is left waiting
    assert not any(w._thread.is_alive() for w in dp._workers)
    assert not any(c._thread.is_alive() for c in dp._world._comm_threads.values())


def _jit_steps(devs, batches, jit, **kw):
    """Losses of DataParallel(jit=jit) SGD steps on a 3-layer TinyMLP in several buckets (the
    SGD stand-in's words are constant, so a capture of it replays faithfully)."""
    model = TinyMLP(sizes=(6, 32, 32, 3), device=devs[0])
    dp = DataParallel(model, devs[:2], first_bucket_mb=1e-4, bucket_cap_mb=1e-3, jit=jit, **kw)
    losses = [dp.train_step(x, y, mse, SGD) for x, y in batches]
    return dp, losses


@pytest.mark.timeout(120)
def test_jit_replay_launches_each_bucket_before_submitting_the_rest_of_backward(devs):
    """Overlap inside a replayed step, read from the replay's own trace (no timing): bucket b's
    all-reduce is launched right after the part that packs it was submitted, more backward work
    is submitted before bucket b + 1 launches, and the replay waits for the buckets only after
    the last launch, before the optimizer step. Losses and weights equal the eager run's."""
    batches = data(4, 8, seed=3)  # warm-up, capture, two replays
    eager, eager_losses = _jit_steps(devs, batches, False)
    dp, losses = _jit_steps(devs, batches, True)
    with eager, dp:
        np.testing.assert_allclose(losses, eager_losses, rtol=1e-6, atol=0)
        for p, q in zip(dp.parameters(), eager.parameters()):
            np.testing.assert_array_equal(p.numpy(), q.numpy())
        assert dp.replicas_identical() and len(dp.plan) >= 3
        for r, jf in enumerate(dp._jits.values()):
            trace = jf.last_trace
            kinds = [e[0] for e in trace]
            launches = [i for i, k in enumerate(kinds) if k == "launch"]
            joins = [i for i, k in enumerate(kinds) if k == "join"]
            assert [trace[i][1] for i in launches] == list(range(len(dp.plan))), kinds
            assert [trace[i][1] for i in joins] == list(range(len(dp.plan))), kinds
            assert launches[-1] < joins[0], kinds  # nothing waited for before every launch
            for a, b in zip(launches, launches[1:]):  # backward goes on behind each launch
                assert any(e[0] == "submit" and e[2] > 0 for e in trace[a:b]), kinds
            assert kinds[launches[0] - 1] == "submit" and trace[launches[0] - 1][2] > 0
            assert any(e[0] == "submit" and e[2] > 0 for e in trace[joins[-1]:]), kinds
            # ...and the replay's launches and waits are the step's events
            evs = dp.events.events(r)
            assert [e.bucket for e in evs if e.kind == "allreduce_start"] == \
                list(range(len(dp.plan)))
            assert dp.events.exposed_comm_seconds(r) >= 0.0
            assert {"backward_end", "sync_end", "step_end"} <= {e.kind for e in evs}


@pytest.mark.timeout(60)
def test_jit_replica_failing_with_a_bucket_in_flight_stops_every_replica(devs, monkeypatch):
    """Replica 1 fails inside its replayed step after launching bucket 0 (its all-reduce in
    flight) and before launching bucket 1: replica 0, waiting on bucket 1, raises at once
    (not at the 20 s timeout), the error names replica 1's fault, and the next step captures
    again on fresh groups and trains on."""
    from wgrumus.runtime.replay import Replay
    batches = data(4, 8, seed=4)
    dp, losses = _jit_steps(devs, batches[:3], True, timeout=20)
    real = Replay._host

    def failing(self, op, *a):
        if self.device is devs[1] and op[0] == "a" and op[3] == 1:
            raise RuntimeError("injected fault with bucket 0 in flight")
        return real(self, op, *a)
    with dp:
        monkeypatch.setattr(Replay, "_host", failing)
        t0 = time.monotonic()
        with pytest.raises(ReplicaError, match="replica 1 .* failed in captured step") as ei:
            dp.train_step(*batches[3], mse, SGD)
        assert time.monotonic() - t0 < 10
        assert "injected fault with bucket 0 in flight" in str(ei.value)
        assert not dp._jits  # their replays called the broken groups
        monkeypatch.setattr(Replay, "_host", real)
        for x, y in batches:  # eager again, capture again, replay
            dp.train_step(x, y, mse, SGD)
        assert dp.replicas_identical() and all(j.replays == 2 for j in dp._jits.values())


def test_all_reduce_sync_averages_stores(devs, rng):
    models = [TinyMLP(device=d, seed=i) for i, d in enumerate(devs[:3])]
    x = rng.standard_normal((4, 6)).astype(np.float32)
    stores = [backward(m(wr.tensor(x, device=m.params[0].device)).sum()) for m in models]
    want = [np.mean([s.get(m.params[i]).numpy() for s, m in zip(stores, models)], axis=0)
            for i in range(4)]
    del stores[1]._grads[models[1].params[3].grad_id]  # missing there: counts as zero
    want[3] = (stores[0].get(models[0].params[3]).numpy()
               + stores[2].get(models[2].params[3]).numpy()) / 3
    out = AllReduceSync(devs[:3]).all_reduce(stores, [m.parameters() for m in models])
    for st, m, d in zip(out, models, devs):
        for i, p in enumerate(m.parameters()):
            g = st.get(p)
            assert g.device is d
            np.testing.assert_allclose(g.numpy(), want[i], rtol=1e-5, atol=1e-6)
    # every device holds the same bits
    assert all(np.array_equal(out[0].get(models[0].params[i]).numpy(),
                              out[2].get(models[2].params[i]).numpy()) for i in range(4))


@pytest.mark.timeout(60)
def test_with_wr_nn_modules_and_wr_optim(devs):
    nn = pytest.importorskip("wgrumus.nn")
    optim = pytest.importorskip("wgrumus.optim")

    def make():
        return nn.Sequential(nn.Linear(6, 8, device=devs[0]), nn.ReLU(),
                             nn.Linear(8, 3, device=devs[0]))
    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    ref_opt = optim.AdamW(ref.parameters(), lr=0.01)
    batches = data(3, 6)
    with DataParallel(model, devs[:2], first_bucket_mb=1e-4) as dp:
        assert dp.replicas_identical() and len(dp.plan) == 2
        assert isinstance(dp.replicas[1].parameters()[0], nn.Parameter)
        assert [n for n, _ in dp.replicas[1].named_parameters()] == \
            [n for n, _ in model.named_parameters()]
        assert [b.names for b in dp.plan] == [("2.bias",), ("2.weight", "0.bias", "0.weight")]
        def factory(ps):
            return optim.AdamW(ps, lr=0.01)
        for x, y in batches:
            loss = dp.train_step(x, y, mse, factory)
            ref_loss = mse(ref(wr.tensor(x, device=devs[0])), wr.tensor(y, device=devs[0]))
            ref_opt.step(backward(ref_loss))
            assert loss == pytest.approx(ref_loss.item(), rel=1e-4)
            assert dp.replicas_identical()
        for p, q in zip(model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------------------------- MPI
MPI_WORKER = textwrap.dedent('''
    import os, sys
    sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import numpy as np
    import wgrumus as wr
    from wgrumus import distributed as dist
    from test_data_parallel import TinyMLP, SGD, mse, data, reference
    g = dist.init_process_group("mpi", timeout=30)
    dev = wr.devices()[0]
    model = TinyMLP(device=dev, seed=g.rank)  # different on purpose: the start broadcasts rank 0's
    dp = wr.parallel.DataParallel(model, backend="mpi", group=g, first_bucket_mb=1e-4,
                                  bucket_cap_mb=1e-3)
    assert dp.replicas_identical()
    batches = data(5, 7)
    losses = [dp.train_step(x, y, mse, SGD) for x, y in batches]
    assert dp.replicas_identical()
    ref, ref_losses = reference(dev, batches, "sgd")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=2e-4, atol=2e-5)
    kinds = [e.kind for e in dp.events.events()]
    assert kinds.index("allreduce_start") < kinds.index("backward_end"), kinds
    out = dp(batches[0][0])
    assert out.shape == (7, 3)
    dp.close()
    print("DP_OK", g.rank, flush=True)
    # Fault: rank 1's backward raises; both ranks get a ReplicaError at once, nobody hangs.
    import time
    model.fail = (dev.index, "backward") if g.rank == 1 else None
    dp = wr.parallel.DataParallel(model, backend="mpi", group=g, first_bucket_mb=1e-4)
    t0 = time.monotonic()
    try:
        dp.train_step(*batches[0], mse, SGD)
    except wr.parallel.ReplicaError as e:
        want = "failed in backward" if g.rank == 1 else "rank 1 aborted"
        assert want in str(e) and time.monotonic() - t0 < 10, str(e)
        print("FAULT_OK", g.rank, flush=True)
    dp.close()
''')


@pytest.mark.timeout(120)
def test_mpi_backend_two_processes(tmp_path):
    pytest.importorskip("mpi4py")
    exe = mpiexec()
    if exe is None:
        pytest.skip("mpiexec not found (pip install 'wgrumus[mpi]')")
    script = tmp_path / "dp_worker.py"
    script.write_text(MPI_WORKER)
    p = run_process([exe, "-n", 2, sys.executable, script], 100, WGRUMUS_DEVICES=1)
    assert p.returncode == 0 and p.stdout.count("DP_OK") == 2, p.stdout + p.stderr
    assert p.stdout.count("FAULT_OK") == 2, p.stdout + p.stderr
