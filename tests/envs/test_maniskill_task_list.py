"""Several ManiSkill tasks in one batch (``env.id: PushCube-v1,PickCube-v1``): the task each env
runs, its instruction, and the one observation layout every env shows."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from embodied.errors import UserError
from envs.config import EnvConfig

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (pip install 'embodied[maniskill]')")

from envs.adapters.maniskill_adapter import INSTRUCTIONS, layout_of, parse_tasks  # noqa: E402


def box(n: int) -> gym.spaces.Box:
    return gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)


def rgb_space(extra: dict[str, int], cameras: tuple[str, ...] = ("base_camera",)) -> gym.spaces.Dict:
    return gym.spaces.Dict({
        "agent": gym.spaces.Dict({"qpos": box(9), "qvel": box(9)}),
        "extra": gym.spaces.Dict({k: box(n) for k, n in extra.items()}),
        "sensor_data": gym.spaces.Dict({c: gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)}) for c in cameras}),
    })


def test_layout_holds_every_entry_once_with_zeros_for_what_a_task_lacks():
    push = rgb_space({"tcp_pose": 7})
    pick = rgb_space({"goal_pos": 3, "is_grasped": 1, "tcp_pose": 7}, cameras=("base_camera", "hand_camera"))
    layout = layout_of([push, pick], "rgb")
    assert layout.dim == 9 + 9 + 7 + 3 + 1
    assert [name for (_, name), _ in layout.entries] == ["qpos", "qvel", "tcp_pose", "goal_pos", "is_grasped"]
    assert layout.cameras == ("base_camera",)  # hand_camera: not every task has it
    obs = {"agent": {"qpos": np.ones(9), "qvel": np.full(9, 2.0)}, "extra": {"tcp_pose": np.full(7, 3.0)}}
    vec = layout.vector(obs)
    assert vec.dtype == np.float32 and vec.shape == (29,)
    np.testing.assert_array_equal(vec[18:25], 3.0)
    np.testing.assert_array_equal(vec[25:], 0.0)  # PushCube has no goal_pos / is_grasped
    pick_obs = {**obs, "extra": {"tcp_pose": np.full(7, 3.0), "goal_pos": np.array([4.0, 5.0, 6.0]), "is_grasped": np.array([1.0])}}
    np.testing.assert_array_equal(layout.vector(pick_obs)[25:], [4, 5, 6, 1])


def test_layout_of_state_modes_pads_to_the_longest_and_conflicts_are_user_errors():
    layout = layout_of([box(25), box(30)], "state")
    assert layout.dim == 30 and layout.entries == ()
    np.testing.assert_array_equal(layout.vector(np.ones(25))[25:], 0.0)
    with pytest.raises(UserError, match="differ in size"):
        layout_of([rgb_space({"tcp_pose": 7}), rgb_space({"tcp_pose": 6})], "rgb")
    with pytest.raises(UserError, match="share no camera"):
        layout_of([rgb_space({}, ("a",)), rgb_space({}, ("b",))], "rgb")


def test_parse_tasks_and_claims():
    from envs.registry import resolve_adapter

    assert parse_tasks(" PushCube-v1, PickCube-v1,PushCube-v1") == ["PushCube-v1", "PickCube-v1"]
    with pytest.raises(UserError, match="empty task id"):
        parse_tasks("PushCube-v1,,PickCube-v1")
    assert resolve_adapter(EnvConfig(id="PushCube-v1,PickCube-v1")) == "maniskill"


@pytest.mark.slow
def test_task_list_batch_runs_each_task_in_its_layout(vulkan):
    from envs.registry import make_vec_env

    cfg = EnvConfig(id="PushCube-v1,PickCube-v1", num_envs=4, backend="inprocess", obs_mode="rgb", image_size=16,
                    kwargs={"control_mode": "pd_ee_delta_pos", "task_every": 2})
    env = make_vec_env(cfg, seed=0)
    try:
        assert env.instructions == [INSTRUCTIONS["PushCube-v1"]] * 2 + [INSTRUCTIONS["PickCube-v1"]] * 2
        assert env.observation_space["state"].shape == (29,)
        obs = env.reset(seed=0)
        assert obs["state"].shape == (4, 29) and obs["rgb"].shape == (4, 16, 16, 3)
        np.testing.assert_array_equal(obs["state"][:2, 25:], 0.0)  # PushCube envs: no goal_pos / is_grasped
        assert np.abs(obs["state"][2:, 25:28]).sum() > 0  # PickCube envs: their goal position
        result = env.step(np.zeros((4, 4), np.float32))
        assert result.obs["state"].shape == (4, 29)
    finally:
        env.close()
    single = make_vec_env(EnvConfig(id="PushCube-v1,PickCube-v1", num_envs=2, backend="inprocess", obs_mode="rgb", image_size=16,
                                    kwargs={"control_mode": "pd_ee_delta_pos", "task": "PickCube-v1"}), seed=0)
    try:
        assert single.instructions == [INSTRUCTIONS["PickCube-v1"]] * 2
        assert single.reset(seed=0)["state"].shape == (2, 29)  # the list's layout, one task
    finally:
        single.close()


def test_task_list_user_errors():
    from envs.registry import make_vec_env

    base = dict(id="PushCube-v1,PickCube-v1", num_envs=2, obs_mode="rgb", image_size=16)
    with pytest.raises(UserError, match="one task per batch"):
        make_vec_env(EnvConfig(**base, backend="batched"))
    with pytest.raises(UserError, match="env.kwargs.task='StackCube-v1' is not one of"):
        make_vec_env(EnvConfig(**base, backend="inprocess", kwargs={"task": "StackCube-v1"}))
    with pytest.raises(UserError, match="task_every"):
        make_vec_env(EnvConfig(**base, backend="inprocess", kwargs={"task_every": 0}))


def test_suite_evaluation_runs_each_task_of_a_list_in_the_list_layout():
    from pipelines.suite_eval import suite_tasks, task_env

    cfg = EnvConfig(id="PushCube-v1,PickCube-v1", kwargs={"control_mode": "pd_ee_delta_pos"})
    assert [t.id for t in suite_tasks(cfg.id)] == ["PushCube-v1", "PickCube-v1"]
    assert suite_tasks(cfg.id)[1].instruction == INSTRUCTIONS["PickCube-v1"]
    one = task_env(cfg, "PickCube-v1")
    assert one.id == cfg.id and one.kwargs == {"control_mode": "pd_ee_delta_pos", "task": "PickCube-v1"}
    assert task_env(EnvConfig(id="PushCube-v1"), "PushCube-v1").id == "PushCube-v1"
