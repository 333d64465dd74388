"""The memory the processes of one host share (a file in /dev/shm, mapped by each): a control
block (abort word and messages, pids, exit flags, barrier counters, ring counters, per-rank
metadata), one byte ring per (source, destination) pair and two slot sets per rank. Every counter
only grows, so a rank that comes back early never mistakes the last round for the next.

The launcher creates the world's segment and unlinks every segment of the run at the end (also
after a crash: subgroup segments share the world's name as prefix). Pages are touched only when
used, so the rings and slots cost memory as far as messages fill them.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import mmap
import os
import time

import numpy as np

from ..errors import CollectiveError

SHM_DIR = "/dev/shm"
MAGIC = 0x5747_5348_4D31  # "WGSHM1"
RING_BYTES = 4 << 20  # bytes of each (source, destination) ring
SLOT_BYTES = 8 << 20  # bytes of each slot (a rank has two slot sets)
MIN_BYTES = 256 << 10  # the least either may shrink to when /dev/shm is small
LINE = 8  # int64 words of a cache line: counters written by different ranks never share one
MSG_BYTES = 1024  # an abort message
META_BYTES = 512  # per rank and parity: a collective's signature or an array header


def sizes_for(world: int) -> tuple[int, int]:
    """Ring and slot bytes for ``world`` ranks, halved until the segment fits in /dev/shm
    twice over (a segment that does not fit dies with SIGBUS at first touch)."""
    ring, slot = RING_BYTES, SLOT_BYTES
    try:
        st = os.statvfs(SHM_DIR)
        free = st.f_bavail * st.f_frsize
    except OSError:
        return ring, slot
    while 2 * Layout(world, ring, slot).total > free and (ring > MIN_BYTES or slot > MIN_BYTES):
        ring, slot = max(MIN_BYTES, ring // 2), max(MIN_BYTES, slot // 2)
    if 2 * Layout(world, ring, slot).total > free:
        raise CollectiveError(
            f"/dev/shm has {free >> 20} MB free; {world} processes need "
            f"{2 * Layout(world, ring, slot).total >> 20} MB there: enlarge it (docker "
            "--shm-size) or use backend 'threads'")
    return ring, slot


class Layout:
    """Byte offsets of a segment for ``world`` ranks."""

    def __init__(self, world: int, ring: int, slot: int):
        self.world, self.ring, self.slot = world, ring, slot
        w = 0
        self.header = w                       # magic, world, ring, slot, abort, timed_out
        w += LINE
        self.pids = w
        w += -(-world // LINE) * LINE
        self.exited = w
        w += -(-world // LINE) * LINE
        self.arrive = w                       # barrier counter of rank r at arrive + r*LINE
        w += world * LINE
        self.heads = w                        # ring (s, d): written bytes at heads + (s*W+d)*LINE
        w += world * world * LINE
        self.tails = w                        # and bytes consumed at tails + (s*W+d)*LINE
        w += world * world * LINE
        b = w * 8
        self.msgs = b                         # (world + 1) abort messages: ranks, then launcher
        b += (world + 1) * MSG_BYTES
        self.meta = b                         # [parity][rank] META_BYTES each
        b += 2 * world * META_BYTES
        b = -(-b // 4096) * 4096
        self.rings = b
        b += world * world * ring
        self.slots = b                        # [rank][set] slot bytes each
        b += world * 2 * slot
        self.total = b


class Segment:
    """One mapped segment: numpy views of its parts."""

    def __init__(self, name: str, create_world: int | None = None, ring: int = RING_BYTES,
                 slot: int = SLOT_BYTES):
        self.name = name
        path = os.path.join(SHM_DIR, name)
        if create_world is not None:
            lay = Layout(create_world, ring, slot)
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, lay.total)
                self._map(fd, lay.total)
            finally:
                os.close(fd)
            h = self.words[:LINE]
            h[1], h[2], h[3] = create_world, ring, slot
            h[0] = MAGIC
            os.rename(tmp, path)  # appears whole to the ranks that wait for it
        else:
            fd = os.open(path, os.O_RDWR)
            try:
                self._map(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            h = self.words[:LINE]
            if int(h[0]) != MAGIC:
                raise CollectiveError(f"shared-memory segment {name} is not a wgrumus segment")
            lay = Layout(int(h[1]), int(h[2]), int(h[3]))
        self.layout = lay
        W = lay.world
        self.world = W
        words = self.words
        self.header = words[:LINE]
        self.pids = words[lay.pids:lay.pids + W]
        self.exited = words[lay.exited:lay.exited + W]
        self.arrive = words[lay.arrive:lay.arrive + W * LINE:LINE]
        self.heads = words[lay.heads:lay.heads + W * W * LINE:LINE]
        self.tails = words[lay.tails:lay.tails + W * W * LINE:LINE]
        self.bytes = np.frombuffer(self._mm, np.uint8)

    def _map(self, fd: int, size: int) -> None:
        self._mm = mmap.mmap(fd, size)
        self.words = np.frombuffer(self._mm, np.int64, count=size // 8)

    def ring(self, src: int, dst: int) -> np.ndarray:
        lay = self.layout
        lo = lay.rings + (src * self.world + dst) * lay.ring
        return self.bytes[lo:lo + lay.ring]

    def slot(self, rank: int, which: int) -> np.ndarray:
        lay = self.layout
        lo = lay.slots + (rank * 2 + which) * lay.slot
        return self.bytes[lo:lo + lay.slot]

    def meta(self, parity: int, rank: int) -> np.ndarray:
        lo = self.layout.meta + (parity * self.world + rank) * META_BYTES
        return self.bytes[lo:lo + META_BYTES]

    def message(self, who: int) -> np.ndarray:
        lo = self.layout.msgs + who * MSG_BYTES
        return self.bytes[lo:lo + MSG_BYTES]

    def close(self) -> None:
        """Drop this process's mapping (views into it must be gone)."""
        for k in ("words", "header", "pids", "exited", "arrive", "heads", "tails", "bytes"):
            self.__dict__.pop(k, None)
        with contextlib.suppress(BufferError, ValueError):
            self._mm.close()


def open_when_ready(name: str, deadline: float, check) -> Segment:
    """The segment ``name`` once its creator has published it (``check()`` raises on abort)."""
    path = os.path.join(SHM_DIR, name)
    while not os.path.exists(path):
        check()
        if time.monotonic() >= deadline:
            raise CollectiveError(f"shared-memory segment {name} did not appear in time (its "
                                  "creating rank did not arrive)", timed_out=True)
        time.sleep(1e-3)
    return Segment(name)


def child_name(parent: str, key) -> str:
    """The segment of a subgroup: the world's name (launcher cleans by prefix) and a digest."""
    world = parent.split(".", 1)[0]
    return f"{world}.{hashlib.sha1(f'{parent}|{key!r}'.encode()).hexdigest()[:16]}"


def new_world_name() -> str:
    return f"wgrumus-{os.getpid()}-{os.urandom(4).hex()}"


def unlink_all(world_name: str) -> None:
    """Remove the world's segment and its subgroups' (also half-created ones)."""
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(world_name) + "*")):
        with contextlib.suppress(OSError):
            os.unlink(path)
