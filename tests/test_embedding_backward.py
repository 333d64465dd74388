"""index_select / embedding backward through the sorted indices (shaders/index_sorted.wgsl):
numpy's np.add.at at small shapes with every layout, and past the sizes where kernels break
(runs longer than llvmpipe's 65,535 loop iterations, more than 65,535 workgroups, row numbers
past 2^24). Its speed is measured by benchmarks/embedding_backward.py."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus.kernels import index as index_kernels
from wgrumus.nn import functional as F
from wgrumus.ops.indexing import index_select

pytestmark = pytest.mark.timeout(600)


def add_at(shape, axis, idx, g):
    ref = np.zeros(shape, np.float64)
    np.add.at(np.moveaxis(ref, axis, 0), np.where(idx < 0, idx + shape[axis], idx),
              np.moveaxis(g.astype(np.float64), axis, 0))
    return ref


@pytest.mark.parametrize("sorted_min", [0, None])  # None: the default choice (the row scan)
@pytest.mark.parametrize("shape,axis,K", [((7, 5), 0, 13), ((3, 11, 4), 1, 40), ((6, 33), 0, 1000),
                                          ((5, 3), 0, 1), ((4, 40), 0, 0), ((2, 9, 3), 2, 17),
                                          ((300, 6), 0, 700)])
def test_matches_add_at(dev, rng, monkeypatch, sorted_min, shape, axis, K):
    if sorted_min is not None:
        monkeypatch.setattr(index_kernels, "SORTED_MIN", sorted_min)
    x = wr.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)
    idx = rng.integers(-shape[axis], shape[axis], K).astype(np.int32)
    if K > 10:
        idx[: K // 3] = idx[0]  # one long run
    out = index_select(x, axis, wr.tensor(idx))
    g = rng.standard_normal(out.shape).astype(np.float32)
    (out * wr.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), add_at(shape, axis, idx, g), rtol=1e-5,
                               atol=1e-5)


def test_same_bits_as_the_row_scan_for_short_runs(dev, rng, monkeypatch):
    """Runs within one block add in ascending position, as the row scan does."""
    w = wr.tensor(rng.standard_normal((50, 8)).astype(np.float32), requires_grad=True)
    ids = wr.tensor(rng.integers(0, 50, 200).astype(np.int32))
    g = wr.tensor(rng.standard_normal((200, 8)).astype(np.float32))
    grads = []
    for m in (0, 1 << 40):
        monkeypatch.setattr(index_kernels, "SORTED_MIN", m)
        grads.append(wr.autograd.backward_with_grad(F.embedding(ids, w), g).get(w).numpy())
    np.testing.assert_array_equal(grads[0], grads[1])


def test_300k_ids_with_a_run_past_the_loop_limit(dev, rng):
    """300k ids over 100k rows, 200k of them in one row: a run far past 65,535 entries."""
    V, K = 100_000, 300_000
    ids = rng.integers(0, V, K).astype(np.int32)
    ids[rng.permutation(K)[:200_000]] = 4321
    w = wr.tensor(np.zeros((V, 2), np.float32), requires_grad=True)
    g = rng.standard_normal((K, 2)).astype(np.float32)
    dw = wr.autograd.backward_with_grad(F.embedding(wr.tensor(ids), w), wr.tensor(g)).get(w)
    np.testing.assert_allclose(dw.numpy(), add_at((V, 2), 0, ids, g), rtol=1e-4, atol=2e-3)


def test_rows_past_2_24_and_65535_workgroups(dev, rng):
    V = (1 << 24) + 8  # row numbers not exact in float32; one output per invocation: 65,537+
    K = 70_000         # workgroups of 256
    ids = rng.integers(0, V, K).astype(np.int32)
    ids[:8] = np.arange(V - 8, V)
    ids[8:20] = V - 1
    w = wr.tensor(np.zeros((V, 1), np.float32), requires_grad=True)
    g = rng.standard_normal((K, 1)).astype(np.float32)
    assert V * K >= index_kernels.SORTED_MIN
    dw = wr.autograd.backward_with_grad(F.embedding(wr.tensor(ids), w), wr.tensor(g)).get(w)
    got = dw.numpy()
    ref = add_at((V, 1), 0, ids, g)
    hit = np.unique(ids)
    np.testing.assert_allclose(got[hit], ref[hit], rtol=1e-5, atol=1e-5)
    assert np.count_nonzero(got) == np.count_nonzero(ref)
