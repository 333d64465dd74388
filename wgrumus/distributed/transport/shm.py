"""The processes backend's transport: ranks are processes of one host (started by
``dist.spawn(..., backend="processes")`` or ``wgrumus train --backend processes``) sharing a
segment in /dev/shm (shm_segment.py).

- send/recv: one byte ring per (source, destination) with a written and a consumed counter;
  messages (tag, length, payload) are streamed through it, so any size passes a fixed ring. A
  message with another tag than the one awaited is set aside, as MPI's unexpected queue does.
  A send that does not fit stays queued and moves on in every later call (no deadlock when two
  ranks send to each other before receiving).
- collectives: in rounds on two alternating slot sets per rank (shm_rounds.py); device tensors
  point to point through mapped staging (shm_device.py).
- waiting spins briefly, then yields, then sleeps (at most 1 ms); it checks the shared abort word
  often and the peers' processes every 20 ms, so a failure anywhere (an exception, a killed or
  dead process, the launcher gone) is a CollectiveError everywhere well within the timeout.

Stores become visible in program order on x86-64 (TSO), which the ring and barrier counters rely
on (payload first, counter last).
"""
from __future__ import annotations

import collections
import os
import threading
import time

import numpy as np

from ..errors import CollectiveError
from .shm_rounds import SlotRounds
from .shm_segment import MSG_BYTES, Segment, child_name, open_when_ready
from .wire import _HEADER_WORDS, _Liveness, check_received, decode_header, encode_header

SPIN = int(os.environ.get("WGRUMUS_SHM_SPIN", "2000"))  # polls before a waiting rank yields
PEER_CHECK = 0.02  # seconds between checks that the peers' processes still run
_MSG = 2  # int64 words of a message header: tag, payload bytes
_ARRAY_HDR = _HEADER_WORDS * 8
_STREAM = object()  # _Incoming.buf of a payload read piece by piece by its receiver


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (Linux: /proc)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


class ShmState:
    """What every transport of one process shares: the world segment (abort word, pids, exit
    flags) and this process's world rank."""

    def __init__(self, seg: Segment, rank: int, launcher_pid: int | None):
        self.seg, self.rank, self.launcher_pid = seg, rank, launcher_pid
        self.error: CollectiveError | None = None
        self._next_peer_check = 0.0

    def raise_if_failed(self) -> None:
        if self.error is None:
            who = int(self.seg.header[4])
            if who:
                msg = bytes(self.seg.message(who - 1)).rstrip(b"\0").decode(errors="replace")
                rank = who - 1 if who - 1 < self.seg.world else None
                self.error = CollectiveError(msg, rank=rank, timed_out=bool(self.seg.header[5]))
        if self.error is not None:
            e = self.error
            raise CollectiveError(str(e), missing=e.missing, rank=e.rank,
                                  timed_out=e.timed_out) from e

    def abort(self, err: BaseException) -> None:
        """Publish this rank's failure (the first published stays)."""
        if int(self.seg.header[4]):
            return
        root = err.__cause__ if isinstance(err, CollectiveError) and err.__cause__ else err
        if isinstance(err, CollectiveError) and str(err).startswith(f"rank {self.rank}"):
            text = str(err)
        else:
            text = f"rank {self.rank} aborted: {type(root).__name__}: {root}"
        publish_abort(self.seg, self.rank, text,
                      isinstance(err, CollectiveError) and err.timed_out)
        if self.error is None:
            self.error = CollectiveError(text, rank=self.rank,
                                         timed_out=isinstance(err, CollectiveError)
                                         and err.timed_out)

    def check_peers(self, world_ranks, what: str) -> None:
        """Every 20 ms: raise if one of ``world_ranks`` died or ended, or the launcher ended."""
        now = time.monotonic()
        if now < self._next_peer_check:
            return
        self._next_peer_check = now + PEER_CHECK
        if self.launcher_pid is not None and os.getppid() != self.launcher_pid:
            from .shm_segment import unlink_all
            unlink_all(self.seg.name.split(".", 1)[0])  # nobody else will
            raise CollectiveError(f"rank {self.rank}: the launching process "
                                  f"({self.launcher_pid}) has ended while {what}")
        for r in world_ranks:
            if r == self.rank:
                continue
            pid = int(self.seg.pids[r])
            if int(self.seg.exited[r]):
                raise CollectiveError(f"rank {self.rank}: rank {r} has ended ({what})",
                                      missing=[r], rank=r)
            if pid and not _alive(pid):
                raise CollectiveError(f"rank {self.rank}: rank {r} (pid {pid}) died ({what})",
                                      missing=[r], rank=r)


