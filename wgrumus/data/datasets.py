"""Small real datasets shipped with the package (no network at run time); see files/README.md
for their sources and licenses."""
from __future__ import annotations

import functools
import gzip
from importlib import resources

import numpy as np

from .dataset import TensorDataset


def _file(name: str):
    return resources.files(__package__).joinpath("files", name)


@functools.lru_cache(maxsize=1)
def _digits():
    with _file("digits.csv.gz").open("rb") as f:
        raw = np.loadtxt(gzip.open(f), delimiter=",", dtype=np.int64)
    return raw[:, :-1].astype(np.float32), raw[:, -1].astype(np.int32)


def load_digits():
    """(x [1797, 64] float32 pixel counts 0..16, y [1797] int32 labels 0..9): the UCI ML
    optical recognition of handwritten digits test set (8x8 images)."""
    x, y = _digits()
    return x.copy(), y.copy()


def digits_dataset(normalize: bool = True, images: bool = False) -> TensorDataset:
    """The digits as a TensorDataset; pixels scaled to [0, 1] and shaped [1, 8, 8] if asked."""
    x, y = load_digits()
    if normalize:
        x = x / 16.0
    if images:
        x = x.reshape(-1, 1, 8, 8)
    return TensorDataset(x, y)


@functools.lru_cache(maxsize=1)
def load_text() -> str:
    """A public-domain character-level corpus (Shakespeare, from tiny-shakespeare)."""
    return _file("shakespeare.txt").read_text(encoding="utf-8")


class CharCorpus:
    """Character vocabulary of a text: encode/decode between strings and int32 ids."""

    def __init__(self, text: str | None = None):
        self.text = load_text() if text is None else text
        self.chars = sorted(set(self.text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> np.ndarray:
        try:
            return np.array([self.stoi[c] for c in s], dtype=np.int32)
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the corpus vocabulary; build "
                             f"the CharCorpus from a text that contains it") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in np.asarray(ids).reshape(-1))
