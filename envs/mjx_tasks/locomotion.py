"""Locomotion: HalfCheetah-v5 (no termination) and Hopper-v5 (terminates when unhealthy).

The formulas are gymnasium's v5 ones (``gymnasium/envs/mujoco/half_cheetah_v5.py``,
``hopper_v5.py``): reward = forward velocity of the root - control cost (+ a healthy reward for
Hopper), observations exclude the root's x position.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from envs.mjx_tasks import TASKS, MjxTask


def _forward_velocity(before: Any, after: Any, dt: float) -> jax.Array:
    return (after.qpos[0] - before.qpos[0]) / dt


@TASKS.register("HalfCheetah")
class HalfCheetah(MjxTask):
    """HalfCheetah-v5: run forward; reward = x velocity - 0.1 |a|^2; 1000 steps, never terminates."""

    xml = "half_cheetah.xml"
    frame_skip = 5
    max_episode_steps = 1000
    obs_size = 17  # qpos[1:] (8) + qvel (9)
    defaults = {"forward_reward_weight": 1.0, "ctrl_cost_weight": 0.1, "reset_noise_scale": 0.1}

    def initial_state(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        noise = self.params["reset_noise_scale"]
        k_pos, k_vel = jax.random.split(key)
        qpos = self.init_qpos + jax.random.uniform(k_pos, self.init_qpos.shape, minval=-noise, maxval=noise)
        qvel = self.init_qvel + noise * jax.random.normal(k_vel, self.init_qvel.shape)
        return qpos, qvel

    def observe(self, data: Any) -> jax.Array:
        return jnp.concatenate([data.qpos[1:], data.qvel]).astype(jnp.float32)

    def reward(self, before: Any, after: Any, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        forward = self.params["forward_reward_weight"] * _forward_velocity(before, after, self.dt)
        ctrl_cost = self.params["ctrl_cost_weight"] * jnp.sum(jnp.square(action))
        return forward - ctrl_cost, jnp.zeros((), bool)


@TASKS.register("Hopper")
class Hopper(MjxTask):
    """Hopper-v5: hop forward; reward = x velocity + 1 (healthy) - 1e-3 |a|^2; terminates when it falls."""

    xml = "hopper.xml"
    frame_skip = 4
    max_episode_steps = 1000
    obs_size = 11  # qpos[1:] (5) + clip(qvel, -10, 10) (6)
    defaults = {
        "forward_reward_weight": 1.0, "ctrl_cost_weight": 1e-3, "healthy_reward": 1.0, "terminate_when_unhealthy": 1.0,
        "healthy_state_max": 100.0, "healthy_z_min": 0.7, "healthy_angle_max": 0.2, "reset_noise_scale": 5e-3,
    }

    def initial_state(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        noise = self.params["reset_noise_scale"]
        k_pos, k_vel = jax.random.split(key)
        qpos = self.init_qpos + jax.random.uniform(k_pos, self.init_qpos.shape, minval=-noise, maxval=noise)
        qvel = self.init_qvel + jax.random.uniform(k_vel, self.init_qvel.shape, minval=-noise, maxval=noise)
        return qpos, qvel

    def observe(self, data: Any) -> jax.Array:
        return jnp.concatenate([data.qpos[1:], jnp.clip(data.qvel, -10.0, 10.0)]).astype(jnp.float32)

    def is_healthy(self, data: Any) -> jax.Array:
        """gymnasium's ``is_healthy``: |state[2:]| < 100, z > 0.7, |torso angle| < 0.2."""
        p = self.params
        z, angle = data.qpos[1], data.qpos[2]
        state = jnp.concatenate([data.qpos, data.qvel])[2:]
        healthy_state = jnp.all(jnp.abs(state) < p["healthy_state_max"])
        return healthy_state & (z > p["healthy_z_min"]) & (jnp.abs(angle) < p["healthy_angle_max"])

    def reward(self, before: Any, after: Any, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        p = self.params
        healthy = self.is_healthy(after)
        forward = p["forward_reward_weight"] * _forward_velocity(before, after, self.dt)
        ctrl_cost = p["ctrl_cost_weight"] * jnp.sum(jnp.square(action))
        reward = forward + p["healthy_reward"] * healthy - ctrl_cost
        return reward, ~healthy & (p["terminate_when_unhealthy"] > 0)
