"""Tensor-parallel layers holding only this rank's shard (split as their ``tp_modes`` say),
built ``from_dense`` so a TP model starts from the dense model's weights."""
from __future__ import annotations

import numpy as np

from ... import nn
from ...tensor import tensor
from . import functional as F
from .shard import COLUMN, QKV, REPLICATE, ROW, VOCAB, shard_array, unshard_arrays


def _device(group, device):
    if device is not None:
        return device
    if group is not None and group.device is not None:
        return group.device
    from ...runtime import get_device
    return get_device(None)


def _param(arr, device):
    return nn.Parameter(tensor(np.asarray(arr, np.float32), device=device))


def _dense_init(out_f, in_f, bias, seed):
    """PyTorch's Linear init, whole on every rank from ``seed``: shards of one dense layer."""
    rs = np.random.default_rng(seed)
    k = 1.0 / np.sqrt(in_f)
    w = rs.uniform(-k, k, (out_f, in_f)).astype(np.float32)
    b = rs.uniform(-k, k, out_f).astype(np.float32) if bias else None
    return w, b


class _TPModule(nn.Module):
    tp_modes: dict = {}
    num_heads = None

    def dense_state_dict(self) -> dict:
        """This layer's dense parameters (numpy), gathered from every TP rank."""
        out = {}
        for name, p in self.named_parameters():
            mode = self.tp_modes.get(name, REPLICATE)
            whole = mode == REPLICATE or self.group is None or self.group.world_size == 1
            out[name] = p.numpy() if whole else unshard_arrays(
                self.group.all_gather_object(p.numpy()), mode, is_bias=name.endswith("bias"),
                num_heads=self.num_heads)
        return out


class _ParallelLinear(_TPModule):
    """Column and Row: the dense weight (given, or seeded alike) cut by ``tp_modes``."""

    def __init__(self, in_features, out_features, group, bias, sequence_parallel, weight,
                 bias_value, seed, device):
        super().__init__()
        world, rank = F.world_rank(group)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        dev = _device(group, device)
        if weight is None:
            weight, bias_value = _dense_init(out_features, in_features, bias, seed)
        self.weight = _param(shard_array(weight, self.tp_modes["weight"], world, rank), dev)
        self.bias = (_param(shard_array(bias_value, self.tp_modes["bias"], world, rank), dev)
                     if bias and bias_value is not None else None)

    @classmethod
    def from_dense(cls, linear, group, **kw):
        return cls(linear.in_features, linear.out_features, group, linear.bias is not None,
                   weight=linear.weight.numpy(),
                   bias_value=None if linear.bias is None else linear.bias.numpy(), **kw)


class ColumnParallelLinear(_ParallelLinear):
    """Y = X @ W.T + b with W [out, in] split by output features."""
    tp_modes = {"weight": COLUMN, "bias": COLUMN}

    def __init__(self, in_features, out_features, group, bias=True, gather_output=False,
                 sequence_parallel=False, weight=None, bias_value=None, seed=0, device=None):
        super().__init__(in_features, out_features, group, bias, sequence_parallel, weight,
                         bias_value, seed, device)
        self.gather_output = gather_output

    def forward(self, x, activation=None):
        return F.column_parallel_linear(x, self.weight, self.bias, self.group,
                                        self.gather_output, self.sequence_parallel,
                                        activation=activation)


class RowParallelLinear(_ParallelLinear):
    """Y = sum_r X_r @ W_r.T + b with W split by input features (bias whole, added once)."""
    tp_modes = {"weight": ROW, "bias": REPLICATE}

    def __init__(self, in_features, out_features, group, bias=True, input_is_parallel=True,
                 sequence_parallel=False, weight=None, bias_value=None, seed=0, device=None):
        super().__init__(in_features, out_features, group, bias, sequence_parallel, weight,
                         bias_value, seed, device)
        self.input_is_parallel = input_is_parallel

    def forward(self, x):
        return F.row_parallel_linear(x, self.weight, self.bias, self.group,
                                     self.input_is_parallel, self.sequence_parallel)


