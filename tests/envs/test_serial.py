"""SerialVecEnv: a step is a chunk of one action (one code path), and shapes are checked."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from embodied.errors import UserError
from envs.serial import SerialVecEnv
from envs.config import EnvConfig
from envs.registry import make_vec_env
from tests.envs.conftest import assert_same


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


class _Counter(gym.Env):
    """Observations of three kinds (float64 Box, Discrete int, Dict with uint8 and float64) that
    encode (env, step), an episode of ``length`` steps, success on the last one."""

    def __init__(self, kind: str, index: int, length: int) -> None:
        self.kind, self.index, self.length, self.t = kind, index, length, 0
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.observation_space = {
            "box": gym.spaces.Box(-np.inf, np.inf, (3,), np.float64),
            "discrete": gym.spaces.Discrete(1000),
            "dict": gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (2, 2, 3), np.uint8),
                                     "state": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)}),
        }[kind]

    def _obs(self):
        value = 100 * self.index + self.t
        if self.kind == "box":
            return np.full(3, value, np.float64)
        if self.kind == "discrete":
            return value
        return {"rgb": np.full((2, 2, 3), value % 256, np.uint8), "state": np.full(2, value, np.float64)}

    def reset(self, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        return self._obs(), float(action[0]), False, done, {"success": done}


@pytest.mark.parametrize("kind", ["box", "discrete", "dict"])
def test_batches_match_hand_stepped_envs_for_every_observation_kind(kind):
    """The batch is the envs' observations row by row, with the contract's dtypes (a plain
    Box/Discrete observation becomes float32 "state" of at least one number; a Dict keeps its
    dtypes); finished envs' final observations, returns, lengths and success are theirs."""
    from envs.serial import SerialVecEnv

    lengths = [2, 3, 5]
    venv = SerialVecEnv([lambda i=i: _Counter(kind, i, lengths[i]) for i in range(3)])
    refs = [_Counter(kind, i, lengths[i]) for i in range(3)]

    def expected(obs_list):
        if kind == "dict":
            return {"rgb": np.stack([o["rgb"] for o in obs_list]), "state": np.stack([o["state"] for o in obs_list])}
        return {"state": np.stack([np.asarray(o, np.float32).reshape(-1) for o in obs_list])}

    assert_same(venv.reset(seed=0), expected([r.reset()[0] for r in refs]))
    rng = np.random.default_rng(1)
    returns = [0.0] * 3
    for _ in range(7):
        actions = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
        result = venv.step(actions)
        obs, finals = [], {}
        for i, ref in enumerate(refs):
            o, r, _, trunc, _ = ref.step(actions[i])
            returns[i] += float(np.float32(r))
            if trunc:
                finals[i] = o
                assert result.episodes.done[i] and result.episodes.length[i] == lengths[i]
                assert result.episodes.episode_return[i] == pytest.approx(returns[i], abs=1e-6)
                assert result.episodes.success[i]
                returns[i] = 0.0
                o = ref.reset()[0]
            obs.append(o)
        assert_same(result.obs, expected(obs))
        np.testing.assert_allclose(result.reward, actions[:, 0])
        if finals:
            rows = sorted(finals)
            want = expected([finals[i] for i in rows])
            for key, value in want.items():
                np.testing.assert_array_equal(result.final_obs[key][rows], value)
                assert result.final_obs[key].dtype == value.dtype
        else:
            assert result.final_obs is None
    venv.close()


