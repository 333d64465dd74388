"""Randomized fault injection (CI subset of benchmarks/reliability.py, issue 10 item 1).

Every primitive (CollectiveBarrier, CommThread/async_allreduce, ProcessGroup collectives and
send/recv, DataParallel replica, pipeline stage forward/backward, tensor-parallel rank, FSDP rank,
MPI rank) gets each fault (raise, stall past the timeout, silent early exit) at a seeded random
point. Every participant must end with a CollectiveError or the injected exception within the
bound, no thread may be left alive, and a fresh training must work afterwards. The full 100-run
campaign is ``python benchmarks/reliability.py --runs 100``.
"""
import importlib.util

import numpy as np
import pytest
from _util import load_benchmark

rel = load_benchmark("reliability")

T = 1.0  # collective timeout in these runs, seconds

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and rel.mpiexec() is not None


@pytest.fixture(scope="module")
def warmed(devs):
    rel.warm_up(T)
    return True


def _params():
    """One run per primitive x fault, seeds drawn from one seeded RNG (24 runs)."""
    rng = np.random.default_rng(2026)
    out = []
    for prim in rel.PRIMITIVES:
        for fault in rel.FAULTS:
            marks = [pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec not installed")] \
                if prim == "mpi" else []
            out.append(pytest.param(prim, fault, int(rng.integers(1 << 30)), marks=marks,
                                    id=f"{prim}-{fault}"))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prim,fault,seed", _params())
def test_fault_surfaces_everywhere_and_process_recovers(warmed, prim, fault, seed):
    rec = rel.run_one(prim, fault, seed, T, train_after=(fault == "raise"))
    assert rec["ok"], "\n".join(rec["problems"]) + f"\n{rec}"


@pytest.mark.timeout(60)
def test_fresh_training_after_all_faults(warmed):
    res = rel.fresh_training()
    assert res["ok"], res


def test_schedule_covers_every_primitive_and_fault():
    runs = rel.schedule_runs(100, 0)
    pairs = {(p, f) for p, f, _ in runs}
    assert pairs == {(p, f) for p in rel.PRIMITIVES for f in rel.FAULTS}
    assert runs == rel.schedule_runs(100, 0)  # seeded: reproducible


def test_checker_rejects_a_run_that_did_not_fail():
    """The driver's checks can fail: a participant that finished normally is a problem."""
    plan = rel.Plan("raise", 1, 0)
    res = {"participants": {0: rel.Outcome("ok"), 1: rel.Outcome("error", rel.InjectedFault("x"))}}
    assert rel.check("barrier", plan, res, T, 0.1)
    res["participants"][0] = rel.Outcome("error", ValueError("unrelated"))
    assert rel.check("barrier", plan, res, T, 0.1)
    res["participants"][0] = rel.Outcome("hung")
    assert rel.check("barrier", plan, res, T, 0.1)
    assert rel.check("barrier", plan, {"participants": {}}, T, 100.0)  # too slow
