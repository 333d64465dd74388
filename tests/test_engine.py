"""The training engine (distributed/engine.py) and the data-parallel modes it adds on logical
devices: float16 gradient communication (close to exact, half the bytes), gradient accumulation
(the losses of the whole batch), post-local SGD (replicas bit-equal after each sync, apart between
syncs, equal to exact data parallel when H = 1), every CLI flag in every layout, bad combinations
refused, a failing rank reported by name, and a DataParallel dropped without close()."""
import gc
import json
import threading
import time

import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn
from wgrumus.distributed import ProcessGroup, ThreadWorld
from wgrumus.distributed.averaging import GradientAverager
from wgrumus.distributed.engine import RankError, RankPool, SyncOptions
from wgrumus.nn import functional as F
from wgrumus.parallel import DataParallel

TINY_GPT = ["--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--block-size", "8"]


def train(capsys, *args) -> dict:
    from wgrumus.cli import main
    rc = main(["train", *args, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


# ----------------------------------------------------------------- f16 gradient communication
@pytest.mark.timeout(300)
def test_f16_gradient_communication_is_close_to_exact_and_halves_the_bytes(devs):
    """Each gradient is divided by the world size and rounded to float16 once (error <= 2^-11 of
    its size), and the halves' sum is rounded once more (<= 2^-11 of the sum, itself <= the sum
    of the sizes): so each element is within 2^-10 * mean(|g_r|) of the exact average, plus
    float16's resolution near zero (half a subnormal step, 2^-25, per rounding)."""
    rng = np.random.default_rng(0)
    world = 2
    grads = [[rng.standard_normal(s).astype(np.float32) * 10 ** rng.uniform(-3, 1)
              for s in [(33, 17), (17,), (5, 5, 3)]] for _ in range(world)]
    exact = [np.mean([g[i] for g in grads], axis=0) for i in range(3)]

    def run(comm_dtype):
        tw = ThreadWorld(world, 60.0, name="f16-test")
        out = [None] * world

        def rank(r):
            g = ProcessGroup(tw.transport(r), device=devs[r])
            params = [wr.tensor(np.zeros_like(a), device=devs[r], requires_grad=True)
                      for a in grads[r]]
            avg = GradientAverager(params, g, comm_dtype=comm_dtype)
            res = avg.average([wr.tensor(a, device=devs[r]) for a in grads[r]], timeout=60)
            out[r] = ([v.numpy() for v in res], g.stats()["bytes"])

        ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        tw.close(0)
        return out

    f32, f16 = run(None), run(wr.float16)
    bounds = [2.0 ** -10 * np.mean([np.abs(g[i]) for g in grads], axis=0) + 2.0 ** -24
              for i in range(3)]
    for r in range(world):
        for a, b, e, bound in zip(f32[r][0], f16[r][0], exact, bounds):
            np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)
            assert b.dtype == np.float32
            assert np.all(np.abs(b - e) <= bound), np.max(np.abs(b - e) / bound)
        assert any(not np.array_equal(a, b) for a, b in zip(f32[r][0], f16[r][0]))
        assert f16[r][1] * 2 == f32[r][1]  # bytes on the wire halved
    np.testing.assert_array_equal(f16[0][0][0], f16[1][0][0])  # every rank the same result


@pytest.mark.timeout(300)
def test_data_parallel_comm_dtype_f16_trains_like_f32(devs):
    x = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 3, 16).astype(np.int32)
    losses = {}
    for dt in (None, wr.float16):
        wr.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        with DataParallel(model, devs[:2], comm_dtype=dt) as dp:
            opt = lambda ps: wr.optim.SGD(ps, lr=0.5)  # noqa: E731
            losses[dt] = [dp.train_step(x, y, F.cross_entropy, opt) for _ in range(4)]
            assert dp.replicas_identical()
    np.testing.assert_allclose(losses[wr.float16], losses[None], rtol=1e-3)
    with pytest.raises(ValueError, match="float32 .* or float16"):
        DataParallel(nn.Linear(2, 2), devs[:2], comm_dtype=np.float64)


