"""The autocast state the ops read (``wgrumus.amp.autocast`` sets it; ops cannot import amp).

Under autocast the f16 ops take and return float32 and round to f16 inside (matmul as its
kernel reads the operands: no cast copies; attention casts its packed input). Their backward
runs under the forward's precision, as PyTorch's. Per thread.
"""
from __future__ import annotations

import contextlib
import threading

_local = threading.local()


def autocast_dtype():
    """The low-precision dtype of the f16 ops now (None: autocast is off)."""
    return getattr(_local, "dtype", None)


@contextlib.contextmanager
def autocast_as(dtype):
    """Run the block with autocast dtype ``dtype`` (None turns autocast off)."""
    prev = autocast_dtype()
    _local.dtype = dtype
    try:
        yield
    finally:
        _local.dtype = prev


def in_forward_precision(backward):
    """``backward`` wrapped to run under the autocast state of the forward that records it
    (f16 ops stay f16 in backward; f32 ops stay f32 if backward is called under autocast)."""
    dt = autocast_dtype()

    def run(g):
        with autocast_as(dt):
            return backward(g)
    return run
