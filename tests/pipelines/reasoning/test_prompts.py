"""The prompt reader: deterministic draws, whole epochs, fresh group ids per draw, chunks as the
planner sizes them."""

from __future__ import annotations

from collections import Counter

import pytest

from pipelines.reasoning.data import PromptRecord
from pipelines.reasoning.prompts import PromptReader, chunk_prompts


def records(n: int) -> list[PromptRecord]:
    return [PromptRecord(f"r/{i}", f"{i}+0=", str(i), "synthetic/arith", {}) for i in range(n)]


def test_iterations_walk_through_shuffled_epochs() -> None:
    reader = PromptReader(records(10), batch_size=4, seed=3)
    uids = [d.record.uid for i in range(5) for d in reader.draws(i)]  # 20 draws = two epochs
    first, second = uids[:10], uids[10:]
    assert sorted(first) == sorted(second) == sorted(f"r/{i}" for i in range(10))  # each epoch: every record once
    assert first != second and first != [f"r/{i}" for i in range(10)]  # a fresh order each epoch
    # stateless: the same iteration gives the same draws, in a new reader too (resume)
    assert [d.record.uid for d in PromptReader(records(10), 4, seed=3).draws(3)] == uids[12:16]
    assert [d.record.uid for d in PromptReader(records(10), 4, seed=4).draws(0)] != uids[:4]


def test_group_ids_are_one_per_draw_even_when_a_batch_meets_a_record_twice() -> None:
    reader = PromptReader(records(3), batch_size=4, seed=0)  # every batch crosses an epoch boundary
    draws = reader.draws(1)
    assert [d.group_id for d in draws] == [4, 5, 6, 7]  # iteration * batch + position
    assert max(Counter(d.record.uid for d in draws).values()) == 2  # one record drawn twice ...
    assert len({d.group_id for d in draws}) == 4  # ... in two groups


def test_no_shuffle_keeps_file_order() -> None:
    reader = PromptReader(records(5), batch_size=3, seed=0, shuffle=False)
    assert [d.record.uid for d in reader.draws(0) + reader.draws(1)] == ["r/0", "r/1", "r/2", "r/3", "r/4", "r/0"]


def test_chunks_hold_whole_prompts_sized_like_the_planner() -> None:
    draws = PromptReader(records(10), batch_size=10, seed=0).draws(0)
    chunks = chunk_prompts(draws, 4)
    assert [len(c) for c in chunks] == [3, 3, 2, 2]  # scheduler.chunk_sizes(10, 4)
    assert [c.first for c in chunks] == [0, 3, 6, 8] and [c.index for c in chunks] == [0, 1, 2, 3]
    assert [d for c in chunks for d in c.draws] == draws
    with pytest.raises(ValueError):
        chunk_prompts(draws, 11)
