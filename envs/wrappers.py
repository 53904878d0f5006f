"""Single-env gymnasium wrappers applied by the adapters from :class:`~envs.config.EnvConfig`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from embodied.errors import UserError


class IgnoreTerminations(gym.Wrapper):
    """Drops ``terminated``: every episode runs to its time limit (ManiSkill's ``ignore_terminations``).

    Success then means success *at the end* of the episode, and an agent is rewarded for holding a
    goal state instead of ending the episode at the first touch of it. The time limit must exist.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if _time_limit(env) is None:
            raise UserError(
                f"env.ignore_terminations=true needs a time limit, and {env.spec.id if env.spec else env!r} has none: "
                "set env.max_episode_steps=N."
            )

    def step(self, action: Any):
        obs, reward, _terminated, truncated, info = self.env.step(action)
        return obs, reward, False, truncated, info


def _time_limit(env: gym.Env) -> int | None:
    inner: Any = env
    while inner is not None:
        limit = getattr(inner, "_max_episode_steps", None)  # gymnasium's TimeLimit, ManiSkill's TimeLimitWrapper
        if isinstance(limit, int) and limit > 0:
            return limit
        spec = getattr(inner, "spec", None)
        if spec is not None and spec.max_episode_steps:
            return spec.max_episode_steps
        inner = getattr(inner, "env", None)
    return None


class WithoutTerminations:
    """A picklable env factory: ``fn()`` wrapped in :class:`IgnoreTerminations` (for worker processes)."""

    def __init__(self, fn: Callable[[], gym.Env]) -> None:
        self.fn = fn

    def __call__(self) -> gym.Env:
        return IgnoreTerminations(self.fn())
