"""Manipulation: Reacher-v5, a two-link arm that brings its fingertip to a random target.

gymnasium's v5 formulas (``gymnasium/envs/mujoco/reacher_v5.py``): reward = -|fingertip - target|
- |a|^2, measured after the physics step; 50 steps; never terminates. The target is drawn
uniformly in the disc of radius 0.2 (gymnasium draws it by rejection from the square; the
distribution is the same).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import mujoco

from envs.mjx_tasks import TASKS, MjxTask


@TASKS.register("Reacher")
class Reacher(MjxTask):
    """Reacher-v5: reward = -distance(fingertip, target) - |a|^2; 50 steps, never terminates."""

    xml = "reacher.xml"
    frame_skip = 2
    max_episode_steps = 50
    obs_size = 10  # cos, sin of the 2 joints; target xy; 2 joint velocities; (fingertip - target) xy
    defaults = {"reward_dist_weight": 1.0, "reward_control_weight": 1.0}

    def __init__(self, model: mujoco.MjModel, **kwargs: float) -> None:
        super().__init__(model, **kwargs)
        self.fingertip = model.body("fingertip").id
        self.target = model.body("target").id

    def initial_state(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        k_pos, k_radius, k_angle, k_vel = jax.random.split(key, 4)
        qpos = self.init_qpos + jax.random.uniform(k_pos, self.init_qpos.shape, minval=-0.1, maxval=0.1)
        radius = 0.2 * jnp.sqrt(jax.random.uniform(k_radius))  # uniform in the disc
        angle = jax.random.uniform(k_angle, maxval=2 * jnp.pi)
        qpos = qpos.at[-2:].set(radius * jnp.array([jnp.cos(angle), jnp.sin(angle)]))
        qvel = self.init_qvel + jax.random.uniform(k_vel, self.init_qvel.shape, minval=-0.005, maxval=0.005)
        return qpos, qvel.at[-2:].set(0.0)

    def _to_target(self, data: Any) -> jax.Array:
        return data.xpos[self.fingertip] - data.xpos[self.target]  # (3,)

    def observe(self, data: Any) -> jax.Array:
        theta = data.qpos[:2]
        return jnp.concatenate([jnp.cos(theta), jnp.sin(theta), data.qpos[2:], data.qvel[:2],
                                self._to_target(data)[:2]]).astype(jnp.float32)

    def reward(self, before: Any, after: Any, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        distance = jnp.linalg.norm(self._to_target(after))
        ctrl = jnp.sum(jnp.square(action))
        reward = -self.params["reward_dist_weight"] * distance - self.params["reward_control_weight"] * ctrl
        return reward, jnp.zeros((), bool)

