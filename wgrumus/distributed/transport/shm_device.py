"""Device tensors sent between processes of one host with no array in between: the sender's
chunks are downloaded in one submission (after the work that produced them) and copied from the
mapped staging buffers straight into the ring; the receiver copies from the ring straight into
pooled, already mapped upload buffers and submits each chunk's upload as soon as it is filled, so
its uploads overlap the sender's later downloads. Each phase's time is kept in the transport's
``phases`` (runtime.staging.TransferPhases)."""
from __future__ import annotations

import os
import time

import numpy as np

from ..errors import CollectiveError
from .wire import _HEADER_WORDS, decode_header, header_for

CHUNK = int(os.environ.get("WGRUMUS_P2P_CHUNK", str(1 << 20)))  # bytes a staging buffer moves
_ARRAY_HDR = _HEADER_WORDS * 8


def _phases(t):
    if t.phases is None:
        from ...runtime.staging import TransferPhases
        t.phases = TransferPhases()
    return t.phases


def _spans(nbytes: int) -> list[tuple[int, int]]:
    return [(lo, min(CHUNK, nbytes - lo)) for lo in range(0, nbytes, CHUNK)]


def send_device(t, s, shape, dst: int, tag: int, deadline: float) -> list:
    """Send BufferSlice ``s`` (an array of ``shape``) to ``dst``; the requests to wait for (none
    when it went straight into the ring)."""
    from ...runtime.staging import staging_of, wait_split
    if dst == t.rank:
        raise CollectiveError(f"rank {t.rank} cannot send to itself")
    ph = _phases(t)
    st = staging_of(s.device)
    spans = _spans(s.nbytes)
    hdr = header_for(s.dtype, shape).view(np.uint8)
    t0 = time.perf_counter()
    readers = [st.reader(n) for _, n in spans]
    st.submit([(s.buffer, s.offset + lo, r.buffer, 0, n) for (lo, n), r in zip(spans, readers)],
              readers)
    ph.add("submit", time.perf_counter() - t0)
    held = list(readers)
    try:
        with t._lock:
            if t.ring_free(dst) >= 16 + _ARRAY_HDR + s.nbytes:  # all of it fits: no waiting
                t.write_now(dst, np.concatenate([t.message_header(tag, _ARRAY_HDR + s.nbytes),
                                                 hdr]))
                for (_, n), r in zip(spans, readers):
                    wait_split(st, r, deadline, ph)
                    t1 = time.perf_counter()
                    view = r.array(np.uint8, n)
                    t.write_now(dst, view)
                    del view
                    ph.add("copy", time.perf_counter() - t1)
                    r.unmap()
                    st.give_back(r)
                    held.remove(r)
                t._count("sent", _ARRAY_HDR + s.nbytes)
                return []
        out = np.empty(s.nbytes, np.uint8)  # queued behind others, or larger than the room
        for (lo, n), r in zip(spans, readers):
            wait_split(st, r, deadline, ph)
            t1 = time.perf_counter()
            out[lo:lo + n] = r.array(np.uint8, n)
            ph.add("copy", time.perf_counter() - t1)
            r.unmap()
            st.give_back(r)
            held.remove(r)
        return [t._queue(dst, tag, [hdr, out])]
    except BaseException:
        st.discard(held, t.timeout)
        raise


def recv_device(t, src: int, tag: int, device, deadline: float):
    """The tensor rank ``src`` sent with ``tag``, made on ``device``."""
    from ...runtime.staging import staging_of
    from ...tensor import DTYPES, Tensor, tensor
    whole, n = t._await_message(src, tag, deadline)
    if whole is not None:  # it arrived earlier and was set aside
        dtype, shape = decode_header(whole[:_ARRAY_HDR].view(np.int64))
        return tensor(whole[_ARRAY_HDR:].view(dtype).reshape(shape), device=device)
    hb = np.empty(_ARRAY_HDR, np.uint8)
    t._read_stream(src, hb, deadline)
    dtype, shape = decode_header(hb.view(np.int64))
    nbytes = n - _ARRAY_HDR
    if dtype not in DTYPES or nbytes % 4 or nbytes == 0:  # not a device dtype: via numpy
        buf = np.empty(nbytes, np.uint8)
        t._read_stream(src, buf, deadline)
        t._end_stream(src)
        return tensor(buf.view(dtype).reshape(shape), device=device)
    ph = _phases(t)
    out = Tensor.empty(shape, device, dtype)
    o = out.buffer_slice()
    st = staging_of(device)
    w = None
    try:
        for lo, m in _spans(nbytes):
            t0 = time.perf_counter()
            w = st.writer(m, deadline, spare=2)
            t1 = time.perf_counter()
            t.wait_data(src, m, deadline)
            t2 = time.perf_counter()
            view = w.array(np.uint8, m)
            t._read_stream(src, view, deadline)
            del view
            t3 = time.perf_counter()
            w.unmap()
            st.submit([(w.buffer, 0, o.buffer, o.offset + lo, m)], [w])
            st.give_back(w)
            w = None
            ph.add("map", t1 - t0)
            ph.add("peer", t2 - t1)
            ph.add("copy", t3 - t2)
            ph.add("submit", time.perf_counter() - t3)
    except BaseException:
        st.discard([w], t.timeout)
        raise
    t._end_stream(src)
    return out
