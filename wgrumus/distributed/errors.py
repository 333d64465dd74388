"""CollectiveError: the one exception every collective failure surfaces as."""
from __future__ import annotations

from ..runtime.errors import WgrumusError


class CollectiveError(WgrumusError):
    """A collective could not complete; ``missing``: ranks that did not arrive, ``rank``: the one
    that failed first, ``timed_out``: this rank gave up waiting. Its group stays broken (peers may
    be stuck half-way)."""

    def __init__(self, message: str, *, missing=None, rank=None, timed_out: bool = False):
        super().__init__(message)
        self.missing = tuple(missing) if missing is not None else None
        self.rank = rank
        self.timed_out = timed_out