# ------------------------------------------------------------------------ CLI: equal losses
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,layout", [
    ("mlp", []), ("mlp", ["--dp", "2"]), ("mlp", ["--dp", "2", "--pp", "2"]),
    ("gpt", ["--dp", "2"] + TINY_GPT), ("gpt", ["--tp", "2"] + TINY_GPT)])
def test_grad_accum_gives_the_losses_of_the_whole_batch(model, layout, capsys):
    common = [model, "--steps", "4", "--batch-size", "32", "--no-jit"] + layout
    ref = train(capsys, *common)["losses"]
    acc = train(capsys, *common, "--grad-accum", "4")["losses"]
    np.testing.assert_allclose(acc, ref, rtol=1e-5)
    assert ref[0] != ref[-1]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", [["--dp", "2"], ["--dp", "2", "--pp", "2"]])
def test_cli_grad_comm_f16_is_close_to_exact(layout, capsys):
    common = ["mlp", "--steps", "5", "--no-jit"] + layout
    ref = train(capsys, *common)["losses"]
    half = train(capsys, *common, "--grad-comm", "f16")["losses"]
    np.testing.assert_allclose(half, ref, rtol=1e-3)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,layout", [
    ("mlp", ["--dp", "2"]), ("mlp", ["--pp", "2"]), ("mlp", ["--dp", "2", "--pp", "2"]),
    ("cnn", ["--dp", "2"]), ("gpt", ["--dp", "2", "--pp", "2"] + TINY_GPT),
    ("gpt", ["--dp", "2", "--tp", "2"] + TINY_GPT)])
def test_every_layout_gives_one_devices_losses(model, layout, capsys):
    extra = TINY_GPT if model == "gpt" else []
    ref = train(capsys, model, "--steps", "4", "--batch-size", "16", *extra)["losses"]
    got = train(capsys, model, "--steps", "4", "--batch-size", "16", *layout)["losses"]
    np.testing.assert_allclose(got, ref, rtol=2e-5)


# ------------------------------------------------------------------------------ local SGD
def _cli_trainer(*argv):
    """The trainer `wgrumus train` builds for ``argv`` (and its task)."""
    import argparse

    from wgrumus.cli import config, models, train, trainers
    p = argparse.ArgumentParser()
    p.add_argument("model")
    train.add_arguments(p)
    cfg = config.config_from_args(p.parse_args(list(argv)))
    task = models.build(cfg)
    task.total_steps = 8
    return cfg, task, trainers.make_trainer(cfg, task)


def _replica_params(tr, k):
    return [p.numpy() for p in tr.ranks[k].part.params]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("jit", ["--no-jit", "--jit"])
def test_local_sgd_replicas_equal_after_each_sync_and_apart_between(jit):
    cfg, task, tr = _cli_trainer("mlp", "--dp", "2", "--sync-every", "3",
                                 "--local-sgd-warmup", "2", "--optimizer", "sgd", jit)
    try:
        for step in range(8):
            x, y = task.batch(step, cfg.batch_size)
            assert np.isfinite(tr.step(step, x, y)())
            a, b = _replica_params(tr, 0), _replica_params(tr, 1)
            same = all(np.array_equal(u, v) for u, v in zip(a, b))
            # steps 0-1 exact; local steps 2, 3, 4 then an average; 5, 6, 7 then an average
            assert same == (step in (0, 1, 4, 7)), step
    finally:
        tr.close()


