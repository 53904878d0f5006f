"""The one vectorized env contract every adapter implements.

Shapes (N = ``num_envs``, C = action chunk length, A = action dim):

* observations are a dict of batch-first arrays, ``{"state": (N, D) float32, "rgb": (N, H, W, 3) uint8,
  ...}``; keys and per-env shapes are declared by ``observation_space`` (a ``gymnasium.spaces.Dict``
  for ONE env). Arrays are numpy on CPU simulators and torch tensors on ``device`` for GPU-batched
  simulators; consumers convert with ``torch.as_tensor`` and never branch on the backend.
* ``step(actions (N, A) or (N,))`` returns a :class:`StepResult`.
* ``chunk_step(actions (N, C, A))`` applies a chunk of actions step by step (a VLA predicts several
  at once) and returns a :class:`ChunkStepResult` with per-step rewards ``(N, C)``.

Episode boundaries are explicit: ``terminated`` (the MDP ended: success, failure; do not bootstrap)
versus ``truncated`` (a time limit cut the episode; bootstrap from the value of the final
observation). Envs auto-reset: after a done, ``obs`` holds the first observation of the next
episode and ``final_obs`` holds the last observation of the finished one, for bootstrapping.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError

Array = Any  # np.ndarray | torch.Tensor (batch-first)
Obs = dict[str, Array]


@dataclass
class EpisodeStats:
    """Stats of the episodes that finished during one ``step``/``chunk_step``.

    Every array is (N,); only rows where ``done`` is True are meaningful.
    ``success`` is None when the task has no success signal.
    """

    done: np.ndarray
    episode_return: np.ndarray
    length: np.ndarray
    success: np.ndarray | None = None

    def finished(self, among: np.ndarray | None = None) -> list[dict[str, float]]:
        """One dict per finished episode: ``{"return", "length", "success"?}``; with ``among`` (N,)
        bool, only the episodes of the envs it marks."""
        rows = []
        done, returns, lengths = to_numpy(self.done), to_numpy(self.episode_return), to_numpy(self.length)
        if among is not None:
            done = done & among
        success = None if self.success is None else to_numpy(self.success)
        for i in np.flatnonzero(done):
            row = {"return": float(returns[i]), "length": int(lengths[i])}
            if success is not None:
                row["success"] = float(success[i])
            rows.append(row)
        return rows


@dataclass
class StepResult:
    """Result of one batched step.

    obs:        (N, ...) per key; after a done, the first obs of the next episode (auto-reset).
    reward:     (N,) float32.
    terminated: (N,) bool; the episode reached a terminal state (no bootstrap).
    truncated:  (N,) bool; the episode was cut by a time limit (bootstrap from ``final_obs``).
    final_obs:  (N, ...) per key, the last obs of the finished episodes (valid where done),
                or None when no env finished in this step.
    episodes:   stats of the episodes that finished in this step.
    info:       extra per-env arrays, e.g. ``"success"`` (N,) bool at every step.
    """

    obs: Obs
    reward: Array
    terminated: Array
    truncated: Array
    final_obs: Obs | None
    episodes: EpisodeStats
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChunkStepResult:
    """Result of applying a chunk of C actions per env.

    rewards:    (N, C) float32; 0 after the env's episode ended inside the chunk.
    terminated: (N, C) bool; True at the step where the episode terminated.
    truncated:  (N, C) bool; True at the step where the episode was truncated.
    valid:      (N, C) bool; the steps that belong to the episode the chunk started in
                (False after the step where it ended).
    obs:        (N, ...) observation after the chunk; for envs whose episode ended inside the
                chunk, the first observation of the next episode.
    final_obs:  (N, ...) last obs of the episodes that ended in the chunk (valid where any done).
    """

    obs: Obs
    rewards: Array
    terminated: Array
    truncated: Array
    valid: Array
    final_obs: Obs | None
    episodes: EpisodeStats
    info: dict[str, Any] = field(default_factory=dict)


class VecEnv(ABC):
    """A batch of ``num_envs`` environments of one task.

    Subclasses set ``num_envs``, ``observation_space`` (Dict space of one env), ``action_space``
    (space of one env) and implement ``reset``, ``step`` and ``close``. ``chunk_step`` has a
    correct default on top of ``step``; process-parallel backends override it to avoid round trips.
    """

    num_envs: int
    observation_space: gym.spaces.Dict
    action_space: gym.spaces.Space
    #: torch device of the returned arrays, or None for numpy arrays.
    device: str | None = None

    @abstractmethod
    def reset(self, seed: int | Sequence[int] | None = None) -> Obs:
        """Reset every env: with an int, env i is seeded with ``seed + i``; with a sequence of
        ``num_envs`` ints, env i with ``seed[i]`` (envs given the same seed start from the same
        initial state: GRPO groups); None leaves the envs' generators as they are."""

    @abstractmethod
    def step(self, actions: Array) -> StepResult:
        """Step every env once with ``actions`` of shape (N, A) (or (N,) for discrete)."""

    def chunk_step(self, actions: Array) -> ChunkStepResult:
        """Apply ``actions`` (N, C, A) step by step; see :class:`ChunkStepResult`.

        This default steps the whole batch C times (correct for batched simulators that cannot
        pause one env): after an env's episode ends at step j, its remaining actions still move
        the freshly reset env, but their rewards and dones are masked out (``valid`` False).
        """
        actions = self.check_chunk(actions)
        n, c = actions.shape[0], actions.shape[1]
        rewards = np.zeros((n, c), np.float32)
        terminated = np.zeros((n, c), bool)
        truncated = np.zeros((n, c), bool)
        valid = np.zeros((n, c), bool)
        ended = np.zeros(n, bool)
        final_obs: Obs | None = None
        ep = EpisodeStats(np.zeros(n, bool), np.zeros(n, np.float32), np.zeros(n, np.int64), None)
        info: dict[str, Any] = {}
        result = None
        for j in range(c):
            result = self.step(actions[:, j])
            live = ~ended
            valid[:, j] = live
            rewards[:, j] = np.where(live, to_numpy(result.reward), 0.0)
            term = to_numpy(result.terminated).astype(bool) & live
            trunc = to_numpy(result.truncated).astype(bool) & live
            terminated[:, j], truncated[:, j] = term, trunc
            just_done = term | trunc
            if just_done.any():
                final_obs = merge_rows(final_obs, result.final_obs, just_done)
                ep = merge_episode_stats(ep, result.episodes, just_done)
            if "success" in result.info:
                succ = to_numpy(result.info["success"]).astype(bool)
                prev = info.get("success", np.zeros(n, bool))
                info["success"] = np.where(live, succ, prev)
            ended |= just_done
        assert result is not None
        return ChunkStepResult(result.obs, rewards, terminated, truncated, valid, final_obs, ep, info)

    def check_step(self, actions: Array) -> Array:
        """Validate one step's actions, shape (N, *action_shape); a clear error otherwise."""
        shape = tuple(getattr(actions, "shape", np.shape(actions)))
        act_shape = tuple(self.action_space.shape or ())
        if shape != (self.num_envs, *act_shape):
            raise UserError(
                f"step expects actions of shape (num_envs={self.num_envs}, *{act_shape}), got {shape}. "
                f"Check the policy's action dim against the env's action space {self.action_space}."
            )
        return actions

    def check_chunk(self, actions: Array) -> Array:
        """Validate a chunk's shape (N, C, *action_shape); a clear error otherwise."""
        shape = tuple(actions.shape)
        act_shape = tuple(self.action_space.shape or ())
        if len(shape) != 2 + len(act_shape) or shape[0] != self.num_envs or shape[2:] != act_shape:
            raise UserError(
                f"chunk_step expects actions of shape (num_envs={self.num_envs}, chunk, "
                f"*{act_shape}), got {shape}. Check the policy's action chunk and action dim "
                f"against the env's action space {self.action_space}."
            )
        return actions

    @property
    def instructions(self) -> list[str] | None:
        """The task's language instruction per env (for VLA prompts), or None."""
        return None

    def render(self) -> np.ndarray | None:
        """RGB frames of every env, (N, H, W, 3) uint8, or None if the env cannot render."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release simulators and worker processes. Safe to call twice."""

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def env_seeds(seed: int | Sequence[int] | None, num_envs: int) -> list[int | None]:
    """The seed of each of ``num_envs`` envs for ``VecEnv.reset(seed)`` (see there)."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = [int(s) for s in seed]
    if len(seeds) != num_envs:
        raise ValueError(f"reset got {len(seeds)} seeds for {num_envs} envs")
    return seeds


def random_actions(space: gym.Space, lead: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Uniform random actions of one env's ``space`` with leading dims ``lead`` (e.g. ``(num_envs,)``
    or ``(steps, num_envs)``): float32 in a Box's bounds, integers of a Discrete."""
    if hasattr(space, "low"):
        return rng.uniform(space.low, space.high, size=(*lead, *space.shape)).astype(np.float32)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start) + rng.integers(0, space.n, size=lead)
    raise TypeError(f"random actions of a Box or a Discrete space, not {space}")


def to_numpy(x: Array) -> np.ndarray:
    """A numpy view of ``x`` (torch tensors are moved to CPU)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def merge_rows(base: Obs | None, new: Obs | None, rows: np.ndarray) -> Obs | None:
    """Copy ``new[k][rows]`` into ``base[k][rows]`` for every key (allocating ``base`` if None)."""
    if new is None:
        return base
    if base is None:
        base = {k: to_numpy(v).copy() for k, v in new.items()}
        return base
    for k, v in new.items():
        base[k][rows] = to_numpy(v)[rows]
    return base


def merge_episode_stats(base: EpisodeStats, new: EpisodeStats, rows: np.ndarray) -> EpisodeStats:
    """Copy the stats of ``rows`` from ``new`` into ``base``."""
    base.done[rows] = True
    base.episode_return[rows] = new.episode_return[rows]
    base.length[rows] = new.length[rows]
    if new.success is not None:
        if base.success is None:
            base.success = np.zeros_like(base.done)
        base.success[rows] = new.success[rows]
    return base
