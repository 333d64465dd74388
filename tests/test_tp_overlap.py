"""Tensor parallel with its all-reduces overlapped: the row-parallel output reduced in token chunks
(TUNING.tp_chunks) and the column-parallel input gradient reduced while the weight gradient is
computed (TUNING.tp_overlap). Outputs and gradients equal the dense layer's and the single-device
GPT's losses, in tp 2 and 4, on threads and processes; a rank failing inside the asynchronous
all-reduce is a CollectiveError on every rank, long before the timeout."""
import functools
import json
import math
import sys

import _tp_ranks as ranks
import numpy as np
import pytest
from _util import mpi_3d_losses, run_process
from test_parallel3d import BATCH, LR, STEPS, single_device_losses
from test_processes import clean_shm  # noqa: F401  (the fixture)

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus.distributed.parallel3d import GPTConfig, train_3d
from wgrumus.distributed.tensor_parallel import overlap, row_parallel_linear
from wgrumus.runtime.tuning import TUNING


@pytest.fixture(autouse=True)
def tuning_restored():
    was = TUNING.tp_chunks, TUNING.tp_overlap
    yield
    TUNING.tp_chunks, TUNING.tp_overlap = was


_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _dense_mlp():
    """Every TP rank's layers start from the same dense weights: the dense reference."""
    from wgrumus.distributed.tensor_parallel.layers import _dense_init
    return _dense_init(8, 4, True, 1), _dense_init(4, 8, True, 2)


def _check_mlp(res):
    """Outputs and gradients of ranks.mlp against float64 numpy (forward) and autograd."""
    (W1, b1), (W2, b2) = _dense_mlp()
    x = ranks.X.astype(np.float64)
    z = x @ W1.T + b1
    h = _gelu(z)
    y = h @ W2.T + b2
    G = 2 * y
    dh = G @ W2
    dz = dh * (0.5 * (1 + _erf(z / math.sqrt(2))) + z * np.exp(-z * z / 2) / math.sqrt(2 * math.pi))
    want = (y, dz @ W1, np.einsum("bto,bti->oi", dz, x), np.einsum("bto,bti->oi", G, h))
    tol = dict(rtol=2e-4, atol=2e-4)
    for o, gx, _, _ in res:
        np.testing.assert_allclose(o, want[0], **tol)
        np.testing.assert_allclose(gx, want[1], **tol)  # summed over the ranks: whole
    np.testing.assert_allclose(np.concatenate([r[2] for r in res]), want[2], **tol)
    np.testing.assert_allclose(np.concatenate([r[3] for r in res], 1), want[3], **tol)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("chunks,overlap_on", [(1, True), (2, True), (3, False), (16, True)])
def test_mlp_matches_dense_in_every_setting(tp, chunks, overlap_on, devs):
    """chunks 16 > the 10 rows: one chunk per row."""
    res = dist.spawn(functools.partial(ranks.mlp, chunks=chunks, overlap=overlap_on), tp,
                     devices=devs[:tp], timeout=30)
    _check_mlp(res)


def _spy(g, log):
    """Log each asynchronous all-reduce's start and wait with the device's dispatch count."""
    dev, start = g.device, g.all_reduce_async

    def all_reduce_async(x, op="sum"):
        log.append(("start", dev.dispatches))
        work = start(x, op)
        finish = work.wait

        def wait(timeout=None):
            log.append(("wait", dev.dispatches))
            return finish(timeout)
        work.wait = wait
        return work
    g.all_reduce_async = all_reduce_async


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chunks", [2, 3])
def test_row_chunks_overlap_the_next_chunks_matmul(chunks, devs):
    """Chunk k's all-reduce is in flight while chunk k+1 is multiplied: every start but the
    first follows a matmul recorded after the previous start, and all waits follow all starts."""
    TUNING.tp_chunks = chunks

    def fn(g):
        log = []
        _spy(g, log)
        x = wr.tensor(ranks.X[..., :2], device=g.device)
        w = wr.tensor(np.ones((3, 2), np.float32), device=g.device)
        y = row_parallel_linear(x, w, None, g)
        return log, y.numpy(), g.stats()["by_op"]["all_reduce"]["calls"]

    for log, y, calls in dist.spawn(fn, 2, devices=devs[:2], timeout=30):
        kinds = [k for k, _ in log]
        assert kinds == ["start"] * chunks + ["wait"] * chunks and calls == chunks
        starts = [n for k, n in log if k == "start"]
        assert all(b > a for a, b in zip(starts, starts[1:]))  # a matmul between two starts
        np.testing.assert_allclose(y, 2 * np.repeat(ranks.X[..., :2].sum(-1, keepdims=True),
                                                    3, -1), rtol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overlap_on", [True, False])
def test_column_backward_reduces_dx_while_the_weight_gradient_runs(overlap_on, devs):
    """Overlap on: dX's all-reduce starts in the linear's backward and is waited after the
    weight-gradient matmul was recorded; off: no asynchronous all-reduce at all."""
    TUNING.tp_overlap = overlap_on

    def fn(g):
        log = []
        col = dist.ColumnParallelLinear(4, 8, g, seed=1)
        x = wr.tensor(ranks.X, device=g.device, requires_grad=True)
        y = col(x)
        _spy(g, log)
        (y * y).sum().backward()
        return log, g.stats()["by_op"]["all_reduce"]["calls"]

    for log, calls in dist.spawn(fn, 2, devices=devs[:2], timeout=30):
        assert calls == 1
        if overlap_on:
            (k0, n0), (k1, n1) = log
            assert (k0, k1) == ("start", "wait") and n1 > n0  # dW's matmul in between
        else:
            assert log == []


def test_bad_chunk_count_is_a_clear_error():
    TUNING.tp_chunks = 0
    with pytest.raises(ValueError, match="tp_chunks must be an int >= 1"):
        overlap.tp_chunks()


CFG4 = GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=4, n_embd=8)