@pytest.mark.timeout(300)
def test_local_sgd_every_step_equals_exact_data_parallel():
    """Averaging the parameters after every local SGD step is exact data parallel for a linear
    optimizer (SGD with momentum: the replicas' momenta average like their gradients)."""
    runs = {}
    for extra in ([], ["--sync-every", "1"]):
        cfg, task, tr = _cli_trainer("mlp", "--dp", "2", "--optimizer", "sgd", "--no-jit", *extra)
        try:
            losses = []
            for step in range(5):
                x, y = task.batch(step, cfg.batch_size)
                losses.append(tr.step(step, x, y)())
            runs[bool(extra)] = (losses, _replica_params(tr, 0))
        finally:
            tr.close()
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_sync_options_schedule():
    s = SyncOptions(sync_every=4, local_sgd_warmup=3)
    assert [s.local_at(t) for t in range(5)] == [False, False, False, True, True]
    assert [t for t in range(12) if s.average_after(t)] == [6, 10]
    with pytest.raises(ValueError, match="grad_accum"):
        SyncOptions(grad_accum=0)


# ------------------------------------------------------------ every flag in every layout
LAYOUTS = {"one": ["mlp"], "dp": ["mlp", "--dp", "2"],
           "pp": ["mlp", "--pp", "2", "--micro-batches", "2"],
           "dp-pp": ["mlp", "--dp", "2", "--pp", "2", "--micro-batches", "2"],
           "gpt-tp-pp": ["gpt", "--tp", "2", "--pp", "2", "--micro-batches", "2", *TINY_GPT]}
FLAGS = {"jit": ["--jit"], "f16": ["--precision", "f16"], "clip": ["--clip", "0.5"],
         "accum": ["--grad-accum", "2"], "comm-f16": ["--grad-comm", "f16"],
         "local-sgd": ["--sync-every", "2", "--local-sgd-warmup", "1"],
         "cosine": ["--lr-schedule", "cosine", "--warmup", "1"],
         "gpipe": ["--schedule", "gpipe"], "checkpoint": ["--checkpoint", "{tmp}"]}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_flag_works_in_every_layout(layout, capsys, tmp_path):
    for name, flag in FLAGS.items():
        flag = [f.replace("{tmp}", str(tmp_path / name)) for f in flag]
        jit = [] if name == "jit" else ["--no-jit"]
        res = train(capsys, *LAYOUTS[layout], "--steps", "3", "--batch-size", "8", *jit, *flag)
        assert res["layout"]["micro_batches"] in (1, 2)
        assert len(res["losses"]) == 3 and all(np.isfinite(res["losses"])), name
        assert res["steady"]["step_ms"] > 0 and res["steady"]["steps"] >= 1


@pytest.mark.parametrize("argv,says", [
    (["mlp", "--local-sgd-warmup", "2"], "--sync-every"),
    (["mlp", "--dp", "2", "--batch-size", "12", "--grad-accum", "4"], "--grad-accum 4"),
    (["mlp", "--sync-every", "0"], "--sync-every"),
    (["mlp", "--grad-comm", "bf16"], "--grad-comm"),
    (["mlp", "--sync-every", "2", "--local-sgd-warmup", "-1"], "--local-sgd-warmup")])
def test_bad_combinations_are_one_line_exit_2(argv, says, capsys):
    from wgrumus.cli import main
    try:
        rc = main(["train", *argv, "--steps", "1"])
    except SystemExit as e:  # argparse's own checks
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


# ------------------------------------------------------------------- failures and leaks
@pytest.mark.timeout(120)
def test_a_failing_rank_is_named_and_no_rank_hangs(devs):
    pool = RankPool(3, devs[:3], timeout=20.0)

    def fn(k):
        if k == 1:
            raise RuntimeError("injected")
        return pool.groups[k].all_reduce(np.ones(4), "sum")  # waits for rank 1 forever

    t0 = time.monotonic()
    try:
        with pytest.raises(RankError, match="rank 1 .*injected") as e:
            pool.run(fn)
        assert e.value.rank == 1
        assert time.monotonic() - t0 < 15  # the others were woken, not timed out
    finally:
        pool.close(5)


