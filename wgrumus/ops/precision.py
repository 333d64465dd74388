"""The autocast state the ops read (``wgrumus.amp.autocast`` sets it; ops cannot import amp).

Under autocast the f16 ops (matmul, linear, conv through matmul, attention) take float32
tensors, run their kernels on float16 copies (float32 accumulation) and return float32, so the
autograd graph, the parameters and their gradients stay float32. The backward of such an op
runs under the precision of its forward, as PyTorch's does. Per thread, like PyTorch's.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

from ..tensor import Tensor, float32

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


# f16 copies of whole storages, by storage version: every view of a weight (W, W.T) shares
# one copy from the forward through its backward, and so does every view of an activation or
# gradient feeding several matmuls. Weak keys: a copy goes when its source does; an in-place
# write (a new version) makes it stale, and entering autocast afresh (the next forward) drops
# them all, since some writes bypass the version (FSDP re-gathers parameters into storage).
_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_copies_lock = threading.Lock()


def forget_copies() -> None:
    with _copies_lock:
        _copies.clear()


def low(x: Tensor) -> Tensor:
    """``x`` in the autocast dtype when autocast is on and ``x`` is float32, else ``x``."""
    dt = autocast_dtype()
    if dt is None or x.dtype != float32:
        return x
    from .elementwise import cast
    st = x._storage
    n = st.nbytes // 4
    if 2 * x.numel() < n:  # a small view of a large buffer: cast just the view
        return cast(x, dt)
    with _copies_lock:
        hit = _copies.get(st)
    if hit is None or hit[0] != st.version or hit[1].dtype != dt:
        hit = (st.version, cast(Tensor(st, (n,)), dt))
        with _copies_lock:
            _copies[st] = hit
    return Tensor(hit[1]._storage, x.shape, x.strides, x.offset, dt)


def in_forward_precision(backward):
    """``backward`` wrapped to run under the autocast state of the forward that records it
    (f16 ops stay f16 in backward; f32 ops stay f32 if backward is called under autocast)."""
    dt = autocast_dtype()

    def run(g):
        with autocast_as(dt):
            return backward(g)
    return run