def publish_abort(seg: Segment, who: int, text: str, timed_out: bool = False) -> None:
    """Write ``text`` as rank ``who``'s abort (the launcher is ``seg.world``), then the word."""
    raw = text.encode()[:MSG_BYTES - 1]
    m = seg.message(who)
    m[:] = 0
    m[:len(raw)] = np.frombuffer(raw, np.uint8)
    seg.header[5] = int(timed_out)
    seg.header[4] = who + 1


class _Send:
    """A queued message: its parts (uint8 views) and how far they have been written."""

    __slots__ = ("parts", "part", "pos", "done")

    def __init__(self, parts):
        self.parts, self.part, self.pos, self.done = parts, 0, 0, False


class _Incoming:
    """The message being read from one source: its header, then its payload."""

    __slots__ = ("hdr", "hgot", "tag", "buf", "got")

    def __init__(self):
        self.hdr = np.empty(_MSG, np.int64)
        self.hgot, self.tag, self.buf, self.got = 0, None, None, 0


class ShmTransport(SlotRounds, _Liveness):
    """One process's endpoint of a shared-memory segment (the world's or a subgroup's)."""

    backend = "processes"
    tag_ub = (1 << 30) - 1
    prefers_native = True  # the slot rounds beat message rings for every collective

    def __init__(self, seg: Segment, rank: int, state: ShmState, world_ranks=None,
                 timeout: float = 60.0):
        self.seg, self.rank, self.size = seg, rank, seg.world
        self.state = self._live = state
        self.world_ranks = list(world_ranks) if world_ranks is not None else list(range(seg.world))
        self.timeout = float(timeout)
        self._lock = threading.RLock()  # Work.wait on one thread, collectives on another
        self._barriers = int(seg.arrive[rank])  # (0 in a fresh segment)
        self._rounds = 0  # slot rounds so far: their parity picks the slot set
        self._sends = [collections.deque() for _ in range(self.size)]
        self._incoming = [_Incoming() for _ in range(self.size)]
        self._unexpected: dict = {}  # (src, tag) -> deque of payloads
        self._rings_out = [seg.ring(rank, d) for d in range(self.size)]
        self._rings_in = [seg.ring(s, rank) for s in range(self.size)]
        self._cap = seg.layout.ring
        self.phases = None  # TransferPhases of device transfers, made at the first
        self._splits: dict = {}
        self.stats = dict.fromkeys(("messages_sent", "bytes_sent", "messages_received",
                                    "bytes_received"), 0)

    # ----- waiting -----
    def _wait(self, ready, deadline: float, what: str, peers) -> None:
        """Until ``ready()``: spin, then yield, then sleep; abort, peers and deadline checked."""
        spins = 0
        while not ready():
            spins += 1
            if spins & 31 == 0:
                self.state.raise_if_failed()
                if time.monotonic() >= deadline:
                    raise CollectiveError(f"rank {self.rank}: {what} within {self.timeout} s "
                                          "timeout", missing=list(peers()), timed_out=True)
                try:
                    self.state.check_peers([self.world_ranks[p] for p in peers()], what)
                except CollectiveError:
                    if ready():  # what the peer left before it ended
                        return
                    raise
            if spins > SPIN:
                time.sleep(min(1e-3, (spins - SPIN) * 1e-6))
            elif spins > SPIN // 4:
                os.sched_yield()

    # ----- point to point -----
    def _push(self, dst: int) -> None:
        """Write what fits of the queued messages to ``dst``."""
        q = self._sends[dst]
        ring, cap = self._rings_out[dst], self._cap
        i = self.rank * self.size + dst
        heads, tails = self.seg.heads, self.seg.tails
        while q:
            s = q[0]
            h = int(heads[i])
            free = cap - (h - int(tails[i]))
            while free > 0 and s.part < len(s.parts):
                src = s.parts[s.part]
                n = min(free, src.size - s.pos)
                p = h % cap
                first = min(n, cap - p)
                ring[p:p + first] = src[s.pos:s.pos + first]
                if n > first:
                    ring[:n - first] = src[s.pos + first:s.pos + n]
                h += n
                free -= n
                s.pos += n
                if s.pos == src.size:
                    s.part, s.pos = s.part + 1, 0
            heads[i] = h  # after the bytes
            if s.part < len(s.parts):
                return
            s.done = True
            q.popleft()

    def _progress_sends(self) -> bool:
        for d in range(self.size):
            if self._sends[d]:
                self._push(d)
        return all(not q for q in self._sends)

    def _read(self, src: int, dst: np.ndarray, at: int, n: int) -> int:
        """Up to ``n`` bytes from ``src``'s ring into dst[at:]; how many were there."""
        i = src * self.size + self.rank
        t = int(self.seg.tails[i])
        n = min(n, int(self.seg.heads[i]) - t)
        if n <= 0:
            return 0
        ring, cap = self._rings_in[src], self._cap
        p = t % cap
        first = min(n, cap - p)
        dst[at:at + first] = ring[p:p + first]
        if n > first:
            dst[at + first:at + n] = ring[:n - first]
        self.seg.tails[i] = t + n  # after the bytes were read
        return n

    def _pull(self, src: int, tag: int, into: np.ndarray | None, stream: bool = False):
        """Read from ``src`` until the message ``tag`` is complete (its payload) or the ring is
        empty (None); messages with other tags are set aside. ``stream``: stop after the header
        of message ``tag`` (returns _STREAM; the caller reads the payload, ``_read_stream``)."""
        inc = self._incoming[src]
        while True:
            if inc.buf is _STREAM:
                return None  # another thread reads this source's payload now
            if inc.tag is None:
                hb = inc.hdr.view(np.uint8)
                inc.hgot += self._read(src, hb, inc.hgot, hb.size - inc.hgot)
                if inc.hgot < hb.size:
                    return None
                inc.tag, n = int(inc.hdr[0]), int(inc.hdr[1])
                inc.got = 0
                if stream and inc.tag == tag:
                    inc.buf, inc.got = _STREAM, n  # (got: the payload's bytes still unread)
                    return _STREAM
                inc.buf = into if (inc.tag == tag and into is not None and into.size == n) \
                    else np.empty(n, np.uint8)
            if inc.got < inc.buf.size:
                inc.got += self._read(src, inc.buf, inc.got, inc.buf.size - inc.got)
                if inc.got < inc.buf.size:
                    return None
            got_tag, buf = inc.tag, inc.buf
            inc.tag, inc.buf, inc.hgot = None, None, 0
            self.stats["messages_received"] += 1
            self.stats["bytes_received"] += buf.size
            if got_tag == tag:
                return buf
            self._unexpected.setdefault((src, got_tag), collections.deque()).append(buf)

    def _recv_bytes(self, src: int, tag: int, deadline: float, into=None) -> np.ndarray:
        got = []

        def ready():
            with self._lock:
                q = self._unexpected.get((src, tag))
                if q:
                    got.append(q.popleft())
                    if not q:
                        del self._unexpected[(src, tag)]
                    return True
                self._progress_sends()
                buf = self._pull(src, tag, into)
                if buf is not None:
                    got.append(buf)
                    return True
                return False
        self._wait(ready, deadline, f"no message from rank {src} (tag {tag})", lambda: [src])
        return got[0]

    def _await_message(self, src: int, tag: int, deadline: float):
        """The next message ``tag`` from ``src``: (payload, None) when it was already set aside,
        else (None, payload bytes) with the payload left for ``_read_stream``."""
        got = []

        def ready():
            with self._lock:
                q = self._unexpected.get((src, tag))
                if q:
                    got.append((q.popleft(), None))
                    if not q:
                        del self._unexpected[(src, tag)]
                    return True
                self._progress_sends()
                if self._pull(src, tag, None, stream=True) is _STREAM:
                    got.append((None, self._incoming[src].got))
                    return True
                return False
        self._wait(ready, deadline, f"no message from rank {src} (tag {tag})", lambda: [src])
        return got[0]

    def _read_stream(self, src: int, dst: np.ndarray, deadline: float) -> None:
        """The next ``dst.size`` bytes of the payload being streamed from ``src``."""
        at = [0]

        def ready():
            with self._lock:
                at[0] += self._read(src, dst, at[0], dst.size - at[0])
                if at[0] < dst.size:
                    self._progress_sends()
            return at[0] == dst.size
        self._wait(ready, deadline, f"rank {src} stopped sending mid-message", lambda: [src])
        self._incoming[src].got -= dst.size

    def wait_data(self, src: int, nbytes: int, deadline: float) -> None:
        """Until ``src``'s ring holds ``nbytes`` (at most a ring's worth) unread."""
        i = src * self.size + self.rank
        need = min(nbytes, self._cap)
        heads, tails = self.seg.heads, self.seg.tails

        def ready():
            if int(heads[i]) - int(tails[i]) >= need:
                return True
            with self._lock:
                self._progress_sends()
            return False
        self._wait(ready, deadline, f"rank {src} stopped sending mid-message", lambda: [src])

    def _end_stream(self, src: int) -> None:
        inc = self._incoming[src]
        if inc.got:
            raise CollectiveError(f"rank {self.rank}: {inc.got} bytes of a message from rank "
                                  f"{src} were left unread")
        self.stats["messages_received"] += 1
        self.stats["bytes_received"] += int(inc.hdr[1])
        inc.tag, inc.buf, inc.hgot = None, None, 0

    def ring_free(self, dst: int) -> int:
        """Bytes a message to ``dst`` may take now without waiting (0 behind queued ones)."""
        if self._sends[dst]:
            return 0
        i = self.rank * self.size + dst
        return self._cap - (int(self.seg.heads[i]) - int(self.seg.tails[i]))

    def write_now(self, dst: int, data: np.ndarray) -> None:
        """Write ``data`` (uint8) to ``dst``'s ring; it must fit (``ring_free``)."""
        s = _Send([data])
        self._sends[dst].append(s)
        self._push(dst)
        if not s.done:
            raise RuntimeError("write_now: the ring had less room than ring_free said")

    def message_header(self, tag: int, nbytes: int) -> np.ndarray:
        return np.array([tag, nbytes], np.int64).view(np.uint8)

    # ----- device tensors point to point (shm_device.py) -----
    def send_device(self, s, shape, dst, tag, deadline):
        from .shm_device import send_device
        return send_device(self, s, shape, dst, tag, deadline)

    def recv_device(self, src, tag, device, deadline):
        from .shm_device import recv_device
        return recv_device(self, src, tag, device, deadline)

    def isend(self, dst, tag, arr, deadline, owned=False):
        arr = np.ascontiguousarray(arr)
        return self._queue(dst, tag, [arr.reshape(-1).view(np.uint8)])

    def _queue(self, dst: int, tag: int, parts) -> _Send:
        if dst == self.rank:
            raise CollectiveError(f"rank {self.rank} cannot send to itself")
        n = sum(p.size for p in parts)
        hdr = np.array([tag, n], np.int64).view(np.uint8)
        s = _Send([hdr, *parts])
        with self._lock:
            self._sends[dst].append(s)
            self._push(dst)
        self._count("sent", n)
        return s

    def wait_all(self, reqs, deadline):
        pending = [r for r in reqs if not r.done]
        if not pending:
            return

        def ready():
            with self._lock:
                self._progress_sends()
            return all(r.done for r in pending)
        dsts = {d for d in range(self.size) if self._sends[d]}
        self._wait(ready, deadline, "send did not complete (receiver not receiving)",
                   lambda: sorted(dsts))

    def send_array(self, dst, tag, arr, deadline, owned=False):
        arr = np.ascontiguousarray(np.asarray(arr))
        return [self._queue(dst, tag, [encode_header(arr).view(np.uint8),
                                       arr.reshape(-1).view(np.uint8)])]

    def recv_array(self, src, tag, deadline):
        buf = self._recv_bytes(src, tag, deadline)
        dtype, shape = decode_header(buf[:_ARRAY_HDR].view(np.int64))
        return buf[_ARRAY_HDR:].view(dtype).reshape(shape)

    def recv(self, src, tag, deadline, dtype=None, shape=None):
        if shape is not None and dtype is not None and all(s >= 0 for s in shape):
            out = np.empty(shape, dtype)
            flat = out.reshape(-1).view(np.uint8)
            buf = self._recv_bytes(src, tag, deadline, flat)
            if buf is not flat:
                if buf.size != flat.size:
                    raise CollectiveError(f"rank {self.rank}: rank {src} sent {buf.size} bytes "
                                          f"on tag {tag}, expected {flat.size} (ranks passed "
                                          "different shapes or dtypes?)", rank=src)
                flat[:] = buf
            return out
        buf = self._recv_bytes(src, tag, deadline)
        dt = np.dtype(dtype if dtype is not None else np.uint8)
        tail = tuple(shape[1:]) if shape is not None else ()
        row = dt.itemsize * int(np.prod(tail, dtype=np.int64))
        if row == 0 or buf.size % row:
            raise CollectiveError(f"rank {self.rank}: {buf.size} bytes from rank {src} on tag "
                                  f"{tag} are not whole rows of {dt} {tail}", rank=src)
        out = buf.view(dt).reshape((buf.size // row,) + tail if shape is not None else -1)
        check_received(out, dtype, shape, src, f"rank {self.rank} receiving tag {tag}")
        return out

    # ----- groups -----
    def split(self, key, color, members):
        if color is None:
            return None
        name = child_name(self.seg.name, key)
        sub_rank = members.index(self.rank)
        deadline = time.monotonic() + self.timeout
        if sub_rank == 0:
            lay = self.seg.layout
            seg = Segment(name, create_world=len(members), ring=lay.ring, slot=lay.slot)
        else:
            seg = open_when_ready(name, deadline, self.state.raise_if_failed)
        return ShmTransport(seg, sub_rank, self.state,
                            [self.world_ranks[m] for m in members], self.timeout)
