"""FSDP: sharded parameters train exactly like data parallel; full parameters live only while
a forward or backward needs them; buffers stay whole."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus import nn
from wgrumus.distributed import FSDP

WORLD, STEPS, LR = 4, 3, 0.05


def make_model(dev):
    # non-square Linears whose rows (10, 3) do not divide by 4 ranks: uneven, padded shards
    return nn.Sequential(nn.Linear(6, 10, device=dev, seed=1), nn.ReLU(),
                         nn.Linear(10, 3, device=dev, seed=2))


def data(rng):
    return (rng.standard_normal((8, 6)).astype(np.float32),
            rng.standard_normal((8, 3)).astype(np.float32))


def reference_data_parallel(dev, X, Y, opt_cls):
    """Data parallel on one device: the mean of the replicas' gradients is the gradient of the
    global-batch mean loss (equal per-rank batches)."""
    m = make_model(dev)
    opt = opt_cls(m.parameters(), lr=LR)
    for _ in range(STEPS):
        loss = nn.functional.mse_loss(m(wr.tensor(X, device=dev)), wr.tensor(Y, device=dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.numpy() for k, v in m.state_dict().items()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_fsdp_params_after_steps_equal_data_parallel(opt_name, devs, rng):
    X, Y = data(rng)
    opt_cls = getattr(wr.optim, opt_name)
    per = len(X) // WORLD

    def fn(g):
        dev = g.device
        f = FSDP(make_model(dev), g)
        opt = opt_cls(f.parameters(), lr=LR)  # the optimizer only ever sees the shards
        sl = slice(g.rank * per, (g.rank + 1) * per)
        shapes = [tuple(p.shape) for p in f.parameters()]
        for _ in range(STEPS):
            out = f(wr.tensor(X[sl], device=dev))
            loss = nn.functional.mse_loss(out, wr.tensor(Y[sl], device=dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return f.full_state_dict(), shapes

    res = dist.spawn(fn, WORLD, devices=devs[:WORLD], timeout=30)
    ref = reference_data_parallel(devs[0], X, Y, opt_cls)
    for full, shapes in res:
        assert shapes == [(3, 6), (3,), (1, 10), (1,)]  # ceil(10/4), ceil(3/4) rows each
        assert full.keys() == ref.keys()
        for k in ref:
            np.testing.assert_allclose(full[k], ref[k], rtol=1e-5, atol=1e-6)
    init = {k: v.numpy() for k, v in make_model(devs[0]).state_dict().items()}
    assert not np.allclose(ref["0.weight"], init["0.weight"])  # it did train


@pytest.mark.timeout(60)
def test_full_params_exist_only_during_forward_and_backward(devs, rng):
    X, Y = data(rng)

    def fn(g):
        dev = g.device
        model = make_model(dev)
        full_params = model.parameters()
        f = FSDP(model, g)
        freed_at_init = all(p._storage.buffer is None for p in full_params)
        out = f(wr.tensor(X[:2], device=dev))
        freed_after_forward = all(p._storage.buffer is None for p in full_params)
        loss = nn.functional.mse_loss(out, wr.tensor(Y[:2], device=dev))
        loss.backward()
        freed_after_backward = all(p._storage.buffer is None for p in full_params)
        grads_on_shards = [tuple(s.grad.shape) for s in f.parameters()]
        no_full_grads = all(p.grad is None for p in full_params)
        st = f.group.stats()["by_op"]
        return (freed_at_init, freed_after_forward, freed_after_backward, grads_on_shards,
                no_full_grads, st["all_gather"]["calls"], st["reduce_scatter"]["calls"])

    for r in dist.spawn(fn, WORLD, devices=devs[:WORLD], timeout=30):
        assert r[:3] == (True, True, True)
        assert r[3] == [(3, 6), (3,), (1, 10), (1,)] and r[4]
        assert r[5] == 8 and r[6] == 4  # gathered for forward and again for backward


class BNNet(nn.Module):
    def __init__(self, dev):
        super().__init__()
        self.fc = nn.Linear(6, 5, device=dev, seed=1)
        self.bn = nn.BatchNorm2d(5, device=dev)

    def forward(self, x):
        h = self.fc(x)
        return self.bn(h.reshape(h.shape[0], 5, 1, 1)).reshape(h.shape[0], 5)


@pytest.mark.timeout(60)
def test_buffers_stay_whole_and_params_shard(devs, rng):
    X, _ = data(rng)

    def fn(g):
        f = FSDP(BNNet(g.device), g)
        names = [n for n, _ in f.named_parameters()]
        out = f(wr.tensor(X[2 * g.rank:2 * g.rank + 2], device=g.device))
        (out * out).mean().backward()
        sd = f.full_state_dict()
        return names, {k: v.shape for k, v in sd.items()}, sd["bn.running_mean"]

    res = dist.spawn(fn, 2, devices=devs[:2], timeout=30)
    for names, shapes, _ in res:
        assert names == ["fc.weight", "fc.bias", "bn.weight", "bn.bias"]  # buffers not sharded
        assert shapes["bn.running_mean"] == (5,) and shapes["bn.running_var"] == (5,)
        assert shapes["fc.weight"] == (5, 6) and shapes["bn.weight"] == (5,)
    # each replica's statistics come from its own batch, like PyTorch's FSDP without SyncBN
    assert not np.allclose(res[0][2], res[1][2])


@pytest.mark.timeout(30)
def test_fsdp_needs_a_device(devs):
    def fn(g):
        with pytest.raises(ValueError, match="FSDP needs a device"):
            FSDP(make_model(devs[0]), g)
        return True
    assert dist.spawn(fn, 2, timeout=10) == [True, True]
