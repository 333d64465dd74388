"""Global gradient clipping and learning-rate schedules in every layout: one norm over every
shard, stage and device (replicated TP gradients counted once), the same losses as one device."""
import sys

import numpy as np
import pytest

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus import optim

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_cli import GPT_TINY, train_json, wgrumus


def test_clip_over_gradients_on_several_devices(devs, rng):
    """Stages of a pipeline hold their gradients on their own devices: one norm over all."""
    arrs = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (5,), (2, 2))]
    ps = [wr.tensor(np.zeros_like(a), device=devs[k], requires_grad=True)
          for k, a in enumerate(arrs)]
    for p, a in zip(ps, arrs):
        p.grad = wr.tensor(a, device=p.device)
    want = np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrs))
    got = optim.clip_grad_norm_(ps, 0.5)
    assert got.item() == pytest.approx(want, rel=1e-5)
    for p, a in zip(ps, arrs):
        assert p.grad.device is p.device
        np.testing.assert_allclose(p.grad.numpy(), a * 0.5 / (want + 1e-6), rtol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_over_ranks_counts_a_replicated_gradient_once(devs, rng, norm_type):
    """Rank r holds shard r of one gradient and a copy of a replicated one (a TP LayerNorm):
    the norm is that of the dense model, whatever rank the replicated copy is counted on."""
    shards = [rng.standard_normal((2, 3)).astype(np.float32) * (r + 1) for r in range(3)]
    shared = rng.standard_normal(4).astype(np.float32)
    dense = np.concatenate([s.ravel() for s in shards] + [shared]).astype(np.float64)
    want = np.abs(dense).max() if norm_type == float("inf") else np.sqrt((dense ** 2).sum())

    def fn(group):
        a = wr.tensor(np.zeros((2, 3), np.float32), device=group.device, requires_grad=True)
        b = wr.tensor(np.zeros(4, np.float32), device=group.device, requires_grad=True)
        a.grad = wr.tensor(shards[group.rank], device=group.device)
        b.grad = wr.tensor(shared, device=group.device)
        n = optim.clip_grad_norm_([a, b], 1.0, norm_type, group=group,
                                  counted_elsewhere=[b] if group.rank != 1 else [])
        return n.item(), a.grad.numpy(), b.grad.numpy()

    out = dist.spawn(fn, 3, devices=devs[:3], timeout=30)
    coef = min(1.0 / (want + 1e-6), 1.0)
    for r, (n, ga, gb) in enumerate(out):
        assert n == pytest.approx(want, rel=1e-5)
        np.testing.assert_allclose(ga, shards[r] * coef, rtol=1e-5)
        np.testing.assert_allclose(gb, shared * coef, rtol=1e-5)


@pytest.mark.timeout(60)
def test_clip_fsdp_shards_equals_clipping_the_dense_gradient(devs, rng):
    """FSDP: each rank clips its shards with the group norm; the updated dense weights equal
    one device clipping the whole gradient (SGD, where the clip factor shows directly)."""
    from wgrumus import nn
    from wgrumus.distributed import FSDP
    X = rng.standard_normal((8, 6)).astype(np.float32)
    Y = rng.standard_normal((8, 3)).astype(np.float32)

    def model(dev):
        return nn.Sequential(nn.Linear(6, 10, device=dev, seed=1), nn.Tanh(),
                             nn.Linear(10, 3, device=dev, seed=2))

    def steps(m, params, x, y, clip_kw):
        opt = optim.SGD(params, lr=0.5)
        norms = []
        for _ in range(3):
            loss = nn.functional.mse_loss(m(x), y)
            for p in params:
                p.grad = None
            loss.backward()
            norms.append(optim.clip_grad_norm_(params, 0.05, **clip_kw).item())
            opt.step()
        return norms

    ref = model(devs[0])
    ref_norms = steps(ref, ref.parameters(), wr.tensor(X, device=devs[0]),
                      wr.tensor(Y, device=devs[0]), {})

    def fn(group):
        f = FSDP(model(group.device), group)
        n = len(X) // group.world_size
        rows = slice(group.rank * n, (group.rank + 1) * n)
        norms = steps(f, f.parameters(), wr.tensor(X[rows], device=group.device),
                      wr.tensor(Y[rows], device=group.device), {"group": group})
        return norms, f.full_state_dict()

    out = dist.spawn(fn, 4, devices=devs[:4], timeout=60)
    for norms, sd in out:
        assert norms == pytest.approx(ref_norms, rel=1e-4)
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(sd[k], v.numpy(), rtol=1e-4, atol=1e-6, err_msg=k)


def test_schedules_warm_up_then_decay():
    from wgrumus.cli.optimizing import TrainOptimizer
    p = wr.tensor(np.zeros(2, np.float32), requires_grad=True)
    opt = TrainOptimizer(optim.SGD([p], lr=1.0), "cosine", warmup=2, total_steps=6)
    lrs = []
    for _ in range(6):
        p.grad = wr.tensor(np.ones(2, np.float32))
        opt.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 0.8535534, 0.5, 0.1464466], abs=1e-6)
    # the step count travels with the optimizer state: a reloaded one continues the schedule
    again = TrainOptimizer(optim.SGD([p], lr=1.0), "cosine", warmup=2, total_steps=6)
    again.load_state_dict(opt.state_dict())
    assert again.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-7)  # step 6: the end
    const = TrainOptimizer(optim.SGD([p], lr=1.0), "constant", warmup=4, total_steps=6)
    assert const.param_groups[0]["lr"] == 0.0


