"""A continuous-control env that exists only in the tests: move a point to a target on a line.

obs = [position, target] in [-1, 1]; action = velocity in [-1, 1]; reward = -|position - target|;
truncated after 40 steps (no termination), so learning depends on bootstrapping truncation right.
A random policy scores about -25 per episode; a good one about -4.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class Reach1D(gym.Env):
    def __init__(self, horizon: int = 40, speed: float = 0.1, delay_s: float = 0.0, delay_after_steps: int = 0) -> None:
        # delay_s / delay_after_steps: each step sleeps delay_s once this env made that many steps
        # (a simulator that slows down mid-run, to exercise re-planning).
        self.horizon, self.speed = horizon, speed
        self.delay_s, self.delay_after_steps, self.steps_made = delay_s, delay_after_steps, 0
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.target = self.np_random.uniform(-1, 1, size=2)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.pos, self.target], np.float32)

    def step(self, action):
        self.steps_made += 1
        if self.delay_s and self.steps_made > self.delay_after_steps:
            time.sleep(self.delay_s)
        self.pos = float(np.clip(self.pos + self.speed * float(np.clip(action[0], -1, 1)), -1, 1))
        self.t += 1
        dist = abs(self.pos - self.target)
        return self._obs(), -dist, False, self.t >= self.horizon, {"success": dist < 0.05}
