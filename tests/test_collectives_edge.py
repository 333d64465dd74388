"""Collective edge cases of issue 15, item 6, over threads and MPI: 0-d arrays keep their shape
in every strategy, and ranks that disagree on a collective (op, root, which collective) get a
CollectiveError naming the difference, in every strategy, instead of a hang or a wrong result."""
import re
import time

import numpy as np
import pytest

from wgrumus import distributed as dist
from wgrumus.distributed import CollectiveConfig, CollectiveError

pytestmark = pytest.mark.timeout(60)

ALL_REDUCE = ["ring", "tree", "tree:3", "centralized", "native", "auto"]
ROOTED = ["direct", "tree", "tree:3", "native", "auto"]
DEFAULT = None  # spawn's own configuration (native strategies for threads)


def run(fn, n=3, all_reduce="auto", rooted="auto", timeout=5):
    cfg = None if all_reduce is DEFAULT else CollectiveConfig(
        num_devices=n, local_all_reduce=all_reduce, local_reduce=rooted,
        local_broadcast=rooted, timeout=timeout)
    return dist.spawn(fn, n, timeout=timeout, config=cfg)


@pytest.mark.parametrize("strategy", ALL_REDUCE + [DEFAULT])
def test_all_reduce_keeps_0d(strategy):
    out = run(lambda g: g.all_reduce(np.float32(g.rank + 1), "mean"), all_reduce=strategy)
    assert [o.shape for o in out] == [()] * 3 and all(o == 2.0 for o in out)


@pytest.mark.parametrize("strategy", ROOTED + [DEFAULT])
def test_reduce_and_broadcast_keep_0d(strategy):
    def fn(g):
        red = g.reduce(np.int32(g.rank), root=2)
        bc = g.broadcast(np.float64(1.5) if g.rank == 1 else None, root=1)
        like = g.broadcast(np.float64(g.rank), root=0)  # non-roots pass a 0-d template
        return red, bc, like
    out = run(fn, rooted="auto" if strategy is DEFAULT else strategy,
              all_reduce=DEFAULT if strategy is DEFAULT else "auto")
    assert out[0][0] is None and out[2][0].shape == () and out[2][0] == 3
    assert all(bc.shape == () and bc == 1.5 for _, bc, _ in out)
    assert all(like.shape == () and like == 0.0 for _, _, like in out)


def test_tensor_0d_round_trip(devs):
    import wgrumus as wr
    out = dist.spawn(lambda g: g.all_reduce(wr.tensor(np.float32(g.rank), device=g.device)), 2,
                     devices=devs[:2], timeout=5)
    assert [o.shape for o in out] == [(), ()] and [o.item() for o in out] == [1.0, 1.0]


MISMATCHES = {  # whichever rank reaches the check first, the message names both calls
    "op": (lambda g: g.all_reduce(np.ones(4, np.float32), "max" if g.rank == 1 else "sum"),
           r"all_reduce: ranks disagree.*rank \d passed .*op (max|sum).*others .*op (sum|max)"),
    "reduce_root": (lambda g: g.reduce(np.ones(3), root=int(g.rank == 1)),
                    r"reduce: ranks disagree.*rank \d passed .*root [01].*others .*root [01]"),
    "broadcast_root": (lambda g: g.broadcast(np.ones(3), root=int(g.rank == 1)),
                       r"broadcast: ranks disagree.*rank \d passed root [01].*others root [01]"),
    "collective": (lambda g: g.barrier() if g.rank == 1 else g.all_reduce(np.ones(2)),
                   r"ranks called different collectives.*rank \d called (barrier\(\)|all_reduce\()"
                   r".*others (all_reduce\(|barrier\(\))"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
@pytest.mark.parametrize("strategy", ["ring", "tree", "centralized", "native", "auto"])
def test_mismatched_collectives_raise(case, strategy):
    fn, what = MISMATCHES[case]

    def staggered(g):
        if g.rank == 1:
            time.sleep(0.05)  # the ranks reach the check at different times
        return fn(g)
    rooted = {"ring": "direct", "centralized": "direct"}.get(strategy, strategy)
    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match=what + r".*same collectives in the same order"):
        run(staggered, all_reduce=strategy, rooted=rooted, timeout=10)
    assert time.monotonic() - t0 < 5  # detected at once, not at the 10 s timeout


# ------------------------------------------------------------------------------- MPI
def _mpi():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    from _util import mpiexec
    return mpiexec()


MPIEXEC = _mpi()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec / mpi4py not installed")


def _launch(n, *args, timeout=10.0):
    import os
    import sys
    from pathlib import Path

    from _util import run_process
    worker = Path(__file__).resolve().parent / "_mpi_worker.py"
    p = run_process([MPIEXEC, "-n", n, sys.executable, worker, *args], 60,
                    WGRUMUS_TEST_TIMEOUT=timeout,
                    WGRUMUS_DEVICES=os.environ.get("WGRUMUS_DEVICES", "8"))
    return p.returncode, p.stdout + p.stderr


@needs_mpi
@pytest.mark.timeout(120)
def test_mpi_0d_every_strategy():
    rc, out = _launch(3, "zero_d")
    assert rc == 0 and sorted(re.findall(r"OK (\d)", out)) == ["0", "1", "2"], out


@needs_mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case, strategy", [("op", "ring"), ("op", "tree"),
                                            ("reduce_root", "tree"),
                                            ("broadcast_root", "direct"),
                                            ("collective", "centralized")])
def test_mpi_mismatch_every_rank_raises(case, strategy):
    rc, out = _launch(3, "mismatch", case, strategy, timeout=20.0)
    errs = re.findall(r"COLLECTIVE_ERROR (\d) ([\d.]+) ([^\n]*)", out)
    assert sorted(r for r, _, _ in errs) == ["0", "1", "2"], out
    assert all(float(s) < 10 for _, s, _ in errs), out  # at once, not at the 20 s timeout
    assert all("rank 1 " in m and "same collectives in the same order" in m
               for _, _, m in errs), out