@pytest.fixture(scope="module")
def reference4(dev):
    return single_device_losses(dev, CFG4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", [(1, 2, 1), (1, 4, 1), (2, 2, 1), (1, 2, 2)])
@pytest.mark.parametrize("chunks,overlap_on", [(2, True), (3, False)])
def test_gpt_layouts_match_single_device(layout, chunks, overlap_on, reference4, devs):
    TUNING.tp_chunks, TUNING.tp_overlap = chunks, overlap_on
    dp, tp, pp = layout
    losses = train_3d(CFG4, dp, tp, pp, steps=STEPS, batch_size=BATCH, lr=LR,
                      devices=devs[:dp * tp * pp], timeout=30)
    np.testing.assert_allclose(losses, reference4, rtol=1e-5, atol=1e-5)


def _cli(*flags, backend="threads"):
    p = run_process([sys.executable, "-m", "wgrumus", "train", "gpt", "--steps", "4",
                     "--n-layer", "1", "--n-embd", "16", "--block-size", "8", "--batch-size",
                     "4", "--backend", backend, "--json", *flags], 400, WGRUMUS_DEVICES="2")
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout)
    if "--tp" in flags:  # what ran, as the flags asked
        assert res["tp_comm"] == {"chunks": int(flags[flags.index("--tp-chunks") + 1]),
                                  "overlap": "--no-tp-overlap" not in flags}, res["tp_comm"]
    return res["losses"]


@pytest.mark.timeout(900)
def test_cli_tp_chunks_and_overlap_give_the_single_device_losses(clean_shm):  # noqa: F811
    """Captured steps (--jit, the default; 4 steps: two replays) replay the chunked
    all-reduces and the overlapped backward (also re-run in the backward's recomputation); the
    processes backend runs them on its communication thread."""
    want = _cli()
    for flags, backend in [(("--tp", "2", "--tp-chunks", "3"), "threads"),
                           (("--tp", "2", "--tp-chunks", "2", "--no-tp-overlap"), "threads"),
                           (("--tp", "2", "--tp-chunks", "2", "--activation-checkpointing"),
                            "threads"),
                           (("--tp", "2", "--tp-chunks", "2"), "processes")]:
        np.testing.assert_allclose(_cli(*flags, backend=backend), want, rtol=1e-5, atol=1e-6,
                                   err_msg=" ".join(flags) + " " + backend)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["raise", "stall"])
