"""`wgrumus train --jit` in every parallel layout the CLI accepts: the same losses as eager,
steps really replayed, the data-parallel buckets launched without waiting inside a replay, and a
rank failing inside a replayed step (a bucket in flight too) stops every rank at once."""
import json
import time

import numpy as np
import pytest

from wgrumus.cli import main
from wgrumus.runtime.replay import Replay

GPT = ["gpt", "--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
       "--batch-size", "8"]
STEPS = 4  # warm-up, capture, two replays
LAYOUTS = [  # (arguments, ranks or stage threads that replay)
    (GPT + ["--dp", "2", "--clip", "0.5"], 2),
    (GPT + ["--tp", "2", "--clip", "0.5", "--lr-schedule", "cosine", "--warmup", "2"], 2),
    (GPT + ["--pp", "2", "--schedule", "gpipe", "--activation-checkpointing"], 2),
    (GPT + ["--pp", "2", "--schedule", "1f1b", "--clip", "0.5"], 2),
    (GPT + ["--pp", "2", "--schedule", "interleaved", "--n-layer", "4"], 2),
    (GPT + ["--pp", "2", "--schedule", "zb-h1", "--optimizer", "sgd"], 2),
    (GPT + ["--dp", "2", "--tp", "2", "--pp", "2", "--clip", "0.5"], 8),
    (["mlp", "--pp", "2", "--clip", "0.5", "--batch-size", "16"], 2),
    (["cnn", "--dp", "2", "--pp", "2", "--schedule", "interleaved", "--batch-size", "16"], 4),
]


def _losses(capsys, args, jit):
    assert main(["train", *args, "--steps", str(STEPS), "--json",
                 "--jit" if jit else "--no-jit"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["losses"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("args,replaying", LAYOUTS, ids=[
    " ".join(a[:1] + a[len(GPT):]) if a[0] == "gpt" else " ".join(a) for a, _ in LAYOUTS])
def test_jit_gives_the_eager_losses_in_every_layout(capsys, monkeypatch, devs, args,
                                                    replaying):
    eager = _losses(capsys, args, False)
    pinned = [d.pool.stats()["pinned"] for d in devs]
    runs = []
    real = Replay.run

    def counted(self, *a, **k):
        runs.append(self.device.index)
        return real(self, *a, **k)
    monkeypatch.setattr(Replay, "run", counted)
    jitted = _losses(capsys, args, True)
    assert len(runs) == replaying * (STEPS - 2) and len(set(runs)) == replaying
    assert [d.pool.stats()["pinned"] for d in devs] == pinned  # closing freed the captures
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [GPT + ["--dp", "2", "--tp", "2", "--pp", "2"],
                                  ["mlp", "--dp", "2", "--pp", "2", "--batch-size", "16"]],
                         ids=["gpt 2x2x2", "mlp dp2 pp2"])
def test_a_rank_failing_in_a_replayed_step_stops_them_all(capsys, monkeypatch, args):
    """Device 1's rank (stage) raises between two replayed segments of its third step; the
    ranks waiting on it raise too, at once rather than at the 120 s collective timeout."""
    real = Replay._host

    def failing(self, *a):
        if self.device.index == 1:
            raise RuntimeError("injected fault in a replayed step")
        return real(self, *a)
    monkeypatch.setattr(Replay, "_host", failing)
    _stops_with(capsys, args, "injected fault in a replayed step")


def _stops_with(capsys, args, fault: str) -> None:
    """The --jit run fails within 60 s (not at the 120 s collective timeout) naming ``fault``."""
    t0 = time.monotonic()
    try:  # a WgrumusError is one line on stderr and exit 1; others propagate
        assert main(["train", *args, "--steps", str(STEPS), "--json", "--jit"]) == 1
        text = capsys.readouterr().err
    except Exception as e:  # noqa: BLE001 - the rank's error, as the trainer raises it
        text, err = "", e
        while err is not None:
            text, err = text + str(err), err.__cause__
    assert time.monotonic() - t0 < 60
    assert fault in text


def _small_buckets(monkeypatch) -> None:
    """The 3D ranks' data-parallel averager in buckets of ~1 KB: several per tiny GPT rank."""
    from wgrumus.distributed import averaging
    real = averaging.plan_buckets
    monkeypatch.setattr(averaging, "plan_buckets",
                        lambda params, cap, first, names=None: real(params, 2e-3, 1e-3, names))


@pytest.mark.timeout(180)
def test_replayed_3d_steps_launch_every_dp_bucket_before_waiting(capsys, monkeypatch):
    """gpt --dp 2 --tp 2 in several buckets: each rank's replay launches bucket b's all-reduce,
    submits the next bucket's packing behind it and waits for the buckets only after the last
    launch (before clipping and the optimizer step). Before them, the tensor-parallel
    all-reduces: the forward's as blocking host operations, the backward's input gradients
    launched, the weight gradient's work submitted, then joined. Losses equal eager."""
    args = GPT + ["--dp", "2", "--tp", "2", "--clip", "0.5"]
    _small_buckets(monkeypatch)
    eager = _losses(capsys, args, False)
    traces, real = [], Replay.run

    def traced(self, *a, **k):
        real(self, *a, **k)
        traces.append(list(self.trace))
    monkeypatch.setattr(Replay, "run", traced)
    jitted = _losses(capsys, args, True)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=0)
    assert len(traces) == 4 * (STEPS - 2)
    for trace in traces:
        kinds = [e[0] for e in trace]
        launches = [i for i, k in enumerate(kinds) if k == "launch"]
        joins = [i for i, k in enumerate(kinds) if k == "join"]
        assert len(launches) >= 3 and len(joins) == len(launches), kinds
        assert [trace[i][1] for i in launches] == [trace[i][1] for i in joins] == \
            list(range(len(launches)))
        # a TP input gradient is joined before the next launch; the DP buckets after them all
        tp = [k for k, (a, j) in enumerate(zip(launches, joins))
              if k + 1 == len(launches) or j < launches[k + 1]]
        tp = [k for k in tp if k < len(launches) - 1]  # (the last one: the last DP bucket)
        dp = [k for k in range(len(launches)) if k not in tp]
        assert tp == list(range(len(tp))) and len(tp) >= 2 and len(dp) >= 3, kinds
        for k in tp:
            assert "submit" in kinds[launches[k]:joins[k]], kinds  # dW while dX is reduced
        dl = [launches[k] for k in dp]
        assert dl[-1] < joins[dp[0]] and "host" in kinds[:launches[0]], kinds
        for a, b in zip(dl, dl[1:]):
            assert "submit" in kinds[a:b], kinds
        assert kinds[-1] == "submit" and trace[-1][2] > 0  # clipping, optimizer step


@pytest.mark.timeout(120)
def test_a_rank_failing_with_a_dp_bucket_in_flight_stops_them_all(capsys, monkeypatch):
    """Device 1's rank fails in its third step between launching its first data-parallel
    bucket (in flight) and its second: its peers, waiting on that bucket, raise at once."""
    _small_buckets(monkeypatch)
    real = Replay._host

    def failing(self, op, *a):
        if self.device.index == 1 and op[0] == "a" and op[3] == 1:
            raise RuntimeError("injected fault with a bucket in flight")
        return real(self, op, *a)
    monkeypatch.setattr(Replay, "_host", failing)
    _stops_with(capsys, GPT + ["--dp", "2", "--tp", "2", "--pp", "2"],
                "injected fault with a bucket in flight")
