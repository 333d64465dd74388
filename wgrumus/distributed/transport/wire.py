"""What the transports share: message headers (dtype and shape travel with the array), the
split of a buffer into parts, the check of what arrived, and a transport's liveness."""
from __future__ import annotations

import numpy as np

from ..errors import CollectiveError

QUEUE_DEPTH = 64  # messages per (source, destination) pair before a sender waits
_HEADER_WORDS = 16
_MAGIC = 0x5747_524D  # "WGRM"
_DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8",
           "uint16", "uint32", "uint64", "bool", "complex64", "complex128")


def owned_copy(a: np.ndarray) -> np.ndarray:
    """A received array made private (thread transports share them, read-only)."""
    return a if a.flags.writeable else np.array(a, copy=True)


def split_bounds(n: int, parts: int) -> list[int]:
    """Piece i of ``n`` items is [b[i], b[i+1]) (numpy.array_split's rule)."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def encode_header(a: np.ndarray) -> np.ndarray:
    return header_for(a.dtype, a.shape)


def header_for(dtype, shape) -> np.ndarray:
    """The header that travels before an array of ``dtype`` and ``shape``."""
    name = np.dtype(dtype).name
    if name not in _DTYPES:
        raise TypeError(f"cannot send dtype {dtype}; supported: {', '.join(_DTYPES)}")
    if len(shape) > _HEADER_WORDS - 3:
        raise ValueError(f"cannot send arrays of more than {_HEADER_WORDS - 3} dimensions")
    h = np.zeros(_HEADER_WORDS, dtype=np.int64)
    h[0], h[1], h[2] = _MAGIC, _DTYPES.index(name), len(shape)
    h[3:3 + len(shape)] = shape
    return h


def decode_header(h: np.ndarray) -> tuple[np.dtype, tuple]:
    if int(h[0]) != _MAGIC:
        raise CollectiveError("received a corrupt array header: ranks called different "
                              "operations, or used the same tag for different messages")
    ndim = int(h[2])
    return np.dtype(_DTYPES[int(h[1])]), tuple(int(d) for d in h[3:3 + ndim])


def check_received(a: np.ndarray, dtype, shape, src: int, what: str) -> None:
    """Fail clearly when a peer sent something other than what this rank expects."""
    bad = dtype is not None and a.dtype != np.dtype(dtype)
    if shape is not None and not bad:
        bad = len(shape) != a.ndim or any(s >= 0 and s != d for s, d in zip(shape, a.shape))
    if bad:
        want = f"{np.dtype(dtype) if dtype is not None else '?'} {tuple(shape or ())}"
        raise CollectiveError(f"{what}: rank {src} sent {a.dtype} {a.shape}, expected {want} "
                              "(ranks passed different shapes/dtypes or called different "
                              "operations)", rank=src)


_SIG_BYTES = 192  # bytes of a collective's description compared between MPI ranks


def mismatch_error(seq: int, group: str, mine: tuple, first: tuple) -> CollectiveError:
    """Ranks disagree on collective ``seq``: (rank, name, detail) of this rank and the first."""
    (r, name, detail), (r0, name0, detail0) = mine, first
    if name != name0:
        what = (f"ranks called different collectives (#{seq} of group {group}): rank {r} "
                f"called {name}({detail}), others {name0}({detail0}) (rank {r0})")
    else:
        what = (f"{name}: ranks disagree (collective #{seq} of group {group}): rank {r} passed "
                f"{detail}, others {detail0} (rank {r0})")
    return CollectiveError(what + "; every rank must call the same collectives in the same "
                           "order, with the same op, root, strategy, dtype and shape", rank=r)


_DONE = object()  # the request of a send that already completed (thread transport)


class _Liveness:
    """A transport's liveness, delegated to the failure state ``_live`` shared with its peers."""

    def check(self) -> None:
        self._live.raise_if_failed()

    def abort(self, err: BaseException) -> None:
        self._live.abort(err)

    def _count(self, way: str, nbytes: int) -> None:
        self.stats[f"messages_{way}"] += 1
        self.stats[f"bytes_{way}"] += nbytes

    @property
    def failed(self) -> CollectiveError | None:
        return self._live.error
