"""Which prompts an iteration trains on, their GRPO group ids, and how they are cut into chunks.

    reader = PromptReader(records, batch_size=64, seed=0)
    draws = reader.draws(iteration)            # 64 PromptDraw(record, group_id)
    chunks = chunk_prompts(draws, num_chunks)   # whole prompts per chunk, as the planner splits them

The reader is stateless: iteration i takes the prompts at positions ``i * B .. i * B + B - 1`` of
the endless sequence of epochs, each epoch a permutation of the dataset drawn from ``seed`` and the
epoch number (or file order without shuffling). A resumed run therefore continues with exactly the
prompts it would have seen.

Every drawn prompt gets its own group id, ``i * B + j`` for the prompt at position j of
iteration i: the G responses to it share that id wherever they travel (chunks, channels,
minibatches), and no two draws share one, even when a batch crosses an epoch boundary and meets
the same record twice (veRL gives each prompt of a batch a fresh uid the same way). The record's
own ``uid`` travels with the draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipelines.reasoning.data import PromptRecord
from scheduler import chunk_sizes


@dataclass(frozen=True)
class PromptDraw:
    """One prompt of an iteration: the dataset record and the group id its responses share."""

    record: PromptRecord
    group_id: int


@dataclass(frozen=True)
class PromptChunk:
    """Consecutive whole prompts of an iteration (whole GRPO groups once generated).

    ``index``: the chunk's number in the iteration (0 .. k-1); ``first``: the position of its first
    prompt among the iteration's prompts."""

    index: int
    first: int
    draws: tuple[PromptDraw, ...]

    def __len__(self) -> int:
        return len(self.draws)


class PromptReader:
    """Draws ``batch_size`` prompts per iteration from ``records``, epoch after epoch."""

    def __init__(self, records: Sequence[PromptRecord], batch_size: int, seed: int, shuffle: bool = True) -> None:
        if not records:
            raise ValueError("PromptReader needs at least one record")
        if batch_size < 1:
            raise ValueError(f"PromptReader: batch_size must be >= 1, got {batch_size}")
        self.records = list(records)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(N,) record indices in the order epoch ``epoch`` visits them."""
        n = len(self.records)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def draws(self, iteration: int) -> list[PromptDraw]:
        """The prompts of iteration ``iteration`` (0-based), with their group ids."""
        n, B = len(self.records), self.batch_size
        out: list[PromptDraw] = []
        orders: dict[int, np.ndarray] = {}
        for j in range(B):
            position = iteration * B + j
            epoch, offset = divmod(position, n)
            if epoch not in orders:
                orders[epoch] = self.epoch_order(epoch)
            out.append(PromptDraw(self.records[int(orders[epoch][offset])], group_id=position))
        return out


def chunk_prompts(draws: Sequence[PromptDraw], num_chunks: int) -> list[PromptChunk]:
    """``draws`` in ``num_chunks`` chunks of consecutive prompts, sized as the planner sizes them
    (:func:`scheduler.chunk_sizes`: the first ones one prompt larger when it does not divide)."""
    chunks, first = [], 0
    for index, size in enumerate(chunk_sizes(len(draws), num_chunks)):
        chunks.append(PromptChunk(index, first, tuple(draws[first : first + size])))
        first += size
    return chunks
