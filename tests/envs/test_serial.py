"""SerialVecEnv: a step is a chunk of one action (one code path), and shapes are checked."""

from __future__ import annotations

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
