"""Tasks of the MJX simulator (``env.id=mjx/<Task>``): gymnasium's MuJoCo v5 tasks in JAX.

Each task is gymnasium's own MJCF file (shipped under ``gymnasium/envs/mujoco/assets/``) with the
v5 reward, termination, observation and reset distribution reimplemented as pure functions of ONE
env's ``mjx.Data``; :class:`envs.adapters.mjx_adapter.MjxEnv` vmaps them over the batch and jits
the step. Importing this package imports JAX: the adapter imports it only when it builds an env.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import gymnasium
import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from embodied.registry import Registry

#: gymnasium's MuJoCo assets: the MJCF files its v5 tasks load.
GYMNASIUM_ASSETS = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")


class MjxTask(ABC):
    """One task: its model file, control rate, time limit, and the per-env functions of its MDP.

    ``reward_kwargs`` are the task's gymnasium-v5 keyword arguments (``ctrl_cost_weight``, ...);
    the defaults are gymnasium's. Every method works on ONE env (unbatched ``mjx.Data``,
    actions ``(A,)``); the env vmaps them.
    """

    xml: ClassVar[str]
    """The MJCF file name under gymnasium's MuJoCo assets."""
    frame_skip: ClassVar[int]
    """Physics steps per env step (gymnasium's ``frame_skip``): ``dt = frame_skip * timestep``."""
    max_episode_steps: ClassVar[int]
    """gymnasium's registered time limit."""
    obs_size: ClassVar[int]
    """Length of one env's observation vector."""
    defaults: ClassVar[dict[str, float]] = {}
    """The task's keyword arguments (``env.kwargs``) and their gymnasium-v5 defaults."""

    def __init__(self, model: mujoco.MjModel, **kwargs: float) -> None:
        unknown = sorted(set(kwargs) - set(self.defaults))
        if unknown:
            from embodied.errors import UserError, did_you_mean

            raise UserError(f"mjx/{type(self).__name__} has no option {unknown[0]!r}.{did_you_mean(unknown[0], self.defaults)} "
                            f"Its options (env.kwargs): {', '.join(sorted(self.defaults)) or '(none)'}; and the "
                            "simulator's: device, solver_iterations, ls_iterations.")
        self.params = {**self.defaults, **{k: float(v) for k, v in kwargs.items()}}
        self.dt = float(model.opt.timestep) * self.frame_skip
        self.init_qpos = jnp.asarray(model.qpos0, jnp.float32)  # (nq,)
        self.init_qvel = jnp.zeros(model.nv, jnp.float32)  # (nv,)

    @classmethod
    def load_model(cls) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_path(os.path.join(GYMNASIUM_ASSETS, cls.xml))

    @abstractmethod
    def initial_state(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(qpos (nq,), qvel (nv,))`` of a new episode, drawn with ``key``."""

    @abstractmethod
    def observe(self, data: Any) -> jax.Array:
        """The observation ``(obs_size,)`` float32 of one env's ``mjx.Data``."""

    @abstractmethod
    def reward(self, before: Any, after: Any, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(reward (), terminated () bool)`` of the step ``before -> after`` under ``action (A,)``."""


TASKS: Registry[type[MjxTask]] = Registry("MJX task")


def observation_bounds(task: MjxTask) -> tuple[np.ndarray, np.ndarray]:
    """Unbounded, as gymnasium's MuJoCo tasks declare."""
    return np.full(task.obs_size, -np.inf, np.float32), np.full(task.obs_size, np.inf, np.float32)


from envs.mjx_tasks import locomotion, reacher  # noqa: E402,F401  (registers the tasks)
