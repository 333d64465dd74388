"""Tensor parallelism: every parallel layer's output and gradients equal the dense layer's
(float64 numpy reference, analytic or central differences) for tp in {2, 4}."""
import math

import numpy as np
import pytest
from gradcheck import numeric_grad

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus.distributed import tensor_parallel as TP
from wgrumus.distributed.tensor_parallel import shard as S
from wgrumus.runtime.errors import ShapeError

TPS = [2, 4]


def run(tp, devs, fn):
    return dist.spawn(fn, tp, devices=devs[:tp], timeout=30)


def close(a, b, tol=2e-4):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=tol, atol=tol)


def _t(a, g, grad=False):
    return wr.tensor(np.asarray(a, np.float32), device=g.device, requires_grad=grad)


def _linear_case(rng, in_f, out_f):
    """Input [2, 3, in], dense weight and bias, and an upstream gradient for a linear layer."""
    return (rng.standard_normal((2, 3, in_f)), rng.standard_normal((out_f, in_f)),
            rng.standard_normal(out_f), rng.standard_normal((2, 3, out_f)))


def _outputs_and_grads(out, G, g, ts):
    """Backpropagate the upstream gradient ``G`` from ``out``: the output and every input's
    gradient, as numpy (what each rank hands back from ``spawn``)."""
    (out * _t(G, g)).sum().backward()
    return out.numpy(), [t.grad.numpy() for t in ts]


def _gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


