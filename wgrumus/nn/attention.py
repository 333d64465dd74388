"""Multi-head self-attention and the pre-LN transformer block."""
from __future__ import annotations

import math

from ..kernels.map import run_map
from ..ops.attention import causal_self_attention, flash_attention, head_attention, prefer_fused
from ..ops.softmax import softmax as softmax_op
from ..runtime.errors import ShapeError
from ..tensor import Tensor, float32
from . import functional as F
from . import init
from .layers import GELU, Dropout, LayerNorm, Linear, _empty, _sub
from .module import Module, Parameter

_NEG_INF = "bitcast<f32>(0xff800000u)"


def causal_mask(T: int, device) -> Tensor:
    """[T, T] additive mask: 0 on and below the diagonal, -inf above (built on the device)."""
    m = Tensor.empty((T, T), device)
    return run_map(f"select(0.0, {_NEG_INF}, (i % u32(T)) > (i / u32(T)))", m, [], {"T": T})


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p: float = 0.0,
                                 training: bool = False, is_causal: bool = False):
    """softmax(q k^T / sqrt(d) + mask) v over [..., T, d]: the fused kernel where the scores
    would be large and no mask or dropout applies, else ``unfused_attention``."""
    if is_causal and mask is not None:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal=True, not "
                         "both (PyTorch refuses the pair too); fold the causal part into the mask")
    Tq, Tk = q.shape[-2], k.shape[-2]
    if (mask is None and (dropout_p == 0.0 or not training) and (not is_causal or Tq == Tk)
            and prefer_fused(q.device, math.prod(q.shape[:-2]), q.shape[-1], Tq, Tk)):
        return flash_attention(q, k, v, causal=is_causal)
    return unfused_attention(q, k, v, mask, dropout_p, training, is_causal)


def unfused_attention(q, k, v, mask=None, dropout_p: float = 0.0, training: bool = False,
                      is_causal: bool = False):
    """Attention through the [..., Tq, Tk] scores (masks and dropout need it; the fused
    kernel's reference); f32 [B, H, T, d] without either take one node (head_attention)."""
    if (mask is None and (dropout_p == 0.0 or not training) and q.ndim == 4
            and q.shape[:2] == k.shape[:2] == v.shape[:2] and q.numel() and k.numel()
            and q.dtype == k.dtype == v.dtype == float32):
        return head_attention(q, k, v, is_causal)  # (one node; matmuls skip masked parts)
    scale = 1.0 / math.sqrt(q.shape[-1])
    att = q @ k.transpose(-1, -2)
    if mask is not None:
        att = att * scale + mask
        att = softmax_op(att, -1, causal=is_causal)
    else:
        att = softmax_op(att, -1, scale=scale, causal=is_causal)
    att = F.dropout(att, dropout_p, training)
    return att @ v


class MultiheadAttention(Module):
    """Self-attention in PyTorch's parameter layout, batch_first; returns no attention weights."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 causal: bool = False, batch_first: bool = True, device=None, seed=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if not batch_first:
            raise ValueError("only batch_first=True ([B, T, E] inputs) is supported")
        self.embed_dim, self.num_heads, self.dropout, self.causal = (embed_dim, num_heads,
                                                                      dropout, causal)
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = Parameter(init.xavier_uniform_(_empty((3 * embed_dim, embed_dim),
                                                                    device), seed=_sub(seed, 0)))
        if bias:
            self.in_proj_bias = Parameter(init.zeros_(_empty((3 * embed_dim,), device)))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, seed=_sub(seed, 1))
        if bias:
            init.zeros_(self.out_proj.bias)

    def _heads(self, x):
        B, T, _ = x.shape
        return x.reshape(B, T, self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, query, key=None, value=None, attn_mask=None, is_causal=None,
                residual=None):
        """``residual`` (extension): added to the output inside the output projection."""
        if query.ndim != 3 or query.shape[-1] != self.embed_dim:
            raise ShapeError(f"MultiheadAttention expects [B, T, {self.embed_dim}], "
                             f"got {query.shape}")
        B, T, E = query.shape
        causal = self.causal if is_causal is None else is_causal
        op = self.out_proj
        if (key is None and value is None and attn_mask is None
                and (self.dropout == 0.0 or not self.training)):
            # one packed projection and one fused attention node (ops/attention.py)
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            y = causal_self_attention(qkv, self.num_heads, causal)
            return F.linear(y, op.weight, op.bias, residual=residual)
        key = query if key is None else key
        value = key if value is None else value
        w = self.in_proj_weight.split(E, axis=0)
        b = self.in_proj_bias.split(E, axis=0) if self.in_proj_bias is not None else [None] * 3
        q, k, v = (F.linear(t, wi, bi) for t, wi, bi in zip((query, key, value), w, b))
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if causal and k.shape[2] != T:
            raise ShapeError("a causal mask needs key and query of the same length")
        y = scaled_dot_product_attention(q, k, v, attn_mask, self.dropout, self.training,
                                         is_causal=causal)
        y = y.permute(0, 2, 1, 3).reshape(B, T, E)
        return F.linear(y, op.weight, op.bias, residual=residual)

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"


class MLP(Module):
    """Linear(E, 4E) -> GELU(tanh) -> Linear(4E, E) -> Dropout (the GPT-2 feed-forward)."""

    def __init__(self, n_embd: int, dropout: float = 0.0, device=None, seed=None):
        super().__init__()
        self.fc = Linear(n_embd, 4 * n_embd, device=device, seed=_sub(seed, 0))
        self.act = GELU(approximate="tanh")
        self.proj = Linear(4 * n_embd, n_embd, device=device, seed=_sub(seed, 1))
        self.drop = Dropout(dropout)

    def forward(self, x, residual=None):
        """``residual`` (extension): added inside proj's bias kernel (without active dropout)."""
        act = self.act.approximate if type(self.act) is GELU else None
        h = (F.linear(x, self.fc.weight, self.fc.bias, "gelu" if act == "none" else "gelu_tanh")
             if act else self.act(self.fc(x)))  # fc, bias and GELU in one fused op
        if self.drop.p == 0.0 or not self.training:
            return F.linear(h, self.proj.weight, self.proj.bias, residual=residual)
        y = self.drop(self.proj(h))
        return y if residual is None else residual + y


class TransformerBlock(Module):
    """Pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, causal: bool = True,
                 device=None, seed=None):
        super().__init__()
        self.ln1 = LayerNorm(n_embd, device=device)
        self.attn = MultiheadAttention(n_embd, n_head, dropout=dropout, causal=causal,
                                       device=device, seed=_sub(seed, 0))
        self.ln2 = LayerNorm(n_embd, device=device)
        self.mlp = MLP(n_embd, dropout, device=device, seed=_sub(seed, 1))
        self.drop = Dropout(dropout)

    def forward(self, x):
        if self.drop.p and self.training:  # residual dropout sits between branch and add
            x = x + self.drop(self.attn(self.ln1(x)))
        else:
            x = self.attn(self.ln1(x), residual=x)  # the add rides in the projection's kernel
        return self.mlp(self.ln2(x), residual=x)
