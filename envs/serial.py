"""``SerialVecEnv``: a batch of single gymnasium envs stepped in sequence in this process.

This is the in-process backend for CPU simulators and the engine inside every process of the
multiprocess backend. It implements the contract of :mod:`envs.base` exactly, including
``chunk_step`` that stops stepping an env once its episode ended inside the chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envs.base import ChunkStepResult, EpisodeStats, Obs, StepResult, VecEnv, to_numpy

EnvFn = Callable[[], gym.Env]


def obs_space_as_dict(space: gym.Space) -> gym.spaces.Dict:
    """The contract's Dict observation space for a single env's space (Box -> {"state": Box})."""
    if isinstance(space, gym.spaces.Dict):
        return space
    if isinstance(space, gym.spaces.Box):
        return gym.spaces.Dict({"state": gym.spaces.Box(space.low, space.high, space.shape, np.float32)})
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.Dict({"state": gym.spaces.Box(0, space.n - 1, (1,), np.float32)})
    raise TypeError(f"observation space {space} is not supported; return a Box or a Dict of Boxes")


def obs_as_dict(obs: Any) -> dict[str, np.ndarray]:
    """One env's observation as the contract's dict (state as float32)."""
    if isinstance(obs, dict):
        return {k: np.asarray(to_numpy(v)) for k, v in obs.items()}
    arr = np.asarray(to_numpy(obs))
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return {"state": arr.astype(np.float32, copy=False)}


def success_of(info: dict[str, Any]) -> bool | None:
    """The success flag of one env's info (``success`` as in ManiSkill/Meta-World, or ``is_success``)."""
    for key in ("success", "is_success"):
        if key in info:
            return bool(np.asarray(to_numpy(info[key])).reshape(-1)[0])
    return None


class SerialVecEnv(VecEnv):
    """``len(env_fns)`` gymnasium envs stepped one after another, with auto-reset."""

    def __init__(self, env_fns: Sequence[EnvFn], instructions: Sequence[str] | None = None) -> None:
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.observation_space = obs_space_as_dict(first.observation_space)
        self.action_space = first.action_space
        self._instructions = list(instructions) if instructions is not None else None
        self._returns = np.zeros(self.num_envs, np.float64)
        self._lengths = np.zeros(self.num_envs, np.int64)
        self._seed: int | None = None
        self._episode_count = np.zeros(self.num_envs, np.int64)
        self._has_success = False
        self._closed = False

    # --- helpers -------------------------------------------------------------------------------
    def _reset_one(self, i: int, seed: int | None = None) -> dict[str, np.ndarray]:
        obs, _ = self.envs[i].reset(seed=seed)
        self._returns[i] = 0.0
        self._lengths[i] = 0
        return obs_as_dict(obs)

    def _stack(self, rows: list[dict[str, np.ndarray]]) -> Obs:
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    def _step_one(self, i: int, action: Any) -> tuple[dict, float, bool, bool, bool | None]:
        obs, reward, terminated, truncated, info = self.envs[i].step(action)
        reward = float(reward)
        self._returns[i] += reward
        self._lengths[i] += 1
        success = success_of(info)
        if success is not None:
            self._has_success = True
        return obs_as_dict(obs), reward, bool(terminated), bool(truncated), success

    # --- contract ------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Obs:
        self._seed = seed
        return self._stack([self._reset_one(i, None if seed is None else seed + i) for i in range(self.num_envs)])

    def step(self, actions: Any) -> StepResult:
        """One step is a chunk of one action: the same per-env loop, auto-reset and episode stats."""
        chunk = self.chunk_step(to_numpy(self.check_step(actions))[:, None])
        return StepResult(
            obs=chunk.obs,
            reward=chunk.rewards[:, 0],
            terminated=chunk.terminated[:, 0],
            truncated=chunk.truncated[:, 0],
            final_obs=chunk.final_obs,
            episodes=chunk.episodes,
            info=chunk.info,
        )

    def chunk_step(self, actions: Any) -> ChunkStepResult:
        actions = to_numpy(self.check_chunk(actions))
        n, c = actions.shape[0], actions.shape[1]
        rewards = np.zeros((n, c), np.float32)
        terminated = np.zeros((n, c), bool)
        truncated = np.zeros((n, c), bool)
        valid = np.zeros((n, c), bool)
        success = np.zeros(n, bool)
        episodes = EpisodeStats(np.zeros(n, bool), np.zeros(n, np.float32), np.zeros(n, np.int64), None)
        final_rows: dict[int, dict[str, np.ndarray]] = {}
        rows: list[dict[str, np.ndarray]] = []
        for i in range(n):
            obs = None
            for j in range(c):
                obs, r, term, trunc, succ = self._step_one(i, actions[i, j])
                rewards[i, j], terminated[i, j], truncated[i, j], valid[i, j] = r, term, trunc, True
                success[i] = bool(succ)
                if term or trunc:
                    self._finish_episode(i, succ, episodes)
                    final_rows[i] = obs
                    obs = self._reset_one(i)
                    break  # the rest of the chunk belonged to an episode that is over
            rows.append(obs)
        return ChunkStepResult(
            obs=self._stack(rows),
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            valid=valid,
            final_obs=self._final(final_rows, rows),
            episodes=self._with_success(episodes),
            info={"success": success} if self._has_success else {},
        )

    def _finish_episode(self, i: int, success: bool | None, episodes: EpisodeStats) -> None:
        episodes.done[i] = True
        episodes.episode_return[i] = self._returns[i]
        episodes.length[i] = self._lengths[i]
        if success is not None:
            if episodes.success is None:
                episodes.success = np.zeros(self.num_envs, bool)
            episodes.success[i] = success
        self._episode_count[i] += 1

    def _with_success(self, episodes: EpisodeStats) -> EpisodeStats:
        if self._has_success and episodes.success is None:
            episodes.success = np.zeros(self.num_envs, bool)
        return episodes

    def _final(self, final_rows: dict[int, dict[str, np.ndarray]], rows: list[dict[str, np.ndarray]]) -> Obs | None:
        if not final_rows:
            return None
        # Rows of envs that did not finish are filled with their current obs (not meaningful).
        return self._stack([final_rows.get(i, rows[i]) for i in range(self.num_envs)])

    @property
    def instructions(self) -> list[str] | None:
        return self._instructions

    def render(self) -> np.ndarray | None:
        frames = [env.render() for env in self.envs]
        if any(f is None for f in frames):
            return None
        return np.stack([np.asarray(f) for f in frames])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for env in self.envs:
            env.close()
