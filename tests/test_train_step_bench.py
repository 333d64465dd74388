"""benchmarks/train_step.py: its numpy GPT (written out by hand, forward + backward + AdamW)
follows wgrumus' GPT-mini step by step from the same weights, and the benchmark's JSON has
the rows and per-step counters the lead's GPU run reads."""
import json

import pytest
from _util import load_benchmark


def _bench():
    return load_benchmark("train_step", reuse=False)  # a test changes its QUICK sizes


@pytest.mark.timeout(120)
def test_numpy_gpt_matches_wgrumus_step_by_step(dev):
    ts = _bench()
    cfg = dict(batch=2, seq=8, vocab=11, layers=2, d=16, heads=2)
    step, loss, weights = ts.wgrumus_step("gpt", cfg, dev)
    nstep, nloss = ts.numpy_gpt_step(cfg, weights)
    for _ in range(3):
        step()
        nstep()
        assert loss() == pytest.approx(nloss(), rel=1e-4, abs=1e-5)


@pytest.mark.timeout(120)
def test_json_rows_and_counters(capsys):
    ts = _bench()
    ts.QUICK["mlp"] = dict(batch=8, dims=(12, 16, 4))
    rc = ts.main(["--quick", "--json", "--models", "mlp", "--steps", "1", "--repeats", "1",
                  "--warmup", "1", "--no-torch"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["rows"]
    assert row["model"] == "mlp" and row["wgrumus_ms"] > 0 and row["numpy_ms"] > 0
    assert row["per_step"]["dispatches"] > 0
    assert ts.main(["--models", "nope"]) == 2
