"""What kernels read and write: views (shape, strides, element offset, dtype) of a pooled device
buffer. A Tensor is one (it adds autograd on top), so ops hand Tensors to kernels as they are;
a kernel's own scratch is a plain ``View``, which records nothing and costs one small object.
"""
from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from .errors import DeviceMismatchError

# dtypes a buffer may hold, with their WGSL names
DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32", np.dtype(np.float16): "f16"}
float32, int32, float16 = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float16)


class Storage:
    """A pooled device buffer. ``version`` counts in-place writes (autograd checks it)."""
    __slots__ = ("device", "buffer", "nbytes", "version", "__weakref__")

    def __init__(self, device, nbytes: int):
        self.device = device
        self.nbytes = nbytes
        self.buffer = device.alloc(nbytes)
        self.version = 0

    def __del__(self):
        buf = getattr(self, "buffer", None)
        if buf is not None:
            try:
                self.device.pool.release(buf)
            except Exception:  # interpreter shutdown
                pass


class BufferView(Protocol):
    """The fields a kernel reads of an operand or output: element ``offset`` into
    ``storage.buffer`` (also ``buffer``), ``shape``, ``strides`` (in elements), ``dtype``, on
    ``device``. A kernel that writes a view counts the write on ``storage.version``."""
    device: object
    storage: Storage
    buffer: object
    offset: int
    shape: tuple
    strides: tuple
    dtype: np.dtype


def contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


class View:
    """A BufferView that is no Tensor: kernel scratch, or a kernel's other look at a buffer
    (a transpose, a slice of partial results). Keeps its storage (and so the buffer) alive."""
    __slots__ = ("storage", "shape", "strides", "offset", "dtype")

    def __init__(self, storage: Storage, shape, strides=None, offset: int = 0, dtype=float32):
        self.storage = storage
        self.shape = tuple(shape)
        self.strides = contiguous_strides(self.shape) if strides is None else tuple(strides)
        self.offset = offset
        self.dtype = dtype

    @staticmethod
    def empty(shape, device, dtype=float32) -> View:
        """A contiguous scratch view of a fresh pooled buffer (back to the pool with its last
        view)."""
        return View(Storage(device, math.prod(shape) * dtype.itemsize), shape, None, 0, dtype)

    @property
    def device(self):
        return self.storage.device

    @property
    def buffer(self):
        return self.storage.buffer


def check_same_device(*ts, op: str = "op") -> None:
    devs = {t.device for t in ts}
    if len(devs) > 1:
        names = ", ".join(f"{t.device}" for t in ts)
        raise DeviceMismatchError(f"{op}: tensors are on different devices ({names}); move them "
                                  f"to one device with .to(device) first")
