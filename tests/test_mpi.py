"""The MPI backend for real: 2-4 processes under mpiexec (the pip ``mpich`` wheel), each running
tests/_mpi_worker.py. Every launch has a subprocess timeout, so a hang fails the test instead of
stalling the run."""
import os
import re
import sys
from pathlib import Path

import pytest
from _util import mpi_skips, mpiexec, run_process

WORKER = Path(__file__).resolve().parent / "_mpi_worker.py"


MPIEXEC = mpiexec()
pytestmark = mpi_skips()


def shm_room(ranks=3):
    """Whether /dev/shm holds the workers' shared windows (1 MiB chunks: tests/_mpi_worker.py)."""
    from wgrumus.distributed.transport import node_shm
    chunk, node_shm.CHUNK = node_shm.CHUNK, 1 << 20
    try:
        return node_shm.fits(ranks)
    finally:
        node_shm.CHUNK = chunk


def launch(n, *args, timeout=1.0, wall=60):
    p = run_process([MPIEXEC, "-n", n, sys.executable, WORKER, *args], wall,
                    WGRUMUS_TEST_TIMEOUT=timeout,
                    WGRUMUS_DEVICES=os.environ.get("WGRUMUS_DEVICES", "8"))
    return p.returncode, p.stdout, p.stderr


def errors_by_rank(out):
    """{rank: (seconds, message)} of the COLLECTIVE_ERROR lines."""
    found = {}
    for m in re.finditer(r"COLLECTIVE_ERROR (\d+) ([\d.]+) ([^\n]*?)(?=COLLECTIVE_ERROR|\n|$)",
                         out):
        found[int(m.group(1))] = (float(m.group(2)), m.group(3))
    return found


def every_rank_ok(n, scenario, timeout):
    """Run ``scenario`` on ``n`` ranks: the job succeeds and every rank reports OK."""
    rc, out, err = launch(n, scenario, timeout=timeout)
    assert rc == 0, out + err
    assert sorted(int(r) for r in re.findall(r"OK (\d+)", out)) == list(range(n)), out + err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_collectives_all_strategies(n):
    every_rank_ok(n, "collectives", 20)


@pytest.mark.timeout(120)
@pytest.mark.skipif(not shm_room(), reason="/dev/shm too small for the shared windows")
@pytest.mark.parametrize("n", [2, 3])
def test_large_all_reduce_through_shared_memory(n):
    every_rank_ok(n, "shared", 30)


@pytest.mark.timeout(60)
def test_each_rank_opens_only_its_own_adapter():
    """Three adapters, two ranks, no WGRUMUS_DEVICES: rank r's process makes one device, on
    adapter r (not one on every adapter, as a first wave's rank did)."""
    every_rank_ok(2, "pinned", 20)


@pytest.mark.timeout(90)
def test_train_3d_over_mpi_opens_only_each_ranks_adapter():
    """train_3d(backend="mpi") chooses its devices before spawn makes the group: the group
    comes first there too, so each rank still opens one adapter."""
    every_rank_ok(2, "pinned3d", 40)


@pytest.mark.timeout(60)
def test_a_rank_without_shared_memory_makes_every_rank_go_without():
    rc, out, err = launch(3, "shared_refused", timeout=20)
    assert rc == 0 and len(re.findall(r"OK \d", out)) == 3, out + err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_async(n):
    every_rank_ok(n, "async", 20)


@pytest.mark.timeout(60)
def test_a_failing_rank_makes_all_reduce_async_raise_everywhere():
    rc, out, err = launch(3, "fault", "raise", "all_reduce_async", timeout=T)
    errs = errors_by_rank(out)
    assert {0, 2} <= set(errs), (rc, out, err)
    for rank in (0, 2):
        seconds, msg = errs[rank]
        assert seconds < T and "injected failure" in msg, msg
    assert not re.search(r"RETURNED [02]", out), out


@pytest.mark.timeout(120)
def test_process_group_manager_and_spawn():
    rc, out, err = launch(4, "groups", timeout=20)
    assert rc == 0 and len(re.findall(r"OK \d", out)) == 4, out + err
    rc, out, err = launch(2, "spawn", timeout=20)
    assert rc == 0 and len(re.findall(r"OK \d", out)) == 2, out + err


T = 0.8  # collective timeout inside the workers


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,prim", [
    ("raise", "all_reduce_ring"),   # uncaught exception: excepthook tells the others at once
    ("raise", "barrier"),
    ("exit", "all_reduce_native"),  # clean sys.exit before the collective: found by timeout
    ("exit", "recv"),
    ("late", "all_gather"),         # never arrives within the timeout
    ("late", "reduce_scatter_native"),
    ("exit", "all_reduce_shared"),  # through the shared window
    ("mid_chunk", "all_reduce_shared"),  # leaves between the chunks of the shared window
    ("mid_chunk", "all_reduce_shared_device"),  # the same inside the pipelined staging engine
])
def test_faulty_rank_makes_the_others_raise(kind, prim):
    if prim.startswith("all_reduce_shared") and not shm_room():
        pytest.skip("/dev/shm too small for the shared windows")
    rc, out, err = launch(3, "fault", kind, prim, timeout=T)
    errs = errors_by_rank(out)
    assert {0, 2} <= set(errs), (rc, out, err)
    for rank in (0, 2):
        seconds, msg = errs[rank]
        if kind == "raise":
            assert seconds < T and "injected failure" in msg, msg  # no need to wait for timeout
        else:
            assert seconds < T + 2.0, (seconds, msg)
    assert not re.search(r"RETURNED [02]", out), out
    if kind == "late":
        # The late rank does not hang either: it raises, or completes when every byte it needed
        # was sent before the others gave up (its next collective would then time out).
        assert 1 in errs or "RETURNED 1" in out, (rc, out, err)


@pytest.mark.timeout(60)
def test_hard_exit_ends_the_job_instead_of_hanging():
    rc, out, err = launch(3, "fault", "hard_exit", "all_reduce_ring", timeout=30)
    assert rc != 0 and "RETURNED" not in out