class ParallelMLP(nn.Module):
    """fc1 (column) -> GELU on the shard -> fc2 (row): one all-reduce forward, one backward."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear,
                 activation: str = "gelu_tanh"):
        super().__init__()
        if activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"activation must be 'gelu', 'gelu_tanh' or 'relu', "
                             f"got {activation!r}")
        self.fc1, self.fc2, self.activation = fc1, fc2, activation

    @classmethod
    def from_dense(cls, mlp, group, activation="gelu_tanh"):
        """From an ``nn.MLP`` (fc, proj; GELU tanh) or any module with fc1/fc2 Linears."""
        fc1 = getattr(mlp, "fc", None) or mlp.fc1
        fc2 = getattr(mlp, "proj", None) or mlp.fc2
        return cls(ColumnParallelLinear.from_dense(fc1, group),
                   RowParallelLinear.from_dense(fc2, group), activation)

    def forward(self, x, residual=None):
        y = self.fc2(self.fc1(x, self.activation))
        return y if residual is None else y + residual


class ParallelSelfAttention(_TPModule):
    """Self-attention with heads split across TP ranks (QKV by heads, output row-parallel)."""
    tp_modes = {"qkv_weight": QKV, "qkv_bias": QKV, "proj_weight": ROW, "proj_bias": REPLICATE}

    def __init__(self, embed_dim, num_heads, group, qkv_weight, qkv_bias, proj_weight, proj_bias,
                 causal=True, device=None):
        super().__init__()
        world, rank = F.world_rank(group)
        self.group, self.embed_dim, self.num_heads, self.causal = group, embed_dim, num_heads, \
            causal
        dev = _device(group, device)
        self.qkv_weight = _param(shard_array(qkv_weight, QKV, world, rank, num_heads=num_heads),
                                 dev)
        self.qkv_bias = None if qkv_bias is None else _param(
            shard_array(qkv_bias, QKV, world, rank, num_heads=num_heads), dev)
        self.proj_weight = _param(shard_array(proj_weight, ROW, world, rank), dev)
        self.proj_bias = None if proj_bias is None else _param(proj_bias, dev)

    @classmethod
    def from_dense(cls, mha, group, causal=True):
        """From an ``nn.MultiheadAttention`` (in_proj [3E, E] + out_proj, PyTorch's layout)."""
        def arr(p):
            return None if p is None else p.numpy()
        return cls(mha.embed_dim, mha.num_heads, group, mha.in_proj_weight.numpy(),
                   arr(mha.in_proj_bias), mha.out_proj.weight.numpy(), arr(mha.out_proj.bias),
                   causal)

    def forward(self, x, residual=None):
        y = F.parallel_self_attention(x, self.qkv_weight, self.qkv_bias, self.proj_weight,
                                      self.proj_bias, self.num_heads, self.group, self.causal)
        return y if residual is None else y + residual


class VocabParallelEmbedding(_TPModule):
    """Embedding [V, E] split by vocabulary rows; lookups summed over TP."""
    tp_modes = {"weight": VOCAB}

    def __init__(self, num_embeddings, embedding_dim, group, weight=None, seed=0, device=None):
        super().__init__()
        world, rank = F.world_rank(group)
        F.vocab_range(num_embeddings, group)  # clear error when V % tp != 0
        self.group, self.num_embeddings, self.embedding_dim = group, num_embeddings, \
            embedding_dim
        if weight is None:
            weight = np.random.default_rng(seed).standard_normal(
                (num_embeddings, embedding_dim)).astype(np.float32)
        self.weight = _param(shard_array(weight, VOCAB, world, rank), _device(group, device))

    @classmethod
    def from_dense(cls, emb, group, **kw):
        w = emb.weight.numpy()
        return cls(w.shape[0], w.shape[1], group, weight=w, **kw)

    def forward(self, ids):
        return F.vocab_parallel_embedding(ids, self.weight, self.group)


def shard_linear(dense, group, mode: str, **kw):
    """A TP layer holding this rank's shard of the dense ``nn.Linear``: mode 'column' or 'row'."""
    if mode == COLUMN:
        return ColumnParallelLinear.from_dense(dense, group, **kw)
    if mode == ROW:
        return RowParallelLinear.from_dense(dense, group, **kw)
    raise ValueError(f"shard_linear mode must be 'column' or 'row', got {mode!r}")


def shard_gpt(model, group):
    """``model``, an ``nn.GPT`` (or a pipeline rank's pieces of it), turned in place into this
    rank's TP shards; its forward is unchanged."""
    if model.wte is not None:
        model.wte = VocabParallelEmbedding.from_dense(model.wte, group)
    for blk in model.blocks:
        blk.attn = ParallelSelfAttention.from_dense(blk.attn, group, causal=blk.attn.causal)
        blk.mlp = ParallelMLP.from_dense(blk.mlp, group)
    if model.lm_head is not None:
        model.lm_head = ColumnParallelLinear.from_dense(model.lm_head, group)
    return model


_NN_NAMES = {"attn.qkv_weight": "attn.in_proj_weight", "attn.qkv_bias": "attn.in_proj_bias",
             "attn.proj_weight": "attn.out_proj.weight", "attn.proj_bias": "attn.out_proj.bias",
             "mlp.fc1.": "mlp.fc.", "mlp.fc2.": "mlp.proj."}


def dense_name(name: str) -> str:
    """The dense ``nn.GPT`` name of a ``shard_gpt`` model's parameter."""
    for tp, nn_ in _NN_NAMES.items():
        if tp in name:
            return name.replace(tp, nn_)
    return name


def gather_state_dict(module) -> dict:
    """Dense state dict (numpy) of a module with TP layers (every TP rank calls it)."""
    out = {}
    for name, sub in module.named_modules():
        if isinstance(sub, _TPModule):
            prefix = name + "." if name else ""
            out.update({prefix + k: v for k, v in sub.dense_state_dict().items()})
    for name, p in module.named_parameters():
        out.setdefault(name, p.numpy())
    return out
