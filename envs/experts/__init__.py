"""Scripted experts: demonstrators that read a simulator's privileged state.

* :mod:`envs.experts.maniskill`: stage machines on ManiSkill's ground truth (PushCube, PickCube, StackCube);
* :mod:`envs.experts.metaworld`: Meta-World's own scripted policies (``metaworld.policies``);
* :mod:`envs.experts.libero`: LIBERO experts on privileged object poses.

``embodied demos`` records them (:mod:`pipelines.demo_sources` holds the registry of sources).
A source that runs one gymnasium env per task, as Meta-World's and LIBERO's do, gives these two
things, which this module names so that expert modules need nothing from ``pipelines``:

* :class:`ExpertTask`: one task an id selects (``metaworld_mt10`` selects ten), with its instruction;
* :class:`Expert`: ``expert.reset(env)`` after every ``env.reset(seed=...)``, then
  ``expert(env, obs) -> action (A,) float32`` every step, where ``env`` is the episode's env (its
  privileged state through ``env.unwrapped``) and ``obs`` its latest observation in the env
  contract's keys (``state``, ``rgb``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class ExpertTask:
    """One task of an id: what its episodes run and what a policy is told."""

    env_id: str
    """The id of this one task (``metaworld/reach-v3``): ``env.id`` of a recipe that trains it alone."""
    name: str
    """The task's own name (``reach-v3``)."""
    instruction: str
    """The language instruction a policy gets for it."""


class Expert(Protocol):
    """A task's scripted expert: one per task, reset at the start of every episode."""

    def reset(self, env: Any) -> None:
        """A new episode of ``env`` has just been reset: forget the last one."""
        ...

    def __call__(self, env: Any, obs: dict[str, np.ndarray]) -> np.ndarray:
        """The action (A,) float32 for ``env``'s current state (``obs`` its latest observation)."""
        ...