CLIP = ["--optimizer", "sgd", "--lr", "0.5", "--clip", "0.05", "--lr-schedule", "cosine",
        "--warmup", "1"]


@pytest.mark.timeout(300)
def test_gpt_clip_and_schedule_agree_across_3d_layouts():
    """SGD with a clip far below the gradient norm: every step's update is the clip factor
    times the gradient, so a norm that misses a shard or counts a TP copy twice shows."""
    args = [*GPT_TINY, "--steps", "3", *CLIP]
    ref = train_json("gpt", *args)["losses"]
    plain = train_json("gpt", *GPT_TINY, "--steps", "3", "--optimizer", "sgd", "--lr", "0.5",
                       "--lr-schedule", "cosine", "--warmup", "1")["losses"]
    assert abs(ref[-1] - plain[-1]) > 1e-3  # the clip is active
    for layout in (["--tp", "2", "--devices", "2"], ["--pp", "2", "--devices", "2"],
                   ["--dp", "2", "--tp", "2", "--pp", "2", "--devices", "8"]):
        res = train_json("gpt", *args, *layout)
        assert res["losses"] == pytest.approx(ref, rel=1e-4), layout


@pytest.mark.timeout(300)
def test_mlp_clip_and_schedule_agree_across_layouts():
    ref = train_json("mlp", "--steps", "4", *CLIP)["losses"]
    for layout in (["--dp", "2", "--devices", "2"],
                   ["--pp", "2", "--devices", "2", "--schedule", "gpipe"],
                   ["--dp", "2", "--pp", "2", "--devices", "4", "--micro-batches", "2"]):
        res = train_json("mlp", "--steps", "4", *CLIP, *layout)
        assert res["losses"] == pytest.approx(ref, rel=1e-4), layout


@pytest.mark.timeout(240)
def test_gpt_activation_checkpointing_gives_the_same_losses():
    ref = train_json("gpt", *GPT_TINY, "--steps", "2")["losses"]
    for layout in ([], ["--tp", "2", "--pp", "2", "--devices", "4"]):
        res = train_json("gpt", *GPT_TINY, "--steps", "2", "--activation-checkpointing",
                         *layout)
        assert res["losses"] == pytest.approx(ref, rel=1e-4), layout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,reason", [
    (["mlp", "--activation-checkpointing"], "no blocks to checkpoint"),
    (["gpt", "--warmup", "-1"], "--warmup -1"),
    (["gpt", "--clip", "0"], "--clip"),
    (["gpt", "--lr-schedule", "linear"], "--lr-schedule")])
def test_bad_flags_are_one_line_usage_errors(args, reason):
    rc, out, err = wgrumus("train", *args, "--steps", "1")
    assert rc == 2 and reason in err, (rc, out, err)
