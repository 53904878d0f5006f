"""SerialVecEnv: a step is a chunk of one action (one code path), and shapes are checked."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from embodied.errors import UserError
from envs.config import EnvConfig
from envs.registry import make_vec_env


def test_step_equals_a_chunk_of_one_and_auto_resets():
    a = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=3, backend="inprocess"), seed=0)
    b = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=3, backend="inprocess"), seed=0)
    a.reset(seed=5), b.reset(seed=5)
    rng = np.random.default_rng(0)
    finished = 0
    for _ in range(60):
        actions = rng.integers(0, 2, size=3)
        s, c = a.step(actions), b.chunk_step(actions[:, None])
        np.testing.assert_array_equal(s.obs["state"], c.obs["state"])
        np.testing.assert_array_equal(s.reward, c.rewards[:, 0])
        np.testing.assert_array_equal(s.terminated, c.terminated[:, 0])
        finished += int(s.episodes.done.sum())
        if s.final_obs is not None:
            done = s.terminated | s.truncated
            np.testing.assert_array_equal(s.final_obs["state"][done], c.final_obs["state"][done])
    assert finished > 0  # episodes ended and auto-reset along the way
    a.close(), b.close()


@pytest.mark.parametrize("shape", [(2,), (3, 1), (3, 2)])
def test_step_with_wrong_action_shape_is_a_user_error(shape):
    env = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=3, backend="inprocess"), seed=0)
    env.reset(seed=0)
    with pytest.raises(UserError, match=r"step expects actions of shape \(num_envs=3"):
        env.step(np.zeros(shape, np.int64))
    env.close()


class FallsAtOnce(gym.Env):
    """Terminates on every step with success=True; has no time limit of its own."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, True, False, {"success": True}


@pytest.mark.parametrize("backend", ["inprocess", "multiprocess"])
def test_ignore_terminations_runs_episodes_to_the_time_limit(backend):
    cfg = EnvConfig(id="tests.envs.test_serial:FallsAtOnce", num_envs=2, backend=backend, num_procs=2,
                    max_episode_steps=5, ignore_terminations=True)
    env = make_vec_env(cfg, seed=0)
    env.reset(seed=0)
    try:
        for t in range(1, 11):
            res = env.step(np.zeros(2, np.int64))
            assert not res.terminated.any()
            assert res.truncated.all() == (t % 5 == 0)
        assert res.episodes.done.all() and (res.episodes.length == 5).all() and (res.episodes.episode_return == 5.0).all()
        assert res.episodes.success.all()  # success at the episode's end
    finally:
        env.close()
    # without the option the task's terminations stand
    plain = make_vec_env(dataclasses.replace(cfg, ignore_terminations=False, backend="inprocess"), seed=0)
    plain.reset(seed=0)
    assert plain.step(np.zeros(2, np.int64)).terminated.all()
    plain.close()


def test_ignore_terminations_without_a_time_limit_is_a_user_error():
    cfg = EnvConfig(id="tests.envs.test_serial:FallsAtOnce", num_envs=1, backend="inprocess", ignore_terminations=True)
    with pytest.raises(UserError, match="needs a time limit.*env.max_episode_steps"):
        make_vec_env(cfg, seed=0).reset(seed=0)
