"""Meta-World's own scripted experts (``metaworld.policies``, one per task) as ``embodied demos``
runs them: on the 39-dimensional ``state`` of the project's Meta-World adapter
(:class:`envs.adapters.metaworld_adapter.MetaWorldEnv`), the same vector a state policy sees.

    tasks = tasks_of("metaworld_mt10")                 # 10 ExpertTasks, Meta-World's order
    env = make_env(tasks[0], "rgb", image_size=64, max_episode_steps=500)
    expert = make_expert(tasks[0])
    obs, _ = env.reset(seed=0)
    expert.reset(env)
    action = expert(env, obs)                          # (4,) float32 in [-1, 1]

For ``obs_mode`` ``rgb`` the env renders frames and still returns ``state`` (it is built with
``state+rgb``): the policy reads the state, and :func:`recorded_keys` says which keys the demo
file keeps (``rgb`` alone, as the adapter's ``rgb`` contract shows a policy).
"""

from __future__ import annotations

import numpy as np

from envs.adapters.metaworld_adapter import INSTRUCTIONS, MAX_EPISODE_STEPS, MetaWorldEnv, expert, parse_id
from envs.experts import Expert, ExpertTask

#: The camera the adapter renders by default (``env.kwargs.camera``); the demo files name it.
CAMERA = "corner"
#: Episodes run up to Meta-World's own ``max_path_length``: some experts need 300+ steps.
DEFAULT_MAX_EPISODE_STEPS = MAX_EPISODE_STEPS


def tasks_of(env_id: str) -> list[ExpertTask]:
    """The tasks ``env_id`` selects (``metaworld/<task>``, ``metaworld_mt10``, ``metaworld_mt50``, ...)."""
    return [ExpertTask(f"metaworld/{name}", name, INSTRUCTIONS[name]) for name in parse_id(env_id)]


def recorded_keys(obs_mode: str) -> tuple[str, ...]:
    """The contract's observation keys of ``obs_mode``: ``state`` (39,), ``rgb`` frames, or both."""
    return {"state": ("state",), "rgb": ("rgb",), "state+rgb": ("state", "rgb")}[obs_mode]


def make_env(task: ExpertTask, obs_mode: str, image_size: int, max_episode_steps: int) -> MetaWorldEnv:
    """One env of ``task`` whose observations hold ``state`` (for the expert) and, unless
    ``obs_mode`` is ``state``, ``rgb``. Its layouts follow the adapter's rule for a lone task:
    reset with seed ``s`` starts from layout ``s mod 50``."""
    mode = "state" if obs_mode == "state" else "state+rgb"
    return MetaWorldEnv(task.name, obs_mode=mode, image_size=image_size, max_episode_steps=max_episode_steps, camera=CAMERA)


class MetaWorldExpert:
    """Meta-World's scripted policy of one task (:class:`envs.experts.Expert`): a function of
    ``obs["state"]`` alone, so ``reset`` has nothing to forget."""

    def __init__(self, task: ExpertTask) -> None:
        self.task = task
        self.policy = expert(task.name)

    def reset(self, env: MetaWorldEnv) -> None:
        pass

    def __call__(self, env: MetaWorldEnv, obs: dict[str, np.ndarray]) -> np.ndarray:
        return np.clip(self.policy.get_action(obs["state"]), -1.0, 1.0).astype(np.float32)


def make_expert(task: ExpertTask) -> Expert:
    """Meta-World's scripted policy of ``task``, acting on ``obs["state"]``."""
    return MetaWorldExpert(task)
