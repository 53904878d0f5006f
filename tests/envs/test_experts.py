"""The scripted ManiSkill experts: pure action maths, and each task's expert succeeding on fixed
seeds in the real simulator (state observations, the env's own success)."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.errors import UserError
from envs.experts.maniskill import CONTROL_MODE, EXPERTS, STEP_M, expert_for, for_control_mode, move_to

#: Seeds each expert must solve, and the steps it may take (the demos' default episode length).
SEEDS, MAX_STEPS = (0, 1), 100


def test_move_to_sets_the_target_within_one_step_and_clips_beyond() -> None:
    tcp = np.array([0.0, 0.0, 0.1])
    near = move_to(tcp, tcp + np.array([0.02, -0.05, 0.0]), 1.0)
    np.testing.assert_allclose(near, [0.2, -0.5, 0.0, 1.0], rtol=1e-6)  # 0.02 m / 0.1 m per unit
    far = move_to(tcp, tcp + np.array([0.5, 0.0, -3 * STEP_M]), -1.0)
    np.testing.assert_allclose(far, [1.0, 0.0, -1.0, -1.0])
    assert near.dtype == np.float32 and near.shape == (4,)


def test_delta_pose_actions_keep_the_translation_and_gripper_with_no_rotation() -> None:
    action = np.array([0.1, -0.2, 0.3, -1.0], np.float32)
    assert for_control_mode(action, CONTROL_MODE) is action
    np.testing.assert_array_equal(for_control_mode(action, "pd_ee_delta_pose"), np.array([0.1, -0.2, 0.3, 0, 0, 0, -1.0], np.float32))
    with pytest.raises(UserError, match="pd_joint_delta_pos"):
        for_control_mode(action, "pd_joint_delta_pos")


def test_an_unknown_task_names_the_tasks_with_an_expert() -> None:
    with pytest.raises(UserError, match="PickCube-v1") as err:
        expert_for("PickCube-v2")
    assert "did you mean" in str(err.value).lower()


@pytest.mark.parametrize("env_id", sorted(EXPERTS))
def test_each_expert_succeeds_on_fixed_seeds(env_id: str) -> None:
    pytest.importorskip("mani_skill")
    import torch

    from envs.adapters.maniskill_adapter import make_raw_maniskill, maniskill_registry
    from envs.config import EnvConfig

    maniskill_registry()  # activates the project's Vulkan (lavapipe without an NVIDIA GPU) first

    env = make_raw_maniskill(EnvConfig(id=env_id, obs_mode="state", max_episode_steps=MAX_STEPS,
                                       kwargs={"control_mode": CONTROL_MODE, "render_backend": "none"}), "physx_cpu", 1)
    expert = expert_for(env_id)
    try:
        for seed in SEEDS:
            env.reset(seed=seed)
            expert.reset()
            success = False
            for _ in range(MAX_STEPS):
                _, _, _, _, info = env.step(torch.as_tensor(expert(env))[None])
                success = bool(info["success"][0])
                if success:
                    break
            assert success, f"{env_id} seed {seed}: the expert ended in stage {expert.stage_name!r} without success"
    finally:
        env.close()
