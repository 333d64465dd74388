"""Loop bounds of kernels. llvmpipe (Mesa's CPU Vulkan driver, the adapter CI runs on) silently
ends every shader loop once an invocation has run 65,535 loop iterations in total (Mesa's
gallivm loop limiter), so a kernel whose loops grow with the data returns a wrong result past
that. Kernels here split such work over invocations, chunks or passes so that no invocation
runs more than LOOP_BUDGET iterations (leaving room for the short loops around them). The same
split is used on every adapter: the results do not depend on which one runs them."""
from __future__ import annotations

LOOP_BUDGET = 32768


def chunk_rows(R: int, min_rows: int, chunks: int = 128) -> int:
    """Rows per chunk of a column reduction over R rows done by one invocation per (column,
    chunk): at least ``min_rows``, about ``chunks`` chunks, never past the loop budget."""
    return max(1, min(LOOP_BUDGET, max(min_rows, -(-R // chunks))))
