"""Backend 'processes': ranks as processes that wgrumus starts, over shared memory. The transport
itself is tested in one process (ranks as threads on one segment, tiny rings and slots, so every
wrap-around and chunk boundary is crossed); launches are few (processes start slowly here)."""
import glob
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import _process_ranks as ranks
import numpy as np
import pytest
from _util import subprocess_env

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus.distributed import CollectiveConfig, CollectiveError, ProcessGroup
from wgrumus.distributed.transport.shm import ShmState, ShmTransport
from wgrumus.distributed.transport.shm_segment import Segment, new_world_name, unlink_all


def segments_left():
    return glob.glob("/dev/shm/wgrumus-*")


def _ours_or_orphaned(path: str) -> bool:
    """A segment this process created, or one whose creator (wgrumus-PID-...) has ended: other
    test processes on the machine create and remove their own meanwhile."""
    pid = int(path.split("wgrumus-", 1)[1].split("-", 1)[0])
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@pytest.fixture
def clean_shm():
    before = set(segments_left())
    yield
    left = {p for p in set(segments_left()) - before if _ours_or_orphaned(p)}
    assert left == set(), "shared-memory segments left in /dev/shm"
    assert multiprocessing.active_children() == []


def on_one_segment(world, fn, ring=4096, slot=4096, timeout=10.0):
    """``fn(group)`` for ``world`` ranks as threads sharing one small segment; results, errors."""
    name = new_world_name()
    seg = Segment(name, create_world=world, ring=ring, slot=slot)
    results, errors = [None] * world, [None] * world

    def run(r):
        t = ShmTransport(seg, r, ShmState(seg, r, None), timeout=timeout)
        g = ProcessGroup(t, CollectiveConfig(num_devices=world, timeout=timeout))
        try:
            results[r] = fn(g)
        except BaseException as e:  # noqa: BLE001
            errors[r] = e
            g.abort(e)
    try:
        ths = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(4 * timeout)
        assert not any(t.is_alive() for t in ths)
    finally:
        unlink_all(name)
    return results, errors


@pytest.mark.timeout(120)
def test_transport_rings_and_slots_small():
    """Messages and arrays far larger than a 4 KB ring / slot: exact, in tag order, no deadlock
    when both ranks send large messages before receiving."""
    def fn(g):
        r, peer = g.rank, 1 - g.rank
        data = [np.arange(5000 + 7 * t, dtype=np.float64) * (r + 1) + t for t in range(4)]
        works = [g.isend(d, peer, tag=t) for t, d in enumerate(data)]
        got = [g.recv(peer, tag=t) for t in (3, 1, 0, 2)]
        for w in works:
            w.wait()
        x = np.random.default_rng(r).standard_normal(10_007).astype(np.float32)
        s = g.all_reduce(x, "sum")
        gath = g.all_gather(np.full(3000 + r, r, np.int16), strategy="native")
        bc = g.broadcast(np.arange(3333.0) if r == 1 else np.zeros(3333), root=1)
        return got, s, gath, bc

    (res, errs) = on_one_segment(2, fn)
    assert errs == [None, None]
    for r in range(2):
        got, s, gath, bc = res[r]
        peer = 1 - r
        for t, a in zip((3, 1, 0, 2), got):
            np.testing.assert_array_equal(a, np.arange(5000 + 7 * t) * (peer + 1) + t)
        xs = [np.random.default_rng(q).standard_normal(10_007).astype(np.float32)
              for q in range(2)]
        np.testing.assert_array_equal(s, xs[0] + xs[1])
        np.testing.assert_array_equal(gath, np.repeat([0, 1], [3000, 3001]))
        np.testing.assert_array_equal(bc, np.arange(3333.0))


@pytest.mark.timeout(60)
def test_transport_mismatch_and_abort_are_errors():
    def mismatch(g):
        if g.rank == 0:
            return g.all_reduce(np.ones(3), "sum")
        return g.broadcast(np.ones(3), root=0)
    _, errs = on_one_segment(2, mismatch)
    assert all(isinstance(e, CollectiveError) for e in errs)
    assert any("different collectives" in str(e) for e in errs)

    def one_fails(g):
        if g.rank == 1:
            raise RuntimeError("boom")
        return g.recv(1, tag=0)
    t0 = time.monotonic()
    _, errs = on_one_segment(2, one_fails, timeout=30.0)
    assert time.monotonic() - t0 < 10  # the abort word, not the timeout
    assert isinstance(errs[0], CollectiveError) and "RuntimeError: boom" in str(errs[0])


@pytest.mark.timeout(300)
def test_processes_match_threads(clean_shm):
    """Every collective and send/recv pattern gives the threads backend's results."""
    got = dist.spawn(ranks.collectives, 3, backend="processes", timeout=60)
    want = dist.spawn(ranks.collectives, 3, backend="threads", devices=wr.devices()[:3],
                      timeout=60)
    for r in range(3):
        assert got[r].keys() == want[r].keys()
        for k in want[r]:
            a, b = got[r][k], want[r][k]
            if isinstance(b, list):
                for u, v in zip(a, b):
                    np.testing.assert_allclose(u, v, rtol=1e-6, err_msg=f"rank {r} {k}")
            elif b is None:
                assert a is None, (r, k)
            else:
                np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"rank {r} {k}")


