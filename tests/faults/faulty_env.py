"""CartPole that misbehaves on request: the env the fault-injection suite trains on.

``env.id=tests.faults.faulty_env:FaultyCartPole`` with ``env.kwargs``:

* ``fault``: ``none``, ``raise_step``, ``raise_reset``, ``nan_obs``, ``inf_reward``, ``hang_step``,
  ``hang_reset``.
* ``fault_seed``: only the env first reset with this seed misbehaves (env i of a run with
  ``seed=0`` on one env worker is seeded with i, in training and in profiling alike).
* ``trigger``: a path; the fault is armed only once that file exists (the test creates it
  mid-run). Without one it is armed from the start (during profiling).
* ``at_step``: the step of an episode at which an armed step fault fires (every episode).
* ``delay_s``: seconds every step sleeps (long iterations for signal tests).
"""

from __future__ import annotations

import os
import time

import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

FAULTS = ("none", "raise_step", "raise_reset", "nan_obs", "inf_reward", "hang_step", "hang_reset")


class FaultyCartPole(CartPoleEnv):
    def __init__(self, fault: str = "none", fault_seed: int | None = None, trigger: str | None = None,
                 at_step: int = 5, delay_s: float = 0.0, **kwargs) -> None:
        assert fault in FAULTS, fault
        super().__init__(**kwargs)
        self.fault, self.fault_seed, self.trigger = fault, fault_seed, trigger
        self.at_step, self.delay_s = at_step, delay_s
        self.first_seed: int | None = None
        self.t = 0

    def armed(self) -> bool:
        chosen = self.fault_seed is None or self.first_seed == self.fault_seed
        return chosen and (self.trigger is None or os.path.exists(self.trigger))

    def reset(self, *, seed=None, options=None):
        if self.first_seed is None and seed is not None:
            self.first_seed = seed
        if self.armed() and self.fault == "raise_reset":
            raise RuntimeError("the simulator could not load its scene")
        if self.armed() and self.fault == "hang_reset":
            time.sleep(3600)
        self.t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.delay_s:
            time.sleep(self.delay_s)
        obs, reward, terminated, truncated, info = super().step(action)
        self.t += 1
        if self.t == self.at_step and self.armed():
            if self.fault == "raise_step":
                raise RuntimeError("the simulator's solver diverged")
            if self.fault == "hang_step":
                time.sleep(3600)
            if self.fault == "nan_obs":
                obs = np.array(obs, np.float32)
                obs[2] = np.nan
            if self.fault == "inf_reward":
                reward = float("inf")
        return obs, reward, terminated, truncated, info
