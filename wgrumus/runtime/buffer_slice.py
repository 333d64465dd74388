"""A region of one device buffer: what the comm layer moves (tensors hand one out through
``Tensor.buffer_slice()``; it lives here so tensor.py need not import the distributed layer)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BufferSlice:
    """``nbytes`` of ``dtype`` values at byte ``offset`` of a device's wgpu ``buffer``."""
    device: object
    buffer: object
    offset: int
    nbytes: int
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.offset % 4 or self.nbytes % 4:
            raise ValueError(f"offset ({self.offset}) and size ({self.nbytes}) must be multiples "
                             "of 4 bytes: WebGPU copies and queue writes work in 4-byte words")
        if self.nbytes % self.dtype.itemsize:
            raise ValueError(f"{self.nbytes} bytes is not a whole number of {self.dtype} values; "
                             f"pass a size that is a multiple of {self.dtype.itemsize}")
