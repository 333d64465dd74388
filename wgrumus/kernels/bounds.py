"""Loop bounds of kernels: llvmpipe silently ends every shader loop once an invocation has run
65,535 iterations in total, so kernels split work so no invocation runs more than LOOP_BUDGET
(the same split on every adapter: results do not depend on which runs them)."""
from __future__ import annotations

LOOP_BUDGET = 32768


def chunk_rows(R: int, min_rows: int, chunks: int = 128) -> int:
    """Rows per chunk of a column reduction over R rows done by one invocation per (column,
    chunk): at least ``min_rows``, about ``chunks`` chunks, never past the loop budget."""
    return max(1, min(LOOP_BUDGET, max(min_rows, -(-R // chunks))))