# ------------------------------------------------------------------------ linear layers
@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("gather", [True, False])
def test_column_parallel_linear_matches_dense(tp, gather, devs, rng):
    x, W, b, G = _linear_case(rng, 6, 8)

    def fn(g):
        r = g.rank
        xt, wt = _t(x, g, True), _t(S.split(W, tp, r, 0), g, True)
        bt = _t(S.split(b, tp, r, 0), g, True)
        out = TP.column_parallel_linear(xt, wt, bt, g, gather_output=gather)
        o, grads = _outputs_and_grads(out, G if gather else S.split(G, tp, r, 2), g, (xt, wt, bt))
        return (o, *grads)

    res = run(tp, devs, fn)
    ref = x @ W.T + b
    outs = [o for o, *_ in res]
    for r, o in enumerate(outs):
        close(o, ref if gather else S.split(ref, tp, r, 2))
    for _, gx, _, _ in res:  # the input gradient is summed over the TP ranks: identical, whole
        close(gx, G @ W)
    close(np.concatenate([gw for *_, gw, _ in res]), np.einsum("bto,bti->oi", G, x))
    close(np.concatenate([gb for *_, gb in res]), G.sum((0, 1)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_linear_sums_and_adds_bias_once(tp, input_is_parallel, devs, rng):
    x, W, b, G = _linear_case(rng, 8, 5)

    def fn(g):
        r = g.rank
        xin = S.split(x, tp, r, 2) if input_is_parallel else x
        xt, wt, bt = _t(xin, g, True), _t(S.split(W, tp, r, 1), g, True), _t(b, g, True)
        out = TP.row_parallel_linear(xt, wt, bt, g, input_is_parallel=input_is_parallel)
        # the output is replicated: each rank backpropagates the same (whole) loss
        o, grads = _outputs_and_grads(out, G, g, (xt, wt, bt))
        return (o, *grads)

    res = run(tp, devs, fn)
    ref = x @ W.T + b  # SUM of partial products, bias once (the original averaged)
    for o, *_ in res:
        close(o, ref)
    gx = G @ W
    for r, (_, gxr, _, gb) in enumerate(res):
        close(gxr, S.split(gx, tp, r, 2) if input_is_parallel else gx)
        close(gb, G.sum((0, 1)))  # identical on every rank: the whole bias gradient
    close(np.concatenate([gw for _, _, gw, _ in res], 1), np.einsum("bto,bti->oi", G, x))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
def test_parallel_mlp_matches_dense(tp, devs, rng):
    x = rng.standard_normal((2, 3, 4))
    W1, b1 = rng.standard_normal((8, 4)) * 0.5, rng.standard_normal(8) * 0.5
    W2, b2 = rng.standard_normal((4, 8)) * 0.5, rng.standard_normal(4) * 0.5
    G = rng.standard_normal((2, 3, 4))

    def dense(x, W1, b1, W2, b2):
        return _gelu(x @ W1.T + b1) @ W2.T + b2

    def fn(g):
        r = g.rank
        ts = [_t(x, g, True), _t(S.split(W1, tp, r, 0), g, True),
              _t(S.split(b1, tp, r, 0), g, True),
              _t(S.split(W2, tp, r, 1), g, True), _t(b2, g, True)]
        return _outputs_and_grads(TP.parallel_mlp(*ts, g), G, g, ts)

    res = run(tp, devs, fn)
    args = [x, W1, b1, W2, b2]
    close(res[0][0], dense(*args))
    ref = [numeric_grad(lambda *a: float((dense(*a) * G).sum()), args, i) for i in range(5)]
    gs = [gr for _, gr in res]
    close(gs[0][0], ref[0], 2e-3)
    close(np.concatenate([g_[1] for g_ in gs]), ref[1], 2e-3)
    close(np.concatenate([g_[2] for g_ in gs]), ref[2], 2e-3)
    close(np.concatenate([g_[3] for g_ in gs], 1), ref[3], 2e-3)
    for g_ in gs:  # the replicated bias gets the whole gradient on every rank
        close(g_[4], ref[4], 2e-3)


# ------------------------------------------------------------------------ attention
def _np_attention(x, Wqkv, bqkv, Wo, bo, heads):
    b, t, e = x.shape
    d = e // heads
    qkv = (x @ Wqkv.T + bqkv).reshape(b, t, 3, heads, d).transpose(2, 0, 3, 1, 4)
    s = qkv[0] @ qkv[1].transpose(0, 1, 3, 2) / math.sqrt(d)
    s = s + np.triu(np.full((t, t), -1e30), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ qkv[2]).transpose(0, 2, 1, 3).reshape(b, t, e)
    return o @ Wo.T + bo


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
def test_parallel_self_attention_matches_dense(tp, devs, rng):
    heads, e = 4, 8
    x = rng.standard_normal((2, 4, e))
    Wqkv, bqkv = rng.standard_normal((3 * e, e)) * 0.4, rng.standard_normal(3 * e) * 0.1
    Wo, bo = rng.standard_normal((e, e)) * 0.4, rng.standard_normal(e) * 0.1
    G = rng.standard_normal((2, 4, e))

    def fn(g):
        r = g.rank
        ts = [_t(x, g, True),
              _t(S.shard_array(Wqkv, S.QKV, tp, r, num_heads=heads), g, True),
              _t(S.shard_array(bqkv, S.QKV, tp, r, num_heads=heads), g, True),
              _t(S.split(Wo, tp, r, 1), g, True), _t(bo, g, True)]
        return _outputs_and_grads(TP.parallel_self_attention(*ts, heads, g), G, g, ts)

    res = run(tp, devs, fn)
    args = [x, Wqkv, bqkv, Wo, bo]
    dense = lambda *a: float((_np_attention(*a, heads) * G).sum())  # noqa: E731
    for o, _ in res:
        close(o, _np_attention(*args, heads))
    ref = [numeric_grad(dense, args, i) for i in range(5)]
    gs = [gr for _, gr in res]
    for gr in gs:
        close(gr[0], ref[0], 2e-3)
    close(S.unshard_arrays([g_[1] for g_ in gs], S.QKV, num_heads=heads), ref[1], 2e-3)
    close(S.unshard_arrays([g_[2] for g_ in gs], S.QKV, num_heads=heads), ref[2], 2e-3)
    close(np.concatenate([g_[3] for g_ in gs], 1), ref[3], 2e-3)
    for g_ in gs:
        close(g_[4], ref[4], 2e-3)


@pytest.mark.timeout(30)
def test_attention_heads_not_divisible_is_a_clear_error(devs, rng):
    def fn(g):
        x = _t(rng.standard_normal((1, 2, 6)), g)
        w = _t(np.zeros((6, 6)), g)
        with pytest.raises(ShapeError, match="3 attention heads cannot be split across 2"):
            TP.parallel_self_attention(x, w, None, w, None, 3, g)
        with pytest.raises(ShapeError, match="3 attention heads"):
            S.shard_array(np.zeros((18, 6)), S.QKV, 2, g.rank, num_heads=3)
        return True
    assert run(2, devs, fn) == [True, True]


# ------------------------------------------------------------------------ vocab parallel
@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
def test_vocab_parallel_embedding_matches_dense(tp, devs, rng):
    V, E = 8, 3
    ids = rng.integers(0, V, (2, 5))
    W = rng.standard_normal((V, E))
    G = rng.standard_normal((2, 5, E))

    def fn(g):
        wt = _t(S.split(W, tp, g.rank, 0), g, True)
        out = TP.vocab_parallel_embedding(wr.tensor(ids.astype(np.int32), device=g.device), wt, g)
        (out * _t(G, g)).sum().backward()
        return out.numpy(), wt.grad.numpy()

    res = run(tp, devs, fn)
    ref_g = np.zeros_like(W)
    np.add.at(ref_g, ids.reshape(-1), G.reshape(-1, E))
    for o, _ in res:
        close(o, W[ids])
    close(np.concatenate([gw for _, gw in res]), ref_g)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("scale", [3.0, 40.0])
def test_vocab_parallel_cross_entropy_matches_dense(tp, scale, devs, rng):
    """Also with logits whose shards' maxima lie far apart (scale 40: a shard's exponentials
    against another's max underflow), and in one collective per call (latency-bound links)."""
    N, V = 6, 8
    logits = rng.standard_normal((2, 3, V)) * scale
    tgt = rng.integers(0, V, (2, 3))

    def fn(g):
        lt = _t(S.split(logits, tp, g.rank, 2), g, True)
        before = {k: v["calls"] for k, v in g.stats()["by_op"].items()}
        loss = TP.vocab_parallel_cross_entropy(lt, wr.tensor(tgt.astype(np.int32),
                                                             device=g.device), g)
        loss.backward()
        calls = {k: v["calls"] - before.get(k, 0) for k, v in g.stats()["by_op"].items()}
        return loss.item(), lt.grad.numpy(), {k: c for k, c in calls.items() if c}

    res = run(tp, devs, fn)
    x = logits.reshape(N, V)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    ref = (lse - x[np.arange(N), tgt.reshape(-1)]).mean()
    p = np.exp(x - lse[:, None])
    p[np.arange(N), tgt.reshape(-1)] -= 1
    for loss, _, calls in res:
        assert abs(loss - ref) < 1e-4 * max(1.0, abs(ref))
        assert calls == ({} if tp == 1 else {"all_reduce": 1}), calls  # one, on the device
    close(np.concatenate([gl for _, gl, _ in res], 2), (p / N).reshape(2, 3, V))


@pytest.mark.timeout(30)
def test_vocab_not_divisible_is_a_clear_error(devs):
    def fn(g):
        with pytest.raises(ShapeError, match="vocabulary of 7 cannot be split across 2"):
            TP.vocab_range(7, g)
        return True
    assert run(2, devs, fn) == [True, True]


# ------------------------------------------------------------------------ sequence parallel
@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
def test_sequence_parallel_mappings_are_adjoint(tp, devs, rng):
    """gather(seq) forward / reduce-scatter backward and reduce-scatter forward / gather
    backward: a sequence-parallel column->row pair equals the dense two-layer product."""
    x = rng.standard_normal((2, 4, 3))
    W1, W2 = rng.standard_normal((8, 3)), rng.standard_normal((3, 8))
    G = rng.standard_normal((2, 4, 3))

    def fn(g):
        r = g.rank
        xs = _t(S.split(x, tp, r, 1), g, True)  # this rank's part of the sequence
        w1, w2 = _t(S.split(W1, tp, r, 0), g, True), _t(S.split(W2, tp, r, 1), g, True)
        h = TP.column_parallel_linear(xs, w1, None, g, sequence_parallel=True)
        y = TP.row_parallel_linear(h, w2, None, g, sequence_parallel=True)  # my seq part
        (y * _t(S.split(G, tp, r, 1), g)).sum().backward()
        return y.numpy(), xs.grad.numpy(), w1.grad.numpy(), w2.grad.numpy()

    res = run(tp, devs, fn)
    close(np.concatenate([o for o, *_ in res], 1), x @ W1.T @ W2.T)
    close(np.concatenate([gx for _, gx, _, _ in res], 1), G @ W2 @ W1)
    close(np.concatenate([a for *_, a, _ in res]), np.einsum("bto,bti->oi", G @ W2, x))
    close(np.concatenate([a for *_, a in res], 1), np.einsum("bto,bti->oi", G, x @ W1.T))


# ------------------------------------------------------------------------ nn modules
def _module_run(module, x_np, G, dev, ids=False):
    """Output, input gradient (None for ids) and parameter gradients of ``module`` on ``dev``
    with upstream gradient ``G``."""
    x = wr.tensor(x_np.astype(np.int32 if ids else np.float32), device=dev,
                  requires_grad=not ids)
    out = module(x)
    store = wr.autograd.backward_with_grad(out, wr.tensor(G.astype(np.float32), device=dev))
    grads = {n: store.get(p).numpy() for n, p in module.named_parameters()
             if store.get(p) is not None}
    return out.numpy(), (None if ids else store.get(x).numpy()), grads


def _tp_run(tp, devs, build, x_np, G, ids=False):
    def fn(g):
        layer = build(g)
        out, gx, grads = _module_run(layer, x_np, G, g.device, ids)
        return out, gx, TP.gather_state_dict(layer), grads, getattr(layer, "tp_modes", None)
    return run(tp, devs, fn)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("mode", ["column", "row"])
def test_shard_linear_from_nn_linear_and_gather_back(tp, mode, devs, rng):
    from wgrumus import nn
    dev = devs[0]
    dense = nn.Linear(8, 12, device=dev, seed=3)  # not square
    x, G = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 12))
    out, gx, gp = _module_run(dense, x, G, dev)
    sd = {k: v.numpy() for k, v in dense.state_dict().items()}

    def build(g):
        d = nn.Linear(8, 12, device=g.device, seed=3)  # same seed, same weights on every rank
        kw = {"gather_output": True} if mode == "column" else {"input_is_parallel": False}
        return TP.shard_linear(d, g, mode, **kw)

    res = _tp_run(tp, devs, build, x, G)
    for o, gxr, full, _, _ in res:
        close(o, out)
        close(gxr, gx)
        assert set(full) == set(sd)
        for k in sd:  # gathered back into the dense checkpoint, exactly
            np.testing.assert_array_equal(full[k], sd[k])
    w = [r[3]["weight"] for r in res]
    close(np.concatenate(w, 0 if mode == "column" else 1), gp["weight"])
    b = [r[3]["bias"] for r in res]
    close(np.concatenate(b) if mode == "column" else b[0], gp["bias"])
    loaded = nn.Linear(8, 12, device=dev, seed=99)
    loaded.load_state_dict(res[0][2])  # a TP checkpoint loads on one device
    close(loaded(wr.tensor(x.astype(np.float32), device=dev)).numpy(), out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
def test_parallel_attention_and_mlp_modules_match_nn(tp, devs, rng):
    from wgrumus import nn
    dev = devs[0]
    x, G = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    mha = nn.MultiheadAttention(8, 4, causal=True, device=dev, seed=5)
    with wr.no_grad():  # non-zero biases so their sharding is exercised
        mha.in_proj_bias += wr.tensor(rng.standard_normal(24).astype(np.float32), device=dev)
    out, gx, gp = _module_run(mha, x, G, dev)
    sd = {k: v.numpy() for k, v in mha.state_dict().items()}
    res = _tp_run(tp, devs, lambda g: TP.ParallelSelfAttention.from_dense(
        _copy_module(nn.MultiheadAttention(8, 4, causal=True, device=g.device), sd), g), x, G)
    for o, gxr, _, _, _ in res:
        close(o, out)
        close(gxr, gx)
    full = res[0][2]
    close(full["qkv_weight"], sd["in_proj_weight"], 0)
    close(full["qkv_bias"], sd["in_proj_bias"], 0)
    close(full["proj_weight"], sd["out_proj.weight"], 0)
    grads = [r[3] for r in res]
    close(S.unshard_arrays([g_["qkv_weight"] for g_ in grads], S.QKV, num_heads=4),
          gp["in_proj_weight"])
    close(np.concatenate([g_["proj_weight"] for g_ in grads], 1), gp["out_proj.weight"])

    mlp = nn.MLP(8, device=dev, seed=6)
    out, gx, gp = _module_run(mlp, x, G, dev)
    sd = {k: v.numpy() for k, v in mlp.state_dict().items()}
    res = _tp_run(tp, devs, lambda g: TP.ParallelMLP.from_dense(
        _copy_module(nn.MLP(8, device=g.device), sd), g), x, G)
    for o, gxr, full, _, _ in res:
        close(o, out)
        close(gxr, gx)
        close(full["fc1.weight"], sd["fc.weight"], 0)
        close(full["fc2.weight"], sd["proj.weight"], 0)
    close(np.concatenate([r[3]["fc1.weight"] for r in res]), gp["fc.weight"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TPS)
def test_vocab_parallel_embedding_module_matches_nn(tp, devs, rng):
    from wgrumus import nn
    dev = devs[0]
    emb = nn.Embedding(8, 4, device=dev, seed=7)
    ids, G = rng.integers(0, 8, (2, 5)), rng.standard_normal((2, 5, 4))
    out, _, gp = _module_run(emb, ids, G, dev, ids=True)
    sd = {k: v.numpy() for k, v in emb.state_dict().items()}
    res = _tp_run(tp, devs, lambda g: TP.VocabParallelEmbedding.from_dense(
        _copy_module(nn.Embedding(8, 4, device=g.device), sd), g), ids, G, ids=True)
    for o, _, full, _, _ in res:
        close(o, out)
        np.testing.assert_array_equal(full["weight"], sd["weight"])
    close(np.concatenate([r[3]["weight"] for r in res]), gp["weight"])


def _copy_module(m, sd):
    m.load_state_dict(sd)
    return m
