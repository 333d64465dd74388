"""Cut a model into p contiguous pipeline stages minimising the largest stage's parameter count
(a pipeline runs at its slowest stage's pace, and parameters proxy work)."""
from __future__ import annotations

from collections.abc import Sequence

from ...nn import Module, Sequential
from .stage import PipelineStage, moved_to, num_parameters, parameters_of


class StageChain:
    """The model's own consecutive layers applied in order, for stages with a layer that is no
    ``nn.Module`` (else ``nn.Sequential``)."""

    def __init__(self, layers: Sequence):
        self.layers = list(layers)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def to(self, device):
        self.layers = [moved_to(layer, device) for layer in self.layers]
        return self

    def parameters(self):
        seen = set()
        for layer in self.layers:
            for p in parameters_of(layer):
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self):
        return "StageChain(" + ", ".join(type(l).__name__ for l in self.layers) + ")"


def balanced_partition(weights: Sequence[int], p: int) -> list[int]:
    """The ``p + 1`` cuts ``[0, ..., len(weights)]`` of ``p`` non-empty contiguous parts
    minimising the largest part sum (exact dynamic programming, so deterministic)."""
    n = len(weights)
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"number of stages must be an int >= 1, got {p!r}")
    if n < p:
        raise ValueError(f"cannot cut {n} layer(s) into {p} stages: every stage needs at least "
                         f"one layer; use at most {n} stages or a deeper model")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    INF = float("inf")
    # best[j][i]: smallest max-part-sum cutting the first i weights into j parts
    best = [[INF] * (n + 1) for _ in range(p + 1)]
    arg = [[0] * (n + 1) for _ in range(p + 1)]
    best[0][0] = 0
    for j in range(1, p + 1):
        for i in range(j, n - (p - j) + 1):
            for c in range(j - 1, i):
                cost = max(best[j - 1][c], prefix[i] - prefix[c])
                if cost < best[j][i]:
                    best[j][i], arg[j][i] = cost, c
    cuts = [n]
    for j in range(p, 0, -1):
        cuts.append(arg[j][cuts[-1]])
    return cuts[::-1]


def _layers_of(model) -> list:
    if isinstance(model, (list, tuple)):
        return list(model)
    try:
        return list(iter(model))
    except TypeError:
        raise TypeError(f"split_sequential needs a Sequential (iterable of layers) or a list of "
                        f"layers, got {type(model).__name__}") from None


def _chain(layers: list):
    """``nn.Sequential`` when every layer is a Module (state_dict, train/eval), else a chain."""
    if all(isinstance(l, Module) for l in layers):
        return Sequential(*layers)
    return StageChain(layers)


def split_sequential(model, p: int, devices=None) -> list:
    """``p`` stages of a Sequential balanced by parameter count (PipelineStages on ``devices``)."""
    layers = _layers_of(model)
    n = len(layers)
    # Primary: parameter count; each layer also weighs 1/(n+1) of a parameter so that
    # parameter-free layers (activations) are spread rather than piled up.
    weights = [num_parameters(l) * (n + 1) + 1 for l in layers]
    try:
        cuts = balanced_partition(weights, p)
    except ValueError as e:
        raise ValueError(f"split_sequential: {e}") from None
    stages = [_chain(layers[a:b]) for a, b in zip(cuts, cuts[1:])]
    return _place(stages, devices)


def _place(stages: list, devices):
    if devices is None:
        return stages
    devices = list(devices)
    if len(devices) != len(stages):
        raise ValueError(f"got {len(devices)} device(s) for {len(stages)} stages; pass one "
                         f"device per stage")
    return [PipelineStage(st, d) for st, d in zip(stages, devices)]


class GPTEmbedding(Module):
    """An ``nn.GPT``'s ``embed`` as a module holding (and moving) its embeddings."""

    def __init__(self, gpt):
        super().__init__()
        self.wte, self.wpe, self.drop, self._embed = gpt.wte, gpt.wpe, gpt.drop, gpt.embed

    def forward(self, idx):
        return self._embed(idx)


def split_gpt(gpt, p: int, devices=None) -> list:
    """Cut an ``nn.GPT`` (embedding, blocks, final norm, head) into ``p`` balanced stages."""
    layers = [GPTEmbedding(gpt), *gpt.blocks, gpt.ln_f, gpt.lm_head]
    if len(layers) < p:
        raise ValueError(f"split_gpt: the model has {len(layers)} layers (embedding, "
                         f"{len(layers) - 2} blocks/norm, head) and cannot be cut into {p} stages; "
                         f"use at most {len(layers)} stages or more blocks")
    return split_sequential(layers, p, devices)