def _failing_launch(fn, timeout):
    t0 = time.monotonic()
    with pytest.raises(BaseException) as ei:
        dist.spawn(fn, 2, backend="processes", timeout=timeout)
    return ei.value, time.monotonic() - t0, "\n".join(getattr(ei.value, "__notes__", []))


@pytest.mark.timeout(120)
def test_killed_rank_is_an_error_everywhere(clean_shm):
    err, took, notes = _failing_launch(ranks.killed_mid_collective, 30.0)
    assert isinstance(err, CollectiveError), err
    assert "SIGKILL" in str(err) + notes, notes
    assert "rank 0: CollectiveError" in notes and "rank 1" in notes, notes
    assert took < 30, took  # found by the launcher / the peer check, not the timeout


@pytest.mark.timeout(120)
def test_hanging_rank_times_out_and_is_ended(clean_shm):
    err, took, notes = _failing_launch(ranks.hangs, 3.0)
    assert isinstance(err, CollectiveError) and err.timed_out, err
    assert "did not arrive" in str(err), err
    assert "killed" in notes, notes
    assert took < 40, took


@pytest.mark.timeout(120)
def test_raising_rank_reaches_the_caller(clean_shm):
    err, took, notes = _failing_launch(ranks.raises, 30.0)
    assert isinstance(err, ValueError) and "bad batch on rank 0" in str(err)
    assert "rank 1: CollectiveError" in notes, notes
    assert "rank 0 aborted: ValueError: bad batch" in notes, notes
    assert took < 30, took


def test_bad_backend_and_outside_launch():
    with pytest.raises(ValueError, match="unknown backend"):
        dist.spawn(ranks.hangs, 2, backend="proc")
    with pytest.raises(ValueError, match="wgrumus started"):
        dist.init_process_group("processes")


def _train(*extra, model=("mlp", "--dp", "2")):
    cmd = [sys.executable, "-m", "wgrumus", "train", *model, "--steps", "4", "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=subprocess_env(WGRUMUS_DEVICES="2"))
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


@pytest.mark.timeout(900)
def test_cli_processes_gives_the_threads_losses(clean_shm):
    got = _train("--backend", "processes")
    want = _train("--backend", "threads")
    assert got["layout"]["backend"] == "processes"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)


@pytest.mark.timeout(600)
def test_cli_processes_f16_gives_the_threads_losses(clean_shm):
    """--precision f16 runs under every backend: processes ranks train as the threads do."""
    if "shader-f16" not in wr.devices()[0].features:
        pytest.skip("the adapter lacks shader-f16")
    gpt = ("gpt", "--dp", "2", "--precision", "f16", "--n-layer", "1", "--block-size", "8",
           "--batch-size", "4")
    got = _train("--backend", "processes", model=gpt)
    want = _train("--backend", "threads", model=gpt)
    assert got["layout"]["backend"] == "processes"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)


