"""A batched torch point-mass task in the Isaac Lab style (see envs/adapters/batched_adapter.py).

N point masses in the square [-1, 1]^2 each chase their own goal. Actions are 2-D velocity
commands in [-1, 1] (clipped), scaled by ``step_size`` per step. Observation (N, 4): position and
goal. Reward: minus the distance to the goal, plus ``success_bonus`` at the step the mass gets
within ``goal_radius`` (that step terminates the episode); truncation at ``max_episode_steps``.
Finished envs reset inside ``step``; ``info["final_obs"]`` holds their last observation.

An MLP policy learns it in seconds (the optimal action is the clipped direction to the goal).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch


class BatchedPointMass:
    """``num_envs`` 2-D point masses stepped together in torch."""

    is_vector_env = True

    def __init__(
        self,
        num_envs: int,
        device: str = "cpu",
        max_episode_steps: int = 50,
        step_size: float = 0.2,
        goal_radius: float = 0.1,
        success_bonus: float = 1.0,
        obs_as_dict: bool = False,
        seed: int = 0,
    ) -> None:
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.max_episode_steps = max_episode_steps
        self.step_size = step_size
        self.goal_radius = goal_radius
        self.success_bonus = success_bonus
        self.obs_as_dict = obs_as_dict  # Isaac Lab returns {"policy": obs}
        box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.single_observation_space = gym.spaces.Dict({"policy": box}) if obs_as_dict else box
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self.pos = torch.zeros(num_envs, 2, device=self.device)  # (N, 2)
        self.goal = torch.zeros(num_envs, 2, device=self.device)  # (N, 2)
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)  # (N,)

    def _sample(self, n: int) -> torch.Tensor:
        return torch.rand(n, 2, generator=self._gen, device=self.device) * 2.0 - 1.0

    def _reset_rows(self, rows: torch.Tensor) -> None:
        n = int(rows.sum())
        if n:
            self.pos[rows] = self._sample(n)
            self.goal[rows] = self._sample(n)
            self.steps[rows] = 0

    def _observe(self):
        obs = torch.cat([self.pos, self.goal], dim=1)  # (N, 4)
        return {"policy": obs} if self.obs_as_dict else obs

    def reset(self, seed: int | None = None):
        if seed is not None:
            self._gen.manual_seed(seed)
        self._reset_rows(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self._observe(), {}

    def step(self, actions: torch.Tensor):
        actions = actions.to(self.device).clamp(-1.0, 1.0)  # (N, 2)
        self.pos = (self.pos + self.step_size * actions).clamp(-1.0, 1.0)
        self.steps += 1
        dist = torch.linalg.vector_norm(self.goal - self.pos, dim=1)  # (N,)
        success = dist < self.goal_radius
        reward = -dist + self.success_bonus * success.float()
        terminated = success
        truncated = (self.steps >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        info = {"success": success}
        if bool(done.any()):
            info["final_obs"] = self._observe()  # a fresh tensor (torch.cat), untouched by the reset
            self._reset_rows(done)
        return self._observe(), reward, terminated, truncated, info

    def close(self) -> None:
        pass
