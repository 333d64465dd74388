"""ZeRO-1 (DataParallel(shard_optimizer_state=True)): each replica steps and keeps optimizer
state for its own part of the parameters; the losses and weights are those of plain data
parallelism and of one device, and the optimizer memory per replica is about 1/N."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn, optim
from wgrumus.parallel import DataParallel

STEPS = 3


def make(dev):
    return nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16, device=dev,
                  seed=5)


def lm_loss(logits, y):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def batches(vocab=16, seed=3, steps=STEPS):
    """[8, 9] token rows per step: inputs [:, :-1], targets [:, 1:]."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, (8, 9)).astype(np.int32) for _ in range(steps)]


def one_device(model, dev, batches) -> list:
    """The reference: AdamW on one device over the whole batches; the loss of every step."""
    opt = optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for b in batches:
        loss = lm_loss(model(wr.tensor(b[:, :-1], device=dev)), wr.tensor(b[:, 1:], device=dev))
        opt.step(wr.autograd.backward(loss))
        losses.append(loss.item())
    return losses


def state_bytes(opt) -> int:
    return sum(v.numel() * 4 for st in opt.state.values() for v in st.values()
               if isinstance(v, wr.Tensor))


def run_dp(devs, shard):
    dp = DataParallel(make(devs[0]), devs, shard_optimizer_state=shard, timeout=60)
    opts = [optim.AdamW(r.parameters(), lr=0.01) for r in dp.replicas]
    try:
        losses = [dp.train_step(b[:, :-1], b[:, 1:], lm_loss, opts) for b in batches()]
        assert dp.replicas_identical()
        return losses, dp.module.state_dict(), opts, dp.optimizer_state_dict(opts)
    finally:
        dp.close()


@pytest.mark.timeout(180)
def test_zero1_matches_plain_data_parallel_and_one_device(devs):
    ref = one_device(make(devs[0]), devs[0], batches())
    plain, plain_sd, plain_opts, plain_osd = run_dp(devs[:4], False)
    zero, zero_sd, zero_opts, zero_osd = run_dp(devs[:4], True)
    assert zero == plain  # same averaged gradients, same updates: bit for bit
    assert zero == pytest.approx(ref, rel=1e-5)
    for k, v in plain_sd.items():
        np.testing.assert_array_equal(zero_sd[k].numpy(), v.numpy(), err_msg=k)
    # the gathered optimizer state is the unsharded one
    assert set(zero_osd["state"]) == set(plain_osd["state"])
    for i, st in plain_osd["state"].items():
        for name, v in st.items():
            if isinstance(v, wr.Tensor):
                np.testing.assert_array_equal(zero_osd["state"][i][name].numpy(), v.numpy())
    full = state_bytes(plain_opts[0])
    per = [state_bytes(o) for o in zero_opts]
    assert sum(per) == full
    assert max(per) <= full / 4 * 1.5, (per, full)  # balanced: ~1/N each


def test_ownership_is_balanced_and_covers_every_parameter(devs):
    from wgrumus.parallel.sync import OptimizerSharding
    ps = [wr.zeros(n, device=devs[0]) for n in (100, 7, 50, 50, 3, 90)]
    sh = OptimizerSharding(ps, 3)
    assert sorted(i for own in sh.owned for i in own) == list(range(len(ps)))
    loads = [sum(ps[i].numel() for i in own) for own in sh.owned]
    assert max(loads) - min(loads) <= 10, loads


@pytest.mark.timeout(60)
def test_gather_gives_every_replica_the_owners_values(devs, monkeypatch):
    """Each replica ends with every owner's parameters, building each parameter's view of
    the broadcast buffer once (a non-owner built them twice a step)."""
    from wgrumus.distributed import spawn, zero
    calls = []
    orig = zero.flat_view
    monkeypatch.setattr(zero, "flat_view", lambda *a: calls.append(1) or orig(*a))
    sizes = (100, 7, 50, 3)
    sh = zero.OptimizerSharding([wr.zeros(n, device=devs[0]) for n in sizes], 3)

    def fn(g):  # replica r's parameter i holds 10 r + i before the gather
        ps = [wr.tensor(np.full(n, 10.0 * g.rank + i, np.float32), device=g.device)
              for i, n in enumerate(sizes)]
        sh.gather_group(g, ps)
        return [p.numpy() for p in ps]
    got = spawn(fn, 3, devices=devs[:3], timeout=30)
    for ps in got:
        for i, p in enumerate(ps):
            np.testing.assert_array_equal(p, np.full(sizes[i], 10.0 * sh.owner[i] + i))
    assert len(calls) == 3 * len(sizes)


MPI_WORKER = '''
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import numpy as np
import wgrumus as wr
from wgrumus import distributed as dist, optim
from test_zero1 import make, lm_loss, batches, one_device
g = dist.init_process_group("mpi", timeout=60)
dev = wr.devices()[0]
dp = wr.parallel.DataParallel(make(dev), backend="mpi", group=g, shard_optimizer_state=True)
opt = optim.AdamW(dp.module.parameters(), lr=0.01)
losses = [dp.train_step(b[:, :-1], b[:, 1:], lm_loss, opt) for b in batches()]
assert dp.replicas_identical()
ref = make(dev)
np.testing.assert_allclose(losses, one_device(ref, dev, batches()), rtol=1e-5)
owned = sum(1 for o in dp.sharding.owner if o == g.rank)
assert len(opt.state) == owned < len(list(ref.parameters())), (len(opt.state), owned)
dp.close()
print("ZERO_OK", g.rank, flush=True)
'''


@pytest.mark.timeout(180)
def test_zero1_mpi_two_processes(tmp_path):
    import sys

    from _util import mpiexec, run_process
    pytest.importorskip("mpi4py")
    exe = mpiexec()
    if exe is None:
        pytest.skip("mpiexec not found (pip install 'wgrumus[mpi]')")
    script = tmp_path / "zero_worker.py"
    script.write_text(MPI_WORKER)
    p = run_process([exe, "-n", 2, sys.executable, script], 170, WGRUMUS_DEVICES=1)
    assert p.returncode == 0 and p.stdout.count("ZERO_OK") == 2, p.stdout + p.stderr
