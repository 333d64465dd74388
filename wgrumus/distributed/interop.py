"""numpy <-> wgrumus Tensor at the edge of the collectives: Tensor in, Tensor out on the same
device; numpy in, numpy out. Collectives themselves only ever see numpy arrays."""
from __future__ import annotations

import numpy as np

from ..tensor import tensor


def is_tensor(x) -> bool:
    # Duck-typed (numpy() and device): anything that behaves like a Tensor takes its path.
    return not isinstance(x, np.ndarray) and hasattr(x, "numpy") and hasattr(x, "device")


def to_numpy(x):
    """Return (array, device): device is None for array-likes."""
    if is_tensor(x):
        return np.asarray(x.numpy(), order="C"), x.device  # (ascontiguousarray makes 0-d 1-d)
    return np.asarray(x), None


def from_numpy(arr, device):
    """Wrap ``arr`` as a Tensor on ``device``, or return it unchanged when device is None."""
    if device is None or arr is None:
        return arr
    return tensor(arr, device=device)
