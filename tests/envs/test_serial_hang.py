"""The in-process backend bounds every call of its envs (``env.timeout_s``): an env that hangs is an
:class:`~envs.serial.EnvTimeout` naming the env (id, index, seed) and what it was doing, with the
hung thread's Python stack in the log, as the multiprocess backend's env processes are."""

from __future__ import annotations

import logging
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from embodied.errors import exit_code_of
from envs.config import EnvConfig
from envs.registry import make_vec_env
from envs.serial import EnvTimeout, SerialVecEnv

HERE = "tests.envs.test_serial_hang"


class SleepsAtStep(gym.Env):
    """Sleeps ``sleep_s`` in step ``at_step`` of the env first reset with seed ``hang_seed``."""

    def __init__(self, hang_seed: int = 1, at_step: int = 3, sleep_s: float = 30.0) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.hang_seed, self.at_step, self.sleep_s = hang_seed, at_step, sleep_s
        self.first_seed = None
        self.t = 0
        self.thread: str | None = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.first_seed is None:
            self.first_seed = seed
        self.t = 0
        self.thread = threading.current_thread().name
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.first_seed == self.hang_seed and self.t == self.at_step:
            time.sleep(self.sleep_s)
        return np.zeros(2, np.float32), 1.0, False, self.t >= 50, {}


def test_an_env_that_hangs_in_step_is_named_within_the_timeout(caplog):
    env = make_vec_env(EnvConfig(id=f"{HERE}:SleepsAtStep", num_envs=3, backend="inprocess", timeout_s=0.5), seed=0)
    assert isinstance(env, SerialVecEnv) and env.timeout_s == 0.5
    env.reset(seed=0)
    actions = np.zeros(3, np.int64)
    env.step(actions)
    env.step(actions)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="envs.serial"), pytest.raises(EnvTimeout) as caught:
        env.step(actions)
    assert time.monotonic() - t0 < 5
    err = caught.value
    assert str(err).startswith(f"env {HERE}:SleepsAtStep (env index 1, seed 1) did not return within 0.5 s "
                               "(env.timeout_s) while stepping (step()). This is a failure of the env"), str(err)
    assert err.where["env_index"] == 1 and err.where["seed"] == 1 and exit_code_of(err) == 5
    assert "test_serial_hang.py" in caplog.text and "in step" in caplog.text  # the hung thread's stack
    with pytest.raises(EnvTimeout):  # the VecEnv stays broken; nothing waits again
        env.step(actions)
    t0 = time.monotonic()
    env.close()  # does not wait for the hung env
    assert time.monotonic() - t0 < 1


def test_the_envs_live_in_one_thread_and_work_as_before():
    env = make_vec_env(EnvConfig(id=f"{HERE}:SleepsAtStep", num_envs=2, backend="inprocess", timeout_s=5,
                                 kwargs={"hang_seed": 99}), seed=0)
    obs = env.reset(seed=0)
    assert obs["state"].shape == (2, 2)
    total = 0.0
    for _ in range(60):
        result = env.step(np.zeros(2, np.int64))
        total += float(result.reward.sum())
    assert total == 120.0 and result.episodes is not None
    names = {e.unwrapped.thread for e in env.envs}
    assert len(names) == 1 and names != {threading.current_thread().name}  # built, reset and stepped there
    env.close()


def test_an_env_error_still_names_the_env():
    class Raises(SleepsAtStep):
        def step(self, action):
            raise ValueError("bad action")

    env = SerialVecEnv([Raises, Raises], env_id="raises", timeout_s=5)
    env.reset(seed=4)
    with pytest.raises(Exception, match=r"env raises \(env index 0, seed 4\) raised ValueError: bad action"):
        env.step(np.zeros(2, np.int64))
    env.close()
