"""The shared-memory block of one ``step``: actions, observations, rewards, dones and success.

:class:`StepBuffers` lays the batch arrays of a step out in one block, env-major, so worker i
writes its rows ``start:end`` and the parent copies whole arrays out without concatenating. A
result that does not fit the layout (final observations, finished-episode stats, unexpected keys
or dtypes) comes back as the worker's "extras", which :meth:`StepBuffers.read` merges in. The
block also holds each worker's :class:`~envs.multiprocess.doorbell.Doorbell` row.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import gymnasium as gym
import numpy as np

from envs.base import EpisodeStats, Obs, StepResult
from envs.multiprocess.concat import concat_episodes, concat_final, concat_info, concat_obs
from envs.multiprocess.doorbell import Doorbell


class StepBuffers:
    """Batch arrays of one ``step`` in one shared-memory block: (N, ...) each, env-major.

    ``actions`` (N, *act_shape), ``obs[key]`` (N, *shape) for every Box key of the observation
    space, ``reward`` (N,) float32, ``terminated``/``truncated``/``success`` (N,) bool. Worker i
    writes rows ``start:end``; the parent copies whole arrays out, so no concatenation is needed.
    ``ctrl`` (P, 8) int64 holds each worker's :class:`Doorbell`, one 64-byte cache line per worker.
    """

    def __init__(self, shm: SharedMemory, layout: list[tuple[str, int, tuple[int, ...], str]], owner: bool) -> None:
        self.shm = shm
        self.layout = layout
        self.owner = owner
        self.arrays: dict[str, np.ndarray] = {
            name: np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=offset) for name, offset, shape, dtype in layout
        }
        self.actions = self.arrays["actions"]
        self.reward = self.arrays["reward"]
        self.terminated = self.arrays["terminated"]
        self.truncated = self.arrays["truncated"]
        self.success = self.arrays["success"]
        self.ctrl = self.arrays["ctrl"]
        self.obs = {name[4:]: arr for name, arr in self.arrays.items() if name.startswith("obs/")}

    @staticmethod
    def create(
        num_envs: int, observation_space: gym.spaces.Dict, action_space: gym.Space, num_procs: int = 1
    ) -> StepBuffers | None:
        """Allocate the block for these spaces, or None when a space has no fixed array layout."""
        fields: list[tuple[str, tuple[int, ...], np.dtype]] = [("ctrl", (num_procs, Doorbell.SLOTS), np.dtype(np.int64))]
        if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            return None
        fields.append(("actions", (num_envs, *(action_space.shape or ())), np.dtype(action_space.dtype)))
        for key, space in observation_space.spaces.items():
            if not isinstance(space, gym.spaces.Box):
                return None
            fields.append((f"obs/{key}", (num_envs, *space.shape), np.dtype(space.dtype)))
        fields += [
            ("reward", (num_envs,), np.dtype(np.float32)),
            ("terminated", (num_envs,), np.dtype(bool)),
            ("truncated", (num_envs,), np.dtype(bool)),
            ("success", (num_envs,), np.dtype(bool)),
        ]
        layout, offset = [], 0
        for name, shape, dtype in fields:
            layout.append((name, offset, shape, dtype.str))
            offset += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64  # 64-byte aligned slots
        try:
            shm = SharedMemory(create=True, size=max(offset, 64))
        except OSError as err:  # e.g. a small /dev/shm in a container: fall back to pickled steps
            warnings.warn(f"MultiprocessVecEnv: no shared memory of {offset} bytes ({err}); steps go through pipes.", stacklevel=3)
            return None
        return StepBuffers(shm, layout, owner=True)

    @staticmethod
    def attach(name: str, layout: list[tuple[str, int, tuple[int, ...], str]]) -> StepBuffers:
        return StepBuffers(SharedMemory(name=name), layout, owner=False)

    def spec(self) -> tuple[str, list[tuple[str, int, tuple[int, ...], str]]]:
        return self.shm.name, self.layout

    def release_name(self) -> None:
        """Remove the block's name once every process that needs it has attached: the memory
        lives on while any process maps it and goes with the last one, however the processes
        end. (Named until closed, a block outlived owners killed without closing it: Ray kills a
        plan's workers when a run switches plans, and their resource trackers with them; a day
        of sweeps and tests left 346 blocks in /dev/shm.)"""
        if self.owner:
            self.shm.unlink()
            self.owner = False

    # worker side
    def write(self, result: StepResult, start: int, end: int) -> dict[str, Any]:
        """Write ``result`` (rows start:end) into the block; returns what did not fit (usually {})."""
        extras: dict[str, Any] = {}
        rows = {k: view[start:end] for k, view in self.obs.items()}
        if result.obs.keys() == rows.keys() and all(v.dtype == rows[k].dtype and v.shape == rows[k].shape for k, v in result.obs.items()):
            for k, v in result.obs.items():
                rows[k][...] = v
        else:
            extras["obs"] = result.obs
        self.reward[start:end] = result.reward
        self.terminated[start:end] = result.terminated
        self.truncated[start:end] = result.truncated
        info = dict(result.info)
        if "success" in info:
            self.success[start:end] = info.pop("success")
            extras["has_success"] = True
        if info:
            extras["info"] = info
        if result.final_obs is not None or result.episodes.done.any():
            extras["final_obs"] = result.final_obs
            extras["episodes"] = result.episodes
        return extras

    # parent side
    def read(self, extras: Sequence[dict[str, Any]], bounds: Sequence[tuple[int, int]]) -> StepResult:
        """The StepResult of all envs from the block (copied out) and the workers' extras."""
        has_success = False
        plain = True  # the common step: everything is in the block, no episode ended
        for ex in extras:
            if ex:
                has_success = has_success or ex.get("has_success", False)
                plain = plain and len(ex) == 1 and "has_success" in ex
        n = len(self.reward)
        if plain:
            obs = {k: v.copy() for k, v in self.obs.items()}
            final_obs = None
            episodes = _no_episodes(n, has_success)
            info = {}
        else:
            obs_rows = [self._obs_rows(ex, start, end) for ex, (start, end) in zip(extras, bounds)]
            obs = concat_obs(obs_rows) if any("obs" in ex for ex in extras) else {k: v.copy() for k, v in self.obs.items()}
            final_obs = concat_final([ex.get("final_obs") for ex in extras], obs_rows)
            episodes = concat_episodes(
                [ex.get("episodes") or _no_episodes(end - start, has_success) for ex, (start, end) in zip(extras, bounds)]
            )
            info = {}
            if any("info" in ex for ex in extras):
                info = concat_info([ex.get("info", {}) for ex in extras], [end - start for start, end in bounds])
        if has_success:
            info["success"] = self.success.copy()
        return StepResult(obs, self.reward.copy(), self.terminated.copy(), self.truncated.copy(), final_obs, episodes, info)

    def _obs_rows(self, extra: dict[str, Any], start: int, end: int) -> Obs:
        return extra["obs"] if "obs" in extra else {k: v[start:end] for k, v in self.obs.items()}

    def close(self) -> None:
        self.arrays, self.obs = {}, {}
        self.actions = self.reward = self.terminated = self.truncated = self.success = self.ctrl = None  # type: ignore[assignment]
        try:
            self.shm.close()
            if self.owner:
                self.shm.unlink()
        except (FileNotFoundError, BufferError):
            pass


def _no_episodes(n: int, has_success: bool) -> EpisodeStats:
    return EpisodeStats(np.zeros(n, bool), np.zeros(n, np.float32), np.zeros(n, np.int64), np.zeros(n, bool) if has_success else None)
