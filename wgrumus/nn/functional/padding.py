"""F.pad: constant (negative pads crop; ops' constant_pad), reflect, replicate and circular
padding of the last dims. The other modes gather each padded dim through index_select (the
index is the pad's geometry, built on the host; the data never leaves the device)."""
from __future__ import annotations

import numpy as np

from ...ops.indexing import index_select
from ...ops.padding import constant_pad, pad_pairs
from ...runtime.errors import ShapeError
from ...tensor import Tensor

MODES = ("constant", "reflect", "replicate", "circular")


def _index(mode: str, n: int, lo: int, hi: int) -> np.ndarray:
    i = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    if mode == "circular":
        return i % n
    return (n - 1) - np.abs((n - 1) - np.abs(i))  # reflect: no edge repeat


def pad(x: Tensor, pad, mode: str = "constant", value=0.0) -> Tensor:
    """torch.nn.functional.pad."""
    if mode not in MODES:
        raise ValueError(f"pad: mode must be one of {MODES}, got {mode!r}")
    if mode == "constant":
        return constant_pad(x, pad, value)
    for d, lo, hi in pad_pairs(x, pad):
        n = x.shape[d]
        if lo < 0 or hi < 0:
            raise ShapeError(f"pad: negative padding crops only in 'constant' mode, got "
                             f"({lo}, {hi}) on dim {d} in {mode!r}")
        limit = n - 1 if mode == "reflect" else n
        if n == 0 or max(lo, hi) > limit:
            what = "size - 1" if mode == "reflect" else "the size"
            raise ShapeError(f"pad: {mode} padding ({lo}, {hi}) on dim {d} of size {n} must "
                             f"be at most {limit} ({what})")
        if lo or hi:
            x = index_select(x, d, _index(mode, n, lo, hi).astype(np.int32))
    return x


__all__ = ["pad"]
