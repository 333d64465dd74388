"""Pipeline layouts over MPI for real (issue: ``mpiexec -n 4 wgrumus train gpt --backend mpi --dp
2 --pp 2`` hung once a schedule had a stage send twice before receiving): every schedule with 1-8
micro-batches, with dp and tp, under mpiexec (the pip ``mpich`` wheel), each giving the threads
backend's losses. Activations are 16 KB a message, above MPICH's eager limit, so sends use the
rendezvous protocol (a send completes only once its receive is posted)."""
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from _util import mpi_skips, mpiexec, run_process

WORKER = Path(__file__).resolve().parent / "_mpi_pipeline_worker.py"
MPIEXEC = mpiexec()
pytestmark = mpi_skips()

# 8 rows x T 16 x C 32 x 4 bytes = 16 KB per activation message
CONFIG = dict(vocab_size=16, block_size=16, n_layer=4, n_head=2, n_embd=32)
ROWS = 8  # sequences per micro-batch and replica
TIMEOUT = 20.0  # a hang fails within this, not at the test's limit


def layout(schedule, m, dp=1, tp=1, pp=2, steps=2):
    return dict(dp=dp, tp=tp, pp=pp, m=m, batch=dp * m * ROWS, steps=steps, schedule=schedule)


TWO_RANKS = [layout(s, m) for s, ms in (("gpipe", (1, 3)), ("1f1b", (2, 4, 8)),
                                        ("interleaved", (2, 6)), ("zb-h1", (1, 5)))
             for m in ms]
FOUR_RANKS = [layout("1f1b", 4, dp=2), layout("zb-h1", 3, tp=2), layout("interleaved", 2, tp=2),
              layout("1f1b", 7, pp=4)]


def run_mpi(n, layouts):
    p = run_process([MPIEXEC, "-n", n, sys.executable, WORKER, json.dumps(layouts),
                     json.dumps(CONFIG)], 240, WGRUMUS_TEST_TIMEOUT=TIMEOUT,
                    WGRUMUS_DEVICES=n)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and len(re.findall(r"^OK \d+$", p.stdout, re.M)) == n, out
    got = {}
    for line in p.stdout.splitlines():
        if line.startswith("LOSSES "):
            lay, losses = line[7:].split("} ", 1)
            got[json.dumps(json.loads(lay + "}"), sort_keys=True)] = json.loads(losses)
    return got


def threads_losses(lay):
    from wgrumus.distributed.parallel3d import GPTConfig, train_3d
    return train_3d(GPTConfig(**CONFIG), lay["dp"], lay["tp"], lay["pp"], steps=lay["steps"],
                    batch_size=lay["batch"], micro_batches=lay["m"], schedule=lay["schedule"],
                    backend="threads", timeout=TIMEOUT)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n,layouts", [(2, TWO_RANKS), (4, FOUR_RANKS)], ids=["2", "4"])
def test_every_schedule_over_mpi_gives_the_threads_losses(n, layouts):
    got = run_mpi(n, layouts)
    assert len(got) == len(layouts), got
    for lay in layouts:
        want = threads_losses(lay)
        have = got[json.dumps(lay, sort_keys=True)]
        np.testing.assert_allclose(have, want, rtol=2e-5, atol=2e-6, err_msg=str(lay))


@pytest.mark.timeout(300)
def test_readme_mpi_pipeline_command_trains_like_threads():
    """The README's command (captured steps, the default) at a small size."""
    args = ["train", "gpt", "--dp", "2", "--pp", "2", "--steps", "2", "--n-layer", "2",
            "--n-embd", "64", "--block-size", "32", "--batch-size", "16", "--json"]
    p = run_process([MPIEXEC, "-n", 4, sys.executable, "-m", "wgrumus", *args, "--backend",
                     "mpi"], 240, WGRUMUS_DEVICES=4)
    assert p.returncode == 0, p.stdout + p.stderr
    mpi = json.loads(p.stdout.strip().splitlines()[-1])
    p = run_process([sys.executable, "-m", "wgrumus", *args], 240, WGRUMUS_DEVICES=4)
    assert p.returncode == 0, p.stdout + p.stderr
    threads = json.loads(p.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(mpi["losses"], threads["losses"], rtol=2e-5, atol=2e-6)


@pytest.mark.timeout(180)
def test_a_stage_failing_mid_transfer_is_a_clear_error_on_every_rank():
    """Stage 1 of 3 raises mid-step while its neighbours send to it and wait for it: both raise
    a CollectiveError naming the failure well within the timeout."""
    timeout = 30.0
    p = run_process([MPIEXEC, "-n", 3, sys.executable, WORKER, "fault", json.dumps(CONFIG)],
                    150, WGRUMUS_TEST_TIMEOUT=timeout, WGRUMUS_DEVICES=3)
    out = p.stdout + p.stderr
    errs = {int(m.group(1)): (float(m.group(2)), m.group(3)) for m in re.finditer(
        r"COLLECTIVE_ERROR (\d+) ([\d.]+) ([^\n]*)", p.stdout)}
    assert set(errs) == {0, 2}, out
    for seconds, msg in errs.values():
        assert seconds < timeout / 2 and "injected stage failure" in msg, (seconds, msg)
    assert "RETURNED" not in p.stdout, out
