"""Tensor-parallel math on shards as functions of (input, weight shard, bias, group), testable
without modules; weights are [out, in] as PyTorch's, and a group of None or one rank is dense."""
from __future__ import annotations

from ...autograd.tape import no_grad, record
from ...ops.attention import causal_self_attention
from ...ops.creation import zeros
from ...ops.elementwise import map_op
from ...ops.linear import linear
from ...ops.shape import cat, reshape
from ...runtime.errors import ShapeError
from ...tensor import Tensor, int32
from .mappings import (
    gather_from_sequence_parallel_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tp_region,
)
from .overlap import chunked_row_parallel, input_grad_all_reduce, tp_chunks
from .shard import check_heads


def world_rank(group) -> tuple[int, int]:
    """(TP world size, this rank's index) of ``group``; None is one rank (dense)."""
    return (1, 0) if group is None else (group.world_size, group.rank)


def column_parallel_linear(x, weight, bias, group, gather_output=False,
                           sequence_parallel=False, seq_axis=1, activation=None):
    """Y_r = act(X @ W_r.T + b_r) with W split by output features; ``gather_output``
    all-gathers the output features on every rank. X's gradient is summed over the TP ranks
    inside the linear's backward (copy_to_tp_region's, fused): its all-reduce starts as soon as
    dX exists and runs while the weight gradient is computed."""
    if sequence_parallel:
        x = gather_from_sequence_parallel_region(x, group, seq_axis)
        y = linear(x, weight, bias, activation)
    elif world_rank(group)[0] == 1:
        y = linear(x, weight, bias, activation)
    else:
        y = linear(x, weight, bias, activation, input_grad=input_grad_all_reduce(group))
    return gather_from_tp_region(y, group) if gather_output else y


def row_parallel_linear(x, weight, bias, group, input_is_parallel=True,
                        sequence_parallel=False, seq_axis=1):
    """Y = sum_r X_r @ W_r.T + b with W split by input features: the partial products are
    SUMMED over the TP ranks (the original averaged) and the bias is added once, after the
    reduction, so it is identical on every rank and its gradient is the full one. With
    ``TUNING.tp_chunks`` > 1 the all-reduce goes in token chunks, each overlapping the next
    chunk's matmul."""
    if not input_is_parallel:
        x = scatter_to_tp_region(x, group)
    if sequence_parallel:
        y = reduce_scatter_to_sequence_parallel_region(linear(x, weight), group, seq_axis)
    elif world_rank(group)[0] > 1 and (chunks := tp_chunks()) > 1:
        y = chunked_row_parallel(x, weight, group, chunks)
    else:
        y = reduce_from_tp_region(linear(x, weight), group)
    return y if bias is None else y + bias


def parallel_self_attention(x, qkv_weight, qkv_bias, proj_weight, proj_bias, num_heads,
                            group, causal=True):
    """Self-attention of replicated x [B, T, E] with heads split across TP ranks: qkv_weight is
    this rank's (q, k, v) rows of its heads (``shard_array(w, "qkv", ...)``), proj_weight
    [E, E / tp] row-parallel."""
    h = check_heads(num_heads, world_rank(group)[0])
    qkv = column_parallel_linear(x, qkv_weight, qkv_bias, group)  # [B, T, 3 * E / tp]
    o = causal_self_attention(qkv, h, causal)  # nn's attention node, on my heads
    return row_parallel_linear(o, proj_weight, proj_bias, group)


def parallel_mlp(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, group, activation="gelu"):
    """fc1 column-parallel (no gather) with the activation fused in -> fc2 row-parallel.
    activation: "gelu" (exact erf), "gelu_tanh" (GPT-2, nn.MLP's) or "relu"."""
    h = column_parallel_linear(x, fc1_weight, fc1_bias, group, activation=activation)
    return row_parallel_linear(h, fc2_weight, fc2_bias, group)