def _threads_settle(target: int, limit: float = 10.0) -> int:
    deadline = time.monotonic() + limit
    while threading.active_count() > target and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return threading.active_count()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("jit", [False, True])
def test_data_parallel_dropped_without_close_leaks_nothing(devs, jit):
    """20 DataParallels dropped after train_steps: their replica and comm threads end and the
    replicas' device memory goes back (it leaked: the idle worker kept its last job, whose
    closure held the DataParallel)."""
    x = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 3, 8).astype(np.int32)

    def one():
        model = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 3))
        dp = DataParallel(model, devs[:4], jit=jit)
        opt = lambda ps: wr.optim.SGD(ps, lr=0.1)  # noqa: E731
        for _ in range(3):
            dp.train_step(x, y, F.cross_entropy, opt)

    one()  # compiles kernels and fills caches first
    base = _threads_settle(0, 2.0)
    live = [d.pool.live_bytes for d in devs[1:4]]
    for _ in range(20):
        one()
    assert _threads_settle(base) <= base
    assert [d.pool.live_bytes for d in devs[1:4]] == live


class _LinearPart:
    """A one-parameter model part: loss = sum(w * x)."""
    overlaps = False

    def __init__(self, device):
        self.params = [wr.tensor(np.ones(3, np.float32), device=device, requires_grad=True)]
        self.names = ["w"]

    def gradients(self, mb, seed, on_leaf_grad):
        from wgrumus.autograd import backward_with_grad
        from wgrumus.cli.trainer_parts import _seed_for
        (x,) = mb
        loss = (self.params[0] * x).sum()
        return loss.detach(), backward_with_grad(loss, _seed_for(loss, seed))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("jit", [False, True])
def test_f16_ranks_of_one_replica_skip_an_overflowing_step_together(devs, jit):
    """Stage 1's gradient overflows, stage 0's does not: both skip the step and both scales
    back off (a stage stepping alone would leave the model half updated)."""
    from wgrumus.distributed.engine import RankEngine
    pool = RankPool(2, devs[:2], timeout=30.0)

    def build(k):
        part = _LinearPart(devs[k])
        opt = wr.optim.SGD(part.params, lr=0.5)
        return RankEngine(part, opt, devs[k], model_group=pool.groups[k], precision="f16",
                          jit=jit)

    try:
        engines = pool.run(build)
        for step, bad in enumerate([False, False, False, True]):
            def run(k, bad=bad):
                x = np.full(3, 3e38 if (bad and k == 1) else 1.0, np.float32)  # x 2^16: inf
                engines[k].step([[wr.tensor(x, device=devs[k])]])
                return engines[k].part.params[0].numpy(), engines[k].scaler.get_scale()
            before = pool.run(lambda k: engines[k].part.params[0].numpy())
            after = pool.run(run)
            for k in range(2):
                if bad:
                    np.testing.assert_array_equal(after[k][0], before[k])
                    assert after[k][1] == 2.0 ** 15, step
                else:
                    np.testing.assert_allclose(after[k][0], before[k] - 0.5, rtol=1e-6)
                    assert after[k][1] == 2.0 ** 16, step
    finally:
        pool.run(lambda k: engines[k].close())
        pool.close(5)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,layout", [("mlp", ["--dp", "2"]),
                                          ("gpt", ["--dp", "2", "--pp", "2", *TINY_GPT])])
def test_captured_steps_give_the_eager_losses_with_every_sync_flag(model, layout, capsys):
    """--jit replays the accumulation loop, the float16 casts and the local phase's two
    captures (exact warmup step, local step) with the eager run's losses."""
    common = [model, *layout, "--steps", "6", "--batch-size", "16", "--grad-accum", "2",
              "--grad-comm", "f16", "--sync-every", "2", "--local-sgd-warmup", "2"]
    eager = train(capsys, *common, "--no-jit")["losses"]
    jit = train(capsys, *common, "--jit")["losses"]
    np.testing.assert_allclose(jit, eager, rtol=1e-6)