def test_failure_inside_the_async_all_reduce_threads(fault, devs):
    res = dist.spawn(functools.partial(ranks.fails_in_async_all_reduce, fault=fault), 2,
                     devices=devs[:2], timeout=3)
    for rank, (err, took) in enumerate(res):
        assert err != "no error", rank
        assert took < (2 if fault == "raise" else 3 + 2), (rank, took, err)
    if fault == "raise":
        assert "injected failure in rank 1" in res[1][0] + res[0][0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault,timeout", [("raise", 20), ("stall", 4)])
def test_failure_inside_the_async_all_reduce_processes(fault, timeout, clean_shm):  # noqa: F811
    """raise: the peer is told at once (far below the timeout); stall: both ranks' waits end
    with a CollectiveError at the timeout, and the stalled process still ends."""
    res = dist.spawn(functools.partial(ranks.fails_in_async_all_reduce, fault=fault), 2,
                     backend="processes", timeout=timeout)
    for rank, (err, took) in enumerate(res):
        assert err != "no error" and took < (10 if fault == "raise" else timeout + 3), \
            (rank, took, err)
    if fault == "raise":
        assert "injected failure in rank 1" in res[1][0]


def test_cli_refuses_tp_flags_without_tp(capsys):
    from wgrumus.cli import main
    rc = main(["train", "gpt", "--tp-chunks", "2", "--steps", "1"])
    out, err = capsys.readouterr()
    assert rc == 2 and "--tp-chunks tunes tensor parallelism" in err, (rc, out, err)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chunks,overlap_on", [(1, False), (2, True)])
def test_tp_step_moves_nothing_through_host_arrays(chunks, overlap_on, devs, monkeypatch):
    """A GPT rank's step under tp 2 (every TP collective: the row-parallel and embedding
    all-reduces, the column-parallel backward's, the vocab-parallel loss's) reads no tensor back
    to the host and uploads no host array: only the staging engine's transfers move data."""
    import threading

    from wgrumus.distributed.parallel3d import RankTrainer, synthetic_tokens
    from wgrumus.runtime.device import Device
    TUNING.tp_chunks, TUNING.tp_overlap = chunks, overlap_on
    armed, counts = threading.local(), {"read_start": 0, "write": 0}

    def counting(name):
        fn = getattr(Device, name)

        def wrapper(self, *a, **kw):
            if getattr(armed, "on", False):
                counts[name] += 1
            return fn(self, *a, **kw)
        return wrapper
    for name in counts:
        monkeypatch.setattr(Device, name, counting(name))
    data = synthetic_tokens(CFG4, 8, 0)

    def fn(g):
        rt = RankTrainer(g, CFG4, 1, 2, 1)
        rt.step_gradients(rt.micro_batches(data[:4]))  # the first step makes its caches
        mbs = rt.micro_batches(data[4:])
        armed.on = True
        try:
            grads = rt.step_gradients(mbs)
        finally:
            armed.on = False
        rt.close()
        return sorted(grads)

    names = dist.spawn(fn, 2, devices=devs[:2], timeout=30)
    assert names[0] and counts == {"read_start": 0, "write": 0}, counts


@pytest.mark.timeout(150)
def test_mpi_backend_chunked_and_overlapped_matches_single_device(reference4):
    mpi = mpi_3d_losses(2, "vocab_size=8, block_size=4, n_layer=2, n_head=4, n_embd=8",
                        "1, 2, 1, steps=4, batch_size=4, lr=1.0",
                        setup="from wgrumus.runtime.tuning import TUNING\nTUNING.tp_chunks = 2")
    np.testing.assert_allclose(mpi, reference4[:4], rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tp,chunks,overlap_on", [(2, 2, True), (4, 3, True), (4, 1, False)])
def test_gpt_gradients_equal_the_dense_gpts(tp, chunks, overlap_on, dev, devs):
    """One step's gradients of every TP rank, put back together, are the dense GPT's."""
    from wgrumus import nn
    from wgrumus.distributed.parallel3d import RankTrainer, gpt_shard_plan, synthetic_tokens
    from wgrumus.distributed.tensor_parallel.shard import unshard_arrays
    TUNING.tp_chunks, TUNING.tp_overlap = chunks, overlap_on
    tokens = synthetic_tokens(CFG4, 4, 0)
    model = CFG4.build(0, dev)
    logits = model(wr.tensor(tokens[:, :-1], device=dev))
    nn.functional.cross_entropy(logits.reshape(-1, CFG4.vocab_size),
                                wr.tensor(tokens[:, 1:].reshape(-1), device=dev)).backward()
    want = {n: p.grad.numpy() for n, p in model.named_parameters()}

    def fn(g):
        rt = RankTrainer(g, CFG4, 1, tp, 1)
        grads = {n: v.numpy() for n, v in rt.gradients(tokens).items()}
        rt.close()
        return grads

    shards = dist.spawn(fn, tp, devices=devs[:tp], timeout=30)
    plan = gpt_shard_plan(want)
    assert set(shards[0]) == set(want)
    for n, w in want.items():
        got = unshard_arrays([s[n] for s in shards], plan[n], is_bias=n.endswith("bias"),
                             num_heads=CFG4.n_head)
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5, err_msg=n)