def _one_hot_shard(ids: Tensor, start: int, size: int) -> Tensor:
    """[N, size] float one-hot of ids - start (rows whose id falls outside are all zero)."""
    ids = ids if ids.dtype == int32 else ids.astype(int32)
    col = reshape(ids, (ids.numel(), 1))
    return map_op("select(0.0, 1.0, i32(i % u32(size)) + start == a)", [col],
                  shape=(ids.numel(), size), scalars={"size": size, "start": start})


def vocab_range(vocab: int, group) -> tuple[int, int]:
    """[start, end) of the vocabulary rows this TP rank holds."""
    tp, r = world_rank(group)
    if vocab % tp:
        raise ShapeError(f"vocabulary of {vocab} cannot be split across {tp} tensor-parallel "
                         f"ranks; pad the vocabulary to a multiple of {tp}")
    k = vocab // tp
    return r * k, (r + 1) * k


def vocab_parallel_embedding(ids: Tensor, weight: Tensor, group) -> Tensor:
    """Embedding split by vocabulary: a one-hot matmul on each shard, summed over TP."""
    vs = weight.shape[0]
    start = world_rank(group)[1] * vs
    oh = _one_hot_shard(ids, start, vs)
    out = reduce_from_tp_region(oh @ weight, group)
    return reshape(out, tuple(ids.shape) + (weight.shape[1],))


def _gather_by_sum(x: Tensor, group) -> Tensor:
    """Every rank's ``x`` [1, ...] stacked [tp, ...] in rank order, as an all-reduce SUM of
    ``x`` in this rank's row and zeros elsewhere (exact): the all-reduce stays on the device
    path of every backend (the processes backend's all-gather goes through numpy)."""
    tp, r = world_rank(group)
    z = zeros((1,) + tuple(x.shape[1:]), device=x.device)
    return group.all_reduce(cat([x if q == r else z for q in range(tp)], 0), "sum")


def vocab_parallel_cross_entropy(logits: Tensor, targets, group) -> Tensor:
    """Mean cross-entropy of logits split by vocabulary ([..., V / tp] per rank): only [N]-sized
    vectors cross ranks, never the logits, in ONE collective (each rank's row max, sum of
    exponentials and target logit, combined as a log-sum-exp of shards: a latency-bound
    transfer between adapters costs per call, not per byte); backward (softmax - onehot) / N on
    each shard."""
    vs = logits.shape[-1]
    n = logits.numel() // vs
    if targets.numel() != n:
        raise ShapeError(f"vocab_parallel_cross_entropy: {n} rows of logits but {targets.numel()} "
                         f"targets; pass one target id per row of logits")
    tp, r = world_rank(group)
    start = r * vs
    x2 = reshape(logits, (n, vs))
    with no_grad():
        oh = _one_hot_shard(targets, start, vs)
        m = x2.max(axis=1, keepdims=True)
        e = (x2 - m).exp()
        s = e.sum(axis=1, keepdims=True)
        tl = (x2 * oh).sum(axis=1, keepdims=True)
        if tp > 1:  # every rank's (max, sum, target logit): [tp, 3, n]
            parts = _gather_by_sum(cat([reshape(v, (1, 1, n)) for v in (m, s, tl)], 1), group)
            ms, ss = parts[:, 0], parts[:, 1]
            big = ms.max(axis=0, keepdims=True)  # [1, n]: the global row max
            total = reshape((ss * (ms - big).exp()).sum(axis=0), (n, 1))
            tl = reshape(parts[:, 2].sum(axis=0), (n, 1))
            big = reshape(big, (n, 1))
            e = e * (m - big).exp()  # this shard's exponentials against the global max
            m, s = big, total
        loss = (s.log() + m - tl).mean()

    def bw(g):
        p = e / s
        gl = map_op("(a - b) * c * inv_n", [p, oh, reshape(g, (1, 1))],
                    scalars={"inv_n": 1.0 / n})
        return (reshape(gl, logits.shape),)
    record("vocab_parallel_cross_entropy", loss, [logits], bw, saved=[e, s, oh])
    return loss
