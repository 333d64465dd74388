"""3D parallel GPT: every dp x tp x pp layout gives the single-device loss curve; bad layouts
and failing ranks are clear errors."""
import time

import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn
from wgrumus.distributed import CollectiveError
from wgrumus.distributed.parallel3d import (
    GPTConfig,
    Layout3DError,
    dense_gpt_state,
    synthetic_tokens,
    train_3d,
)

CFG = GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=8)
STEPS, BATCH, LR = 10, 4, 1.0


def single_device_losses(dev, cfg=CFG, batch=BATCH, steps=STEPS, lr=LR):
    """Plain nn.GPT on one device, same seed, same global batches, same SGD."""
    model = cfg.build(seed=0, device=dev)
    data = synthetic_tokens(cfg, max(4 * batch, 64), 0)
    out = []
    for s in range(steps):
        rows = data[(np.arange(batch) + s * batch) % len(data)]
        logits = model(wr.tensor(rows[:, :-1], device=dev))
        loss = nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                           wr.tensor(rows[:, 1:].reshape(-1), device=dev))
        model.zero_grad()
        loss.backward()
        out.append(loss.item())
        with wr.no_grad():
            for p in model.parameters():
                p -= p.grad * lr
    return out


@pytest.fixture(scope="module")
def reference(dev):
    return single_device_losses(dev)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", [(2, 2, 1), (1, 2, 2), (2, 1, 2), (2, 2, 2)])
def test_layout_matches_single_device_loss_curve(layout, reference, devs):
    dp, tp, pp = layout
    losses = train_3d(CFG, dp, tp, pp, steps=STEPS, batch_size=BATCH, lr=LR,
                      devices=devs[:dp * tp * pp], timeout=30)
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, reference, rtol=1e-5, atol=1e-5)
    assert reference[-1] < reference[0]  # it does learn


@pytest.mark.timeout(60)
def test_gpipe_schedule_and_more_micro_batches_give_the_same_curve(reference, devs):
    losses = train_3d(CFG, 1, 1, 2, steps=STEPS, batch_size=BATCH, micro_batches=4, lr=LR,
                      devices=devs[:2], schedule="gpipe", timeout=30)
    np.testing.assert_allclose(losses, reference, rtol=1e-5, atol=1e-5)


CFG4 = GPTConfig(vocab_size=8, block_size=4, n_layer=4, n_head=2, n_embd=8)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule, layout", [("interleaved", (1, 2, 2)), ("zb-h1", (1, 2, 2)),
                                              ("interleaved", (2, 2, 2)), ("zb-h1", (2, 2, 2))])
def test_interleaved_and_zero_bubble_schedules_match_single_device(schedule, layout, devs):
    """Model chunks (v = 2 per rank, activations wrapping from the last stage to the first)
    and split backwards (BI / BW) on 3D ranks: the single-device curve."""
    dp, tp, pp = layout
    steps = 4
    ref = single_device_losses(devs[0], CFG4)[:steps]
    losses = train_3d(CFG4, dp, tp, pp, steps=steps, batch_size=BATCH, micro_batches=2, lr=LR,
                      devices=devs[:dp * tp * pp], schedule=schedule, timeout=30)
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-5)


def test_layouts_a_schedule_cannot_fill_are_refused_with_the_fix(devs):
    with pytest.raises(Layout3DError, match=r"2 transformer layers cannot fill pp=2 pipeline "
                                            r"stages x 2 interleaved chunks; use pp <= 1"):
        train_3d(CFG, 1, 1, 2, steps=1, batch_size=BATCH, devices=devs[:2],
                 schedule="interleaved")
    with pytest.raises(Layout3DError, match="must be a multiple of the number of stages"):
        train_3d(CFG4, 1, 1, 2, steps=1, batch_size=6, micro_batches=3, devices=devs[:2],
                 schedule="interleaved")


@pytest.mark.timeout(60)
def test_details_report_groups_and_micro_batches(devs):
    out = train_3d(CFG, 2, 2, 2, steps=1, batch_size=8, micro_batches=4, lr=LR, devices=devs,
                   return_details=True, timeout=30)
    assert out["layout"] == {"dp": 2, "tp": 2, "pp": 2, "schedule": "1f1b", "devices": 8}
    assert out["tokens_per_s"] > 0
    for r in out["ranks"]:
        st = r["stats"]
        assert st["dp"]["by_op"]["all_reduce"]["calls"] >= 1  # gradients: DP group only
        assert "all_reduce" in st["tp"]["by_op"]              # TP collectives inside stages
        assert st["pp"]["by_op"]["send"]["calls"] == 4        # one per micro-batch, each way
        assert "all_reduce" not in st["world"]["by_op"]       # never across the whole world


def test_initial_weights_are_the_dense_gpts(dev):
    a = dense_gpt_state(CFG, seed=3, device=dev)
    b = {k: v.numpy() for k, v in CFG.build(seed=3, device=dev).state_dict().items()}
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kw, match", [
    (dict(dp=2, tp=2, pp=2, devices=4), r"2 \* 2 \* 2 = 8 does not match the world size 4"),
    (dict(dp=1, tp=4, pp=1, devices=4), "2 attention heads cannot be split across tp=4"),
    (dict(dp=1, tp=1, pp=4, devices=4), "2 transformer layers cannot fill pp=4"),
    (dict(dp=3, tp=1, pp=1, devices=3), "batch size 4 is not divisible by dp"),
])
def test_invalid_layouts_fail_before_anything_runs(kw, match, devs):
    started = []
    n = kw.pop("devices")
    t0 = time.monotonic()
    with pytest.raises(Layout3DError, match=match):
        train_3d(CFG, steps=1, batch_size=BATCH, devices=devs[:n],
                 on_step=lambda rank, step: started.append(rank), **kw)
    assert started == [] and time.monotonic() - t0 < 5


@pytest.mark.timeout(60)
def test_fault_in_one_rank_stops_every_rank(devs):
    def fault(rank, step):
        if rank == 5 and step == 1:
            raise RuntimeError("injected fault on rank 5")

    t0 = time.monotonic()
    with pytest.raises((RuntimeError, CollectiveError)) as ei:
        train_3d(CFG, 2, 2, 2, steps=3, batch_size=BATCH, lr=LR, devices=devs, on_step=fault,
                 timeout=20)
    assert time.monotonic() - t0 < 20  # aborted at once, not at the collectives' timeout
    text = str(ei.value) + "".join(getattr(ei.value, "__notes__", []))
    assert "injected fault on rank 5" in text


@pytest.mark.timeout(150)
def test_mpi_backend_runs_the_same_layout_across_processes(devs):
    from _util import mpi_3d_losses
    mpi = mpi_3d_losses(4, "vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=8",
                        "1, 2, 2, steps=3, batch_size=4, lr=1.0")
    threads = train_3d(CFG, 1, 2, 2, steps=3, batch_size=BATCH, lr=LR, devices=devs[:4])
    np.testing.assert_allclose(mpi, threads, rtol=1e-6, atol=1e-6)
