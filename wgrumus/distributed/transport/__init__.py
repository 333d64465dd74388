"""Transports (threads.py, shm.py, mpi.py) under one interface (their shared helpers: wire.py)::

    isend(dst, tag, arr, deadline, owned=False) -> request     (arr unchanged until waited)
    recv(src, tag, deadline, dtype, shape) -> ndarray           (shape[0] may be -1: any rows)
    wait_all(requests, deadline); send_array / recv_array       (shape and dtype travel along)
    native_* collectives; split(key, color, members) -> child transport or None;
    check() / abort(err) / failed                               (liveness)
"""
from __future__ import annotations

from .mpi import MPITransport
from .shm import ShmTransport
from .threads import ThreadTransport, ThreadWorld
from .wire import owned_copy, split_bounds

__all__ = ["ThreadWorld", "ThreadTransport", "MPITransport", "ShmTransport", "owned_copy",
           "split_bounds"]