class Faulty(gym.Env):
    """Misbehaves at step ``at`` of every episode (``how``), or in reset / its constructor."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, how: str = "none", at: int = 3) -> None:
        if how == "build":
            raise OSError("scene file missing")
        self.how, self.at, self.t = how, at, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        if self.how == "reset":
            raise RuntimeError("cannot place the robot")
        self.t = 0
        return np.full(2, 0.5, np.float32), {}

    def step(self, action):
        self.t += 1
        obs, reward = np.full(2, float(self.t), np.float32), 1.0
        if self.how == "nan" and self.t >= self.at:  # a blown-up state stays NaN
            obs[1] = np.nan
        if self.t == self.at:
            if self.how == "raise":
                raise ValueError("solver diverged")
            if self.how == "user":
                raise UserError("needs the 'ycb' asset set")
            if self.how == "inf":
                reward = float("-inf")
        return obs, reward, False, self.t >= 8, {}


def faulty(how: str, at: int = 3):
    return lambda: Faulty(how, at)


@pytest.mark.parametrize("how, message", [
    ("raise", "env tests.envs.test_serial:Faulty (env index 6, seed 13) raised ValueError: solver diverged while "
              "stepping (step()). This is a failure of the env, not of Embodied or the policy: its traceback is in the log."),
    ("nan", "env tests.envs.test_serial:Faulty (env index 6, seed 13) returned NaN/inf at step 3 of its episode: its "
            "observation 'state' holds NaN."),
    ("inf", "env tests.envs.test_serial:Faulty (env index 6, seed 13) returned NaN/inf at step 3 of its episode: its "
            "reward holds -inf."),
])
def test_an_env_failing_in_step_is_named_by_id_index_and_seed(how, message):
    from embodied.errors import EnvError, exit_code_of

    env = SerialVecEnv([faulty("none"), faulty(how)], first_index=5)
    env.reset(seed=12)
    env.step(np.zeros(2, np.int64)), env.step(np.zeros(2, np.int64))
    with pytest.raises(EnvError) as info:
        env.step(np.zeros(2, np.int64))
    assert str(info.value).startswith(message) and exit_code_of(info.value) == 3
    assert info.value.where == {"env_id": "tests.envs.test_serial:Faulty", "env_index": 6, "seed": 13}


def test_an_env_failing_to_build_or_reset_is_named_and_user_errors_stay_user_errors():
    from embodied.errors import EnvError

    with pytest.raises(EnvError, match=r"^env CartPole-v1 \(env index 1\) raised OSError: scene file missing while "
                                       r"building the env"):
        SerialVecEnv([faulty("none"), faulty("build")], env_id="CartPole-v1")
    env = SerialVecEnv([faulty("reset")])
    with pytest.raises(EnvError, match=r"\(env index 0, seed 4\) raised RuntimeError: cannot place the robot while "
                                       r"resetting \(reset\(\)\)"):
        env.reset(seed=4)
    env = SerialVecEnv([faulty("user")])
    env.reset(seed=0)
    env.step(np.zeros(1, np.int64)), env.step(np.zeros(1, np.int64))
    with pytest.raises(UserError, match="ycb"):
        env.step(np.zeros(1, np.int64))


def test_nan_with_drop_cuts_the_episode_at_its_last_finite_observation():
    """env.nonfinite=drop: the step is a truncation at the observation the action was taken in,
    reward 0, not a finished episode; the env is reset; chunks keep only their first step."""
    env = SerialVecEnv([faulty("none"), faulty("nan")], nonfinite="drop")
    env.reset(seed=0)
    env.step(np.zeros(2, np.int64))
    before = env.step(np.zeros(2, np.int64))
    res = env.step(np.zeros(2, np.int64))
    np.testing.assert_array_equal(res.info["nonfinite"], [False, True])
    np.testing.assert_array_equal(res.reward, [1.0, 0.0])
    np.testing.assert_array_equal(res.truncated, [False, True])
    np.testing.assert_array_equal(res.final_obs["state"][1], before.obs["state"][1])
    np.testing.assert_array_equal(res.obs["state"][1], [0.5, 0.5])  # the reset observation
    assert not res.episodes.done.any() and env.nonfinite_episodes == 1
    assert "nonfinite" not in env.step(np.zeros(2, np.int64)).info
    chunked = SerialVecEnv([faulty("none"), faulty("nan")], nonfinite="drop")
    chunked.reset(seed=0)
    c = chunked.chunk_step(np.zeros((2, 4), np.int64))  # the episode of env 1 blows up at its 3rd step
    np.testing.assert_array_equal(c.valid, [[True] * 4, [True, False, False, False]])
    np.testing.assert_array_equal(c.truncated[1], [True, False, False, False])
    np.testing.assert_array_equal(c.rewards[1], [0, 0, 0, 0])
    np.testing.assert_array_equal(c.final_obs["state"][1], [0.5, 0.5])  # the chunk's decision was made at reset
    assert c.info["nonfinite"].tolist() == [False, True]


def test_the_finite_check_costs_microseconds_not_a_loop_per_value():
    """The hot path checks whole arrays: a batch of 64 envs with 1000-value observations is
    checked with a few numpy calls (well under 100 us), and only a failure looks at rows."""
    import timeit

    from envs.nonfinite import all_finite, bad_rows

    obs, reward = np.zeros((64, 1000), np.float32), np.zeros(64, np.float32)
    seconds = min(timeit.repeat(lambda: all_finite([reward, obs]), number=200, repeat=3)) / 200
    assert seconds < 100e-6, seconds
    obs[7, 3] = np.inf
    mask, what = bad_rows({"observation 'state'": obs, "reward": reward}, 64)
    assert mask.tolist() == [i == 7 for i in range(64)] and what == {7: "observation 'state' holds +inf"}


def test_random_actions_cover_box_bounds_and_discrete_values():
    from envs.base import random_actions

    rng = np.random.default_rng(0)
    box = random_actions(gym.spaces.Box(np.array([-1.0, 2.0]), np.array([1.0, 3.0])), (5, 4), rng)
    assert box.shape == (5, 4, 2) and box.dtype == np.float32
    assert (box[..., 0] >= -1).all() and (box[..., 0] <= 1).all() and (box[..., 1] >= 2).all() and (box[..., 1] <= 3).all()
    discrete = random_actions(gym.spaces.Discrete(3, start=2), (200,), rng)
    assert set(discrete.tolist()) == {2, 3, 4}
    with pytest.raises(TypeError, match="Box or a Discrete"):
        random_actions(gym.spaces.MultiBinary(2), (1,), rng)