PROCESS_BAD = [
    (["train", "mlp", "--backend", "processes", "--dp", "2", "--pp", "2", "--devices", "4"],
     "runs --pp for the gpt model"),
    (["train", "cnn", "--backend", "mpi", "--pp", "2", "--devices", "2"],
     "--backend mpi runs --pp for the gpt model"),
    (["train", "mlp", "--backend", "processes", "--dp", "2", "--devices", "1"],
     "2 devices needed"),
    (["train", "mlp", "--backend", "processes", "--dp", "2"], "processes need as many adapters"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", PROCESS_BAD, ids=[" ".join(a) for a, _ in PROCESS_BAD])
def test_cli_processes_bad_arguments_exit_2(args, needle, capsys, monkeypatch):
    from wgrumus.cli import main
    monkeypatch.delenv("WGRUMUS_DEVICES")  # one lavapipe adapter, no logical devices
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and needle in err, (rc, out, err)


def test_auto_backend_stays_on_threads_for_logical_devices(monkeypatch):
    from wgrumus.cli import build_parser, config
    # --devices 2 remakes the process's devices: the other tests keep theirs
    monkeypatch.setattr(wr.MultiGpuContext, "_instance", wr.MultiGpuContext.get())
    for extra in (["--devices", "2"], []):
        args = build_parser().parse_args(["train", "mlp", "--dp", "2", *extra])
        assert config.config_from_args(args).layout.backend == "threads"
    monkeypatch.setenv("PMI_RANK", "0")  # under mpiexec: the MPI backend
    args = build_parser().parse_args(["train", "gpt", "--dp", "2"])
    assert config._backend(args, "gpt", 2) == "mpi"
    monkeypatch.delenv("PMI_RANK")
    monkeypatch.delenv("WGRUMUS_DEVICES")  # lavapipe is a CPU adapter: threads
    assert config._backend(args, "gpt", 2) == "threads"


def test_auto_backend_on_physical_gpus(monkeypatch):
    """With a GPU adapter per rank, auto takes processes for data parallelism alone over 4+
    replicas or with --sync-every, threads for every other layout (the measured faster one)."""
    from types import SimpleNamespace

    from wgrumus.cli import build_parser, config
    from wgrumus.runtime import adapters
    gpus = [SimpleNamespace(info={"adapter_type": "DiscreteGPU"}) for _ in range(4)]
    monkeypatch.setattr(adapters, "select_adapters", lambda *a, **k: gpus)
    monkeypatch.delenv("WGRUMUS_DEVICES", raising=False)
    want = {("--dp", "4"): "processes", ("--dp", "2", "--sync-every", "8"): "processes",
            ("--dp", "2"): "threads", ("--pp", "2"): "threads", ("--tp", "2"): "threads",
            ("--dp", "2", "--pp", "2"): "threads"}
    for extra, backend in want.items():
        args = build_parser().parse_args(["train", "gpt", *extra])
        world = args.dp * args.tp * args.pp
        assert config._backend(args, "gpt", world) == backend, extra


@pytest.mark.timeout(300)
def test_device_send_recv_between_processes(clean_shm):
    """Tensors of every size class arrive exact, in tag order, on the receiver's device, with
    each phase of the transfer timed."""
    res = dist.spawn(ranks.device_p2p, 2, backend="processes", timeout=60)
    sizes = [1, 1000, (1 << 18) + 3, (3 << 20) // 4 + 5]
    for r, (got, far, ph) in enumerate(res):
        prev = 1 - r
        for t, k in enumerate(sizes):
            np.testing.assert_array_equal(got[t][0], np.arange(k, dtype=np.float32)
                                          + 1000 * prev + t)
        np.testing.assert_array_equal(got[9][0], np.arange(6).reshape(2, 3) * prev)
        assert far == prev * ((5 << 20) // 4)
        for key in ("submit", "fence", "map", "copy", "peer"):
            assert ph[key][1] > 0, (key, ph)


@pytest.mark.timeout(600)
def test_collectives_benchmark_processes_tables(clean_shm):
    """benchmarks/collectives.py --backend processes prints both tables (tiny sizes here)."""
    from _util import ROOT, run_process
    p = run_process([sys.executable, ROOT / "benchmarks" / "collectives.py", "--backend",
                     "processes", "--ranks", "2", "--sizes", "65536", "--latency-sizes",
                     "4096,65536", "--no-reference", "--json"], 500, WGRUMUS_DEVICES="2")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    bw = [r for r in rows if r["table"] == "bw"]
    lat = [r for r in rows if r["table"] == "latency"]
    assert [(r["dtype"], r["bytes"]) for r in bw] == [("float32", 65536), ("float16", 32768)]
    assert all(r["ratio"] > 0 and r["bound_GBps"] > 0 for r in bw)
    assert [r["bytes"] for r in lat] == [4096, 65536]
    for r in lat:
        assert r["sendrecv_s"] > 0 and r["allreduce_s"] > 0 and r["hostcopy_s"] > 0
        assert r["split_sendrecv"]["copy"] > 0 and r["split_allreduce"]["submit"] > 0


def test_unpicklable_fn_is_a_clear_error(clean_shm):
    with pytest.raises(ValueError, match="must be picklable"):
        dist.spawn(lambda g: g.rank, 2, backend="processes")


@pytest.mark.timeout(300)
def test_readme_processes_example_runs(tmp_path, clean_shm):
    from _util import ROOT, run_process
    text = (ROOT / "README.md").read_text()
    at = text.index("backend=\"processes\"))")
    start = text.rindex("```python", 0, at) + len("```python")
    code = "\n".join(line[2:] for line in text[start:text.index("```", start)].splitlines())
    script = tmp_path / "readme_processes.py"
    script.write_text(code)
    p = run_process([sys.executable, script], 250, WGRUMUS_DEVICES="2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[3., 3., 3., 3.]" in p.stdout.replace("\n", "").replace("  ", " "), p.stdout


@pytest.mark.timeout(900)
def test_cli_processes_gpt_pipeline_gives_the_threads_losses(clean_shm):
    """Pipeline stages as processes: activations and gradients cross as device tensors."""
    gpt = ("gpt", "--pp", "2", "--micro-batches", "2", "--n-layer", "2", "--block-size", "16",
           "--batch-size", "8")
    got = _train("--backend", "processes", model=gpt)
    want = _train("--backend", "threads", model=gpt)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)


@pytest.mark.timeout(120)
def test_peer_dying_mid_transfer_is_an_error(clean_shm):
    err, took, notes = _failing_launch(ranks.dies_mid_transfer, 30.0)
    assert isinstance(err, CollectiveError), err
    assert "rank 1: CollectiveError" in notes and ("died" in notes or "SIGKILL" in notes), notes
    assert took < 30, took


@pytest.mark.timeout(120)
def test_rank_exiting_without_a_result_is_an_error(clean_shm):
    err, took, notes = _failing_launch(ranks.exits_quietly, 30.0)
    assert isinstance(err, CollectiveError), err
    assert "without a result" in str(err) + notes and "rank 0: CollectiveError" in notes, notes
    assert took < 30, took
