"""CollectiveError: the one exception every collective failure surfaces as.

Callers catch a single type whether a peer raised, exited, timed out, sent mismatched data or the
group was aborted; the message says which ranks and what happened, and ``__cause__`` keeps the
original exception when there is one.
"""
from __future__ import annotations

from ..runtime.errors import WgrumusError


class CollectiveError(WgrumusError):
    """A collective or point-to-point operation could not complete.

    ``missing`` lists the ranks that did not arrive (when known), ``rank`` the rank that failed
    first (when known), ``timed_out`` whether this rank gave up waiting (rather than learning of
    a failure). After a CollectiveError the group or barrier it came from is broken: every
    later call raises at once, because peers may be stuck half-way through the failed operation.
    """

    def __init__(self, message: str, *, missing=None, rank=None, timed_out: bool = False):
        super().__init__(message)
        self.missing = tuple(missing) if missing is not None else None
        self.rank = rank
        self.timed_out = timed_out
