"""When the env and the rollout were busy in a collection: their calls as ``(start_s, end_s)`` spans.

Env ranks record the spans of their simulator calls (resets and steps), rollout ranks those of
their decisions, on ``time.perf_counter``'s clock (one clock per node: spans of ranks on different
nodes do not compare). :func:`overlap_s` says how long both sides were busy at once: what a
``switch`` plan (env and rollout taking turns on a shared GPU) keeps at 0 and an ``overlap`` plan
buys its speed with.
"""

from __future__ import annotations

from collections.abc import Iterable

Span = tuple[float, float]
"""``(start_s, end_s)`` of one call, ``start_s <= end_s``."""


def union(spans: Iterable[Span]) -> list[Span]:
    """``spans`` merged into disjoint spans, in time order (touching spans merge)."""
    merged: list[Span] = []
    for start_s, end_s in sorted(spans):
        if end_s < start_s:
            raise ValueError(f"union: a span ends before it starts: ({start_s}, {end_s})")
        if merged and start_s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end_s))
        else:
            merged.append((start_s, end_s))
    return merged


def overlap_s(a: Iterable[Span], b: Iterable[Span]) -> float:
    """Seconds during which some span of ``a`` and some span of ``b`` run at once."""
    first, second = union(a), union(b)
    total_s, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        start_s, end_s = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        if end_s > start_s:
            total_s += end_s - start_s
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total_s
