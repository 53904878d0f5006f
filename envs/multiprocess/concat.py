"""Concatenation of shard results along the env axis (pure functions, env order kept).

Each worker returns the results of its contiguous shard of envs; these functions put them back
together as the results of the whole batch: observations per key, final observations (rows of
shards where no episode ended hold their current observation), episode stats, info arrays, and
every field of a :class:`~envs.base.StepResult` or :class:`~envs.base.ChunkStepResult`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from envs.base import ChunkStepResult, EpisodeStats, Obs, StepResult, to_numpy


def concat_obs(shards: Sequence[Obs]) -> Obs:
    """Concatenate per-key batch arrays of consecutive shards."""
    if len(shards) == 1:
        return shards[0]
    return {k: np.concatenate([s[k] for s in shards]) for k in shards[0]}


def concat_final(finals: Sequence[Obs | None], obs: Sequence[Obs]) -> Obs | None:
    # Shards where no env finished fill their rows with their current obs (not meaningful),
    # exactly as SerialVecEnv does for its unfinished rows.
    if all(f is None for f in finals):
        return None
    return concat_obs([f if f is not None else o for f, o in zip(finals, obs)])


def concat_episodes(shards: Sequence[EpisodeStats]) -> EpisodeStats:
    if len(shards) == 1:
        return shards[0]
    success = None
    if any(s.success is not None for s in shards):
        success = np.concatenate([s.success if s.success is not None else np.zeros_like(s.done) for s in shards])
    return EpisodeStats(
        done=np.concatenate([s.done for s in shards]),
        episode_return=np.concatenate([s.episode_return for s in shards]),
        length=np.concatenate([s.length for s in shards]),
        success=success,
    )


def concat_info(infos: Sequence[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    if len(infos) == 1:
        return infos[0]
    keys = {k for info in infos for k in info}
    out = {}
    for k in keys:
        parts = [to_numpy(info[k]) for info in infos if k in info]
        template = parts[0]
        out[k] = np.concatenate(
            [to_numpy(info[k]) if k in info else np.zeros((n, *template.shape[1:]), template.dtype) for info, n in zip(infos, sizes)]
        )
    return out


def concat_step_results(shards: Sequence[StepResult]) -> StepResult:
    """One StepResult of all envs from the shard results, in shard order."""
    return _concat_results(StepResult, shards, [len(s.reward) for s in shards])


def concat_chunk_results(shards: Sequence[ChunkStepResult]) -> ChunkStepResult:
    """One ChunkStepResult of all envs from the shard results, in shard order."""
    return _concat_results(ChunkStepResult, shards, [len(s.rewards) for s in shards])


def _concat_results(cls: type, shards: Sequence[Any], sizes: list[int]) -> Any:
    """Concatenate every field of per-shard results along the env axis."""
    if len(shards) == 1:
        return shards[0]
    obs = [s.obs for s in shards]
    special = {
        "obs": lambda: concat_obs(obs),
        "final_obs": lambda: concat_final([s.final_obs for s in shards], obs),
        "episodes": lambda: concat_episodes([s.episodes for s in shards]),
        "info": lambda: concat_info([s.info for s in shards], sizes),
    }
    return cls(**{
        f.name: special[f.name]() if f.name in special else np.concatenate([getattr(s, f.name) for s in shards])
        for f in dataclasses.fields(cls)
    })
