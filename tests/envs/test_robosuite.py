"""The robosuite adapter on the real simulator (Lift with a Panda, state and camera observations)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("robosuite", reason="robosuite is an optional dependency: pip install robosuite==1.4.0 termcolor")

from embodied.errors import UserError  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env, resolve_adapter  # noqa: E402
from envs.serial import SerialVecEnv  # noqa: E402

HORIZON = 5


@pytest.fixture(scope="module")
def lift():
    cfg = EnvConfig(id="robosuite/Lift", num_envs=2, backend="inprocess", max_episode_steps=HORIZON)
    env = make_vec_env(cfg, seed=0)
    yield env
    env.close()


def test_ids_are_claimed_by_the_robosuite_adapter():
    assert resolve_adapter(EnvConfig(id="robosuite/Lift")) == "robosuite"
    assert resolve_adapter(EnvConfig(id="robosuite/Door")) == "robosuite"


def test_unknown_task_is_a_user_error_with_a_suggestion():
    with pytest.raises(UserError, match="Did you mean 'Lift'"):
        make_vec_env(EnvConfig(id="robosuite/Lfit", num_envs=1, backend="inprocess"))


def test_scenes_other_packages_register_in_robosuite_are_not_robosuite_tasks():
    # LIBERO registers its BDDL scene classes in robosuite's registry when imported; they need a
    # problem file (the libero adapter's business), so robosuite/<name> refuses them up front.
    from robosuite.environments.base import REGISTERED_ENVS
    from robosuite.environments.manipulation.lift import Lift

    class OtherPackagesScene(Lift):  # registered by robosuite's metaclass, as LIBERO's scenes are
        pass

    OtherPackagesScene.__module__ = "otherpkg.scenes"
    REGISTERED_ENVS["OtherPackagesScene"] = OtherPackagesScene
    try:
        with pytest.raises(UserError, match="robosuite has no environment 'OtherPackagesScene'"):
            make_vec_env(EnvConfig(id="robosuite/OtherPackagesScene", num_envs=1, backend="inprocess"))
    finally:
        REGISTERED_ENVS.pop("OtherPackagesScene", None)


def test_lift_state_observation_and_action_space(lift):
    assert isinstance(lift, SerialVecEnv)
    assert lift.action_space.shape == (7,)  # OSC_POSE: 6-D end-effector delta + gripper
    state_space = lift.observation_space["state"]
    assert set(lift.observation_space.spaces) == {"state"}
    obs = lift.reset(seed=0)
    assert obs["state"].shape == (2, state_space.shape[0]) and obs["state"].dtype == np.float32
    # robot0_proprio-state (32) + object-state (10) for Lift
    assert state_space.shape == (42,)
    assert lift.envs[0].env.robots[0].name == "Panda"


def test_reset_with_a_seed_is_reproducible(lift):
    a = lift.reset(seed=7)["state"]
    b = lift.reset(seed=7)["state"]
    c = lift.reset(seed=8)["state"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[:, -10:], c[:, -10:])  # the cube is placed elsewhere
    assert not np.array_equal(a[0, -10:], a[1, -10:])  # env 0 and env 1 have their own streams


def test_steps_truncate_and_auto_reset_at_the_horizon(lift):
    lift.reset(seed=1)
    rng = np.random.default_rng(0)
    total = np.zeros(2)
    for t in range(HORIZON):
        res = lift.step(rng.uniform(-1, 1, (2, 7)).astype(np.float32))
        total += res.reward
        assert res.info["success"].dtype == bool and not res.info["success"].any()
        if t < HORIZON - 1:
            assert not res.truncated.any() and res.final_obs is None
    assert res.truncated.all() and not res.terminated.any()
    assert res.final_obs is not None
    assert not np.allclose(res.final_obs["state"], res.obs["state"])  # obs is the new episode's first
    rows = res.episodes.finished()
    assert [r["length"] for r in rows] == [HORIZON, HORIZON]
    assert np.allclose([r["return"] for r in rows], total, atol=1e-5)
    assert all(r["success"] == 0.0 for r in rows)
    assert (res.reward >= 0).all()  # shaped Lift reward


def test_chunk_step_stops_each_env_at_its_episode_end(lift):
    lift.reset(seed=2)
    lift.step(np.zeros((2, 7), np.float32))  # 1 step into the episode: it ends at chunk index 3
    res = lift.chunk_step(np.zeros((2, 6, 7), np.float32))
    assert res.rewards.shape == (2, 6)
    np.testing.assert_array_equal(res.valid, np.array([[True] * 4 + [False] * 2] * 2))
    assert res.truncated[:, 3].all() and res.truncated.sum() == 2
    assert (res.rewards[:, 4:] == 0).all()
    assert res.episodes.done.all() and (res.episodes.length == HORIZON).all()
    assert res.final_obs is not None and res.obs["state"].shape == (2, 42)


def test_a_misspelt_kwarg_is_a_user_error_with_the_tasks_parameters():
    cfg = EnvConfig(id="robosuite/Lift", num_envs=1, backend="inprocess", kwargs={"reward_scal": 2.0})
    with pytest.raises(UserError, match=r"env.kwargs.reward_scal: robosuite/Lift takes no parameter 'reward_scal'. Did you mean 'reward_scale'") as err:
        make_vec_env(cfg)
    assert "wrist_camera" in str(err.value) and "placement_initializer" in str(err.value)


def test_two_arm_tasks_get_two_robots_by_default():
    cfg = EnvConfig(id="robosuite/TwoArmLift", num_envs=1, backend="inprocess", max_episode_steps=2)
    with make_vec_env(cfg) as env:
        assert [r.name for r in env.envs[0].env.robots] == ["Panda", "Panda"]
        assert env.action_space.shape == (14,)  # 7-D OSC_POSE + gripper per arm
        env.reset(seed=0)
        result = env.step(np.zeros((1, 14), np.float32))
        assert result.obs["state"].shape == (1, *env.observation_space["state"].shape)


@pytest.mark.slow
def test_every_robosuite_task_builds_and_steps():
    from envs.adapters.robosuite_adapter import robosuite_tasks

    tasks = robosuite_tasks()
    assert {"Lift", "Stack", "Door", "NutAssembly", "PickPlace", "Wipe", "TwoArmLift"} <= set(tasks)
    for name in tasks:
        cfg = EnvConfig(id=f"robosuite/{name}", num_envs=1, backend="inprocess", max_episode_steps=2)
        with make_vec_env(cfg) as env:
            obs = env.reset(seed=0)
            assert obs["state"].shape == (1, *env.observation_space["state"].shape), name
            for _ in range(2):
                result = env.step(np.zeros((1, *env.action_space.shape), np.float32))
            assert result.truncated.all() and "success" in result.info, name


def test_robot_comes_from_kwargs():
    # (Sawyer's meshes do not load in MuJoCo 3.x with robosuite 1.4: "mesh volume is too small")
    cfg = EnvConfig(id="robosuite/Lift", num_envs=1, backend="inprocess", kwargs={"robot": "UR5e"})
    env = make_vec_env(cfg)
    try:
        assert env.envs[0].env.robots[0].name == "UR5e"
        assert env.reset(seed=0)["state"].shape[1] == env.observation_space["state"].shape[0]
    finally:
        env.close()


@pytest.mark.slow
def test_multiprocess_camera_observations_and_render():
    cfg = EnvConfig(
        id="robosuite/Lift",
        num_envs=2,
        backend="multiprocess",
        num_procs=2,
        obs_mode="state+rgb",
        image_size=48,
        max_episode_steps=3,
        kwargs={"wrist_camera": True},
    )
    env = make_vec_env(cfg, seed=0)
    try:
        assert type(env).__name__ == "MultiprocessVecEnv"
        assert env.observation_space["rgb"].shape == (48, 48, 3)
        obs = env.reset(seed=0)
        assert obs["rgb"].shape == (2, 48, 48, 3) and obs["rgb"].dtype == np.uint8
        assert obs["rgb/wrist"].shape == (2, 48, 48, 3)
        assert obs["state"].shape == (2, 42)
        # upright agentview: the table (bright) fills the lower half, the robot base the top rows
        assert obs["rgb"][:, 24:].mean() > obs["rgb"][:, :6].mean()
        res = env.chunk_step(np.zeros((2, 4, 7), np.float32))
        assert res.truncated[:, 2].all() and not res.valid[:, 3].any()
        assert res.final_obs["rgb"].shape == (2, 48, 48, 3)
        frames = env.render()
        assert frames.shape == (2, 48, 48, 3) and frames.dtype == np.uint8
    finally:
        env.close()
