"""A small GPT (decoder-only causal LM): token + position embeddings, pre-LN blocks, final
LayerNorm and an LM head. Weights use GPT-2's initialisation (N(0, 0.02), zero biases, residual
projections scaled by 1/sqrt(2 * n_layer)), which trains much faster than N(0, 1) embeddings."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..autograd.tape import no_grad
from ..ops.creation import arange, rand
from ..ops.reduce import argmax
from ..ops.shape import cat
from ..runtime.errors import ShapeError
from ..tensor import Tensor, int32, tensor
from ..utils.checkpoint import checkpoint
from . import init
from .attention import TransformerBlock
from .layers import Dropout, Embedding, LayerNorm, Linear, ModuleList, _sub
from .module import Module


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a ``GPT`` (same names); sequences are ``block_size`` tokens long."""
    vocab_size: int = 32
    block_size: int = 8
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 16

    def build(self, seed: int = 0, device=None) -> GPT:
        """The GPT of these sizes with the weights drawn from ``seed``."""
        return GPT(self.vocab_size, self.block_size, n_layer=self.n_layer, n_head=self.n_head,
                   n_embd=self.n_embd, device=device, seed=seed)


class GPT(Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int = 2, n_head: int = 2,
                 n_embd: int = 64, dropout: float = 0.0, device=None, seed=None,
                 checkpoint: bool = False):
        super().__init__()
        self.checkpoint = checkpoint  # recompute each block's activations in backward
        self.vocab_size, self.block_size = vocab_size, block_size
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.wte = Embedding(vocab_size, n_embd, device=device)
        self.wpe = Embedding(block_size, n_embd, device=device)
        self.drop = Dropout(dropout)
        self.blocks = ModuleList(TransformerBlock(n_embd, n_head, dropout, causal=True,
                                                   device=device) for _ in range(n_layer))
        self.ln_f = LayerNorm(n_embd, device=device)
        self.lm_head = Linear(n_embd, vocab_size, bias=False, device=device)
        self._init_weights(seed)

    def _init_weights(self, seed):
        k = 0
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                init.zeros_(p)
            elif name.startswith("ln") or ".ln" in name:
                continue  # LayerNorm weights stay 1
            else:
                std = 0.02
                if name.endswith("out_proj.weight") or name.endswith("mlp.proj.weight"):
                    std = 0.02 / math.sqrt(2 * self.n_layer)
                init.normal_(p, 0.0, std, seed=_sub(seed, k))
                k += 1

    def forward(self, idx):
        x = self.embed(idx)
        for blk in self.blocks:
            x = checkpoint(blk, x) if self.checkpoint else blk(x)
        return self.lm_head(self.ln_f(x))

    def embed(self, idx):
        """Token ids [B, T] -> dropout(token + position embeddings) [B, T, n_embd]."""
        if not isinstance(idx, Tensor):
            idx = tensor(np.asarray(idx, np.int32), device=self.wte.weight.device)
        if idx.ndim != 2:
            raise ShapeError(f"GPT expects token ids [B, T], got shape {idx.shape}")
        B, T = idx.shape
        if T > self.block_size:
            raise ShapeError(f"sequence length {T} exceeds block_size {self.block_size}; crop "
                             f"the context to the last {self.block_size} tokens")
        return self.drop(self.wte(idx) + self.wpe(self._positions(T, idx.device)))

    def _positions(self, T: int, device) -> Tensor:
        """0..T-1 on ``device``, made once per (T, device): not rebuilt every step."""
        cache = self.__dict__.setdefault("_pos_cache", {})
        pos = cache.get((T, device))
        if pos is None:
            pos = cache[(T, device)] = arange(T, device=device)
        return pos

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, seed=None):
        """``idx`` [B, T] with ``max_new_tokens`` sampled tokens appended: Gumbel-max on the
        device (seeded); temperature 0 is greedy."""
        if not isinstance(idx, Tensor):
            idx = tensor(np.asarray(idx, np.int32), device=self.wte.weight.device)
        if idx.dtype != int32:
            idx = idx.int()
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for step in range(max_new_tokens):
                    ctx = idx if idx.shape[1] <= self.block_size else \
                        idx[:, idx.shape[1] - self.block_size:]
                    logits = self(ctx)[:, -1, :]
                    if temperature > 0:
                        u = rand(logits.shape, device=logits.device, seed=_sub(seed, step))
                        logits = logits * (1.0 / temperature) - (-u.log()).log()
                    nxt = argmax(logits, axis=-1).reshape(idx.shape[0], 1)
                    idx = cat([idx, nxt], axis=1)
        finally:
            self.train(was_training)
        return idx

    def extra_repr(self):
        return (f"vocab_size={self.vocab_size}, block_size={self.block_size}, "
                f"n_layer={self.n_layer}, n_head={self.n_head}, n_embd={self.n_embd}")
