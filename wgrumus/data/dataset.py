"""Dataset protocol and TensorDataset."""
from __future__ import annotations

import numpy as np

from ..runtime.errors import ShapeError
from ..tensor import Tensor


class Dataset:
    """Anything with ``__len__`` and ``__getitem__(i)`` returning a sample (array or tuple of
    arrays). Samples stay on the host: the DataLoader batches them and moves whole batches."""

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, i):  # pragma: no cover - abstract
        raise NotImplementedError


class TensorDataset(Dataset):
    """Samples are the i-th rows of equally long arrays (Tensors are read back once)."""

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        self.arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
        n = {len(a) for a in self.arrays}
        if len(n) != 1:
            raise ShapeError(f"TensorDataset arrays differ in length: "
                             f"{[len(a) for a in self.arrays]}; pass arrays with one row per "
                             f"sample each")

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(a[i] for a in self.arrays)

    def take(self, idx: np.ndarray):
        """Whole batch at once (fancy indexing) instead of sample by sample."""
        return tuple(a[idx] for a in self.arrays)
