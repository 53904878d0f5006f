"""The Meta-World adapter on the real ``metaworld`` package: ids, instructions, the env contract on
reach-v3 (state and rendered rgb), and Meta-World's scripted experts solving tasks through it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("metaworld", reason='Meta-World is optional: pip install -e ".[metaworld]"')

import metaworld  # noqa: E402
import metaworld.env_dict  # noqa: E402

from embodied.errors import UserError  # noqa: E402
from envs.adapters import metaworld_adapter as mw  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env, resolve_adapter  # noqa: E402

HORIZON = 4


def make(env_id: str, num_envs: int = 1, **overrides) -> object:
    cfg = EnvConfig(id=env_id, num_envs=num_envs, backend="inprocess", **overrides)
    return make_vec_env(cfg, seed=0)


def test_task_sets_and_instructions_follow_metaworld():
    assert mw.MT50 == tuple(metaworld.ALL_V3_ENVIRONMENTS)
    assert mw.MT10 == tuple(metaworld.env_dict.MT10_V3)
    assert set(mw.INSTRUCTIONS) == set(mw.MT50)
    assert len(set(mw.INSTRUCTIONS.values())) == 50  # one distinct sentence per task
    assert all(text == text.strip() and text[0].islower() and not text.endswith(".") for text in mw.INSTRUCTIONS.values())


def test_ids_are_claimed_and_parsed():
    for env_id in ("metaworld/reach-v3", "metaworld_mt10", "metaworld_mt50/hammer-v3", "metaworld_mt10/3"):
        assert resolve_adapter(EnvConfig(id=env_id)) == "metaworld"
    assert mw.parse_id("metaworld_mt10") == list(mw.MT10)
    assert mw.parse_id("metaworld_mt10/3") == ["door-open-v3"]
    assert mw.parse_id("metaworld_mt50/hammer-v3") == ["hammer-v3"]
    with pytest.raises(UserError, match="reach-v3"):
        mw.parse_id("metaworld/reach-v2")  # did you mean reach-v3
    with pytest.raises(UserError, match="tasks 0..9"):
        mw.parse_id("metaworld_mt10/10")
    with pytest.raises(UserError, match="metaworld_mt10"):
        mw.parse_id("metaworld_mt11")


def test_reach_contract_state(tmp_path):
    env = make("metaworld/reach-v3", num_envs=2, max_episode_steps=HORIZON)
    try:
        assert env.instructions == ["reach the goal with the gripper"] * 2
        assert env.action_space.shape == (4,) and env.observation_space["state"].shape == (39,)
        obs = env.reset(seed=[7, 7])  # one seed: one layout
        assert obs["state"].shape == (2, 39) and obs["state"].dtype == np.float32
        np.testing.assert_array_equal(obs["state"][0], obs["state"][1])
        obs = env.reset(seed=0)  # env i gets seed i: layouts 0 and 1
        assert not np.allclose(obs["state"][0, -3:], obs["state"][1, -3:])  # different goals
        total = np.zeros(2)
        for t in range(HORIZON):
            res = env.step(np.zeros((2, 4), np.float32))
            total += res.reward
            assert res.reward.dtype == np.float32 and res.info["success"].dtype == bool
            assert not res.terminated.any()
            assert res.truncated.all() == (t == HORIZON - 1)
        assert res.final_obs is not None and res.final_obs["state"].shape == (2, 39)
        rows = res.episodes.finished()
        assert [r["length"] for r in rows] == [HORIZON] * 2 and [r["success"] for r in rows] == [0.0, 0.0]
        np.testing.assert_allclose([r["return"] for r in rows], total, rtol=1e-5)
        # the next episodes advance the layout by the envs on the task: 0 -> 2, 1 -> 3
        assert not np.allclose(res.final_obs["state"][:, -3:], res.obs["state"][:, -3:])
    finally:
        env.close()


@pytest.mark.slow
def test_reach_contract_rgb():
    env = make("metaworld/reach-v3", num_envs=1, obs_mode="state+rgb", image_size=32, max_episode_steps=HORIZON)
    try:
        assert env.observation_space["rgb"].shape == (32, 32, 3)
        obs = env.reset(seed=0)
        assert obs["rgb"].shape == (1, 32, 32, 3) and obs["rgb"].dtype == np.uint8 and obs["state"].shape == (1, 39)
        assert obs["rgb"].std() > 5  # a rendered scene, not a blank frame
        res = env.step(np.array([[1.0, 0.0, 0.0, 0.0]], np.float32))
        assert res.obs["rgb"].shape == (1, 32, 32, 3) and not np.array_equal(res.obs["rgb"], obs["rgb"])
    finally:
        env.close()
    only_rgb = make("metaworld/reach-v3", obs_mode="rgb", image_size=16)
    try:
        assert set(only_rgb.reset(seed=0)) == {"rgb"}
    finally:
        only_rgb.close()


def test_a_set_runs_its_tasks_round_robin():
    env = make("metaworld_mt10", num_envs=2, max_episode_steps=HORIZON)
    try:
        assert env.instructions == [mw.INSTRUCTIONS["reach-v3"], mw.INSTRUCTIONS["push-v3"]]
    finally:
        env.close()


def test_unknown_kwargs_and_camera_are_user_errors():
    with pytest.raises(UserError, match="corner"):
        make("metaworld/reach-v3", kwargs={"camera": "corner9"})
    with pytest.raises(UserError, match="at most 500"):
        make("metaworld/reach-v3", max_episode_steps=600)
    with pytest.raises(UserError, match="Did you mean 'reward_function_version'"):
        make("metaworld/reach-v3", kwargs={"reward_function_verison": "v2"})


def expert_episode(task: str, seed: int = 0):
    """One episode of Meta-World's scripted expert through the adapter: the last StepResult and its length."""
    env = make(f"metaworld/{task}")
    policy = mw.expert(task)
    try:
        obs = env.reset(seed=seed)
        for step in range(mw.MAX_EPISODE_STEPS):
            res = env.step(policy.get_action(obs["state"][0].astype(np.float64))[None].astype(np.float32))
            obs = res.obs
            if res.terminated[0] or res.truncated[0]:
                return res, step + 1
    finally:
        env.close()
    raise AssertionError(f"{task}: the episode did not end within {mw.MAX_EPISODE_STEPS} steps")


@pytest.mark.parametrize("task", ["reach-v3", "drawer-close-v3", "button-press-topdown-v3"])
def test_scripted_expert_succeeds_through_the_adapter(task):
    res, steps = expert_episode(task)
    assert res.terminated[0] and not res.truncated[0], f"{task}: no success in {steps} steps"
    assert res.info["success"][0] and res.episodes.finished()[0]["success"] == 1.0


@pytest.mark.exhaustive
def test_every_mt50_task_builds_and_its_expert_succeeds_from_layout_0():
    failed = {}
    for task in mw.MT50:
        res, steps = expert_episode(task)
        if not res.terminated[0]:
            failed[task] = steps
    assert not failed, f"the scripted expert did not succeed on {failed}"
