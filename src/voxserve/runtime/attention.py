"""Attention memory bound shared by the families: past SCORE_BLOCK scores a step, attention runs
by rows of queries against every key. Each query's softmax is its own, so the rows give the full
attention's result while no [T, T] score tensor exists (frames squared took GBs on long inputs)."""

from __future__ import annotations

SCORE_BLOCK = 1 << 22  # scores one attention step holds (16 MB of fp32; a few copies live at once)


def query_rows(heads: int, n_queries: int, width: int, block: int = SCORE_BLOCK) -> int:
    """Queries per step so that its scores [heads, rows, width] (heads: batch x heads) stay
    within `block` elements; n_queries when all fit (the plain path)."""
    return max(1, min(n_queries, block // max(1, heads * width)))
