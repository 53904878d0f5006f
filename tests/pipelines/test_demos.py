"""`embodied demos`: a scripted expert's successful episodes in ManiSkill's own trajectory format,
read back by ManiSkill's tools and, in the env contract's keys, by the project's loader."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.errors import UserError

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (pip install 'embodied[maniskill]')")

from pipelines.demos import DemoConfig, load_demos, parse_demo_args, read_meta, record_demos  # noqa: E402
from policies.base import INSTRUCTION_KEY  # noqa: E402

TASK, EPISODES, SIZE, SEED = "PushCube-v1", 2, 32, 7


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "push.h5"
    lines: list[str] = []
    summary = record_demos(DemoConfig(TASK, episodes=EPISODES, out=str(out), obs_mode="rgb", image_size=SIZE, seed=SEED), log=lines.append)
    return summary, lines


def test_the_files_are_maniskills_trajectory_format(demo_file) -> None:
    import h5py
    from mani_skill.trajectory.dataset import ManiSkillTrajectoryDataset
    from mani_skill.utils.io_utils import load_json

    summary, lines = demo_file
    assert summary.kept == EPISODES and summary.attempted >= EPISODES and summary.seeds[0] == SEED
    assert len(lines) == summary.attempted + 1 and "expert success" in lines[0]  # a progress line per episode
    meta = load_json(str(summary.path.with_suffix(".json")))
    assert meta["env_info"]["env_id"] == TASK and meta["env_info"]["env_kwargs"]["control_mode"] == "pd_ee_delta_pos"
    assert meta["env_info"]["env_kwargs"]["sensor_configs"] == {"width": SIZE, "height": SIZE}
    assert meta["env_info"]["instruction"] == "push the cube to the red and white target region"
    assert meta["source_type"] == "scripted" and meta["embodied"]["succeeded"] == EPISODES
    episodes = meta["episodes"]
    assert [e["episode_id"] for e in episodes] == list(range(EPISODES))
    assert [e["reset_kwargs"]["seed"] for e in episodes] == summary.seeds
    assert all(e["success"] and e["control_mode"] == "pd_ee_delta_pos" and e["instruction"] == meta["env_info"]["instruction"]
               for e in episodes)
    with h5py.File(summary.path, "r") as h5:
        assert sorted(h5) == [f"traj_{i}" for i in range(EPISODES)]
        for entry in episodes:
            traj = h5[f"traj_{entry['episode_id']}"]
            steps = entry["elapsed_steps"]
            assert {"obs", "actions", "terminated", "truncated", "success", "env_states"} <= set(traj)
            assert traj["actions"].shape == (steps, 4) and traj["actions"].dtype == np.float32
            assert traj["obs"]["sensor_data"]["base_camera"]["rgb"].shape == (steps + 1, SIZE, SIZE, 3)
            assert traj["success"][-1] and not traj["success"][:-1].any()  # it ends at the first success
            assert traj["env_states"]["actors"]["cube"].shape[0] == steps + 1
    dataset = ManiSkillTrajectoryDataset(str(summary.path), success_only=True)  # ManiSkill's own reader
    assert len(dataset) == sum(e["elapsed_steps"] for e in episodes)
    assert dataset[0]["obs"]["sensor_data"]["base_camera"]["rgb"].shape == (SIZE, SIZE, 3)


def test_replaying_the_recorded_actions_from_the_recorded_reset_succeeds(demo_file) -> None:
    import gymnasium as gym
    import h5py
    import torch
    from mani_skill.utils.io_utils import load_json

    summary, _ = demo_file
    meta = load_json(str(summary.path.with_suffix(".json")))
    info = meta["env_info"]
    kwargs = {**info["env_kwargs"], "obs_mode": "state", "render_backend": "none"}
    kwargs.pop("sensor_configs")
    env = gym.make(info["env_id"], **kwargs)  # as ManiSkill's docs recreate a trajectory's env
    try:
        with h5py.File(summary.path, "r") as h5:
            for entry in meta["episodes"]:
                env.reset(**entry["reset_kwargs"])
                for action in h5[f"traj_{entry['episode_id']}"]["actions"][:]:
                    _, _, _, _, step_info = env.step(torch.as_tensor(action)[None])
                assert bool(step_info["success"][0])
    finally:
        env.close()


def test_the_loader_gives_what_the_projects_env_shows_the_policy(demo_file) -> None:
    from envs.adapters.maniskill_adapter import make_cpu_env
    from envs.config import EnvConfig

    summary, _ = demo_file
    demos = load_demos([summary.path], chunk=3)
    meta = read_meta(summary.path)
    steps = [e["elapsed_steps"] for e in meta.episodes]
    assert len(demos) == sum(steps) and demos.episodes == EPISODES
    assert set(demos.obs) == {"rgb", "state", INSTRUCTION_KEY} and demos.obs["rgb"].shape == (sum(steps), SIZE, SIZE, 3)
    assert demos.actions.shape == (sum(steps), 3, 4)
    np.testing.assert_array_equal(demos.actions[steps[0] - 1, 0], demos.actions[steps[0] - 1, 2])  # the last action repeats
    assert set(demos.obs[INSTRUCTION_KEY]) == {meta.instruction}
    env = make_cpu_env(EnvConfig(id=TASK, obs_mode="rgb", image_size=SIZE, kwargs={"control_mode": "pd_ee_delta_pos"}))
    try:
        obs, _ = env.reset(seed=summary.seeds[0])
    finally:
        env.close()
    assert set(obs) == {"rgb", "state"}
    np.testing.assert_array_equal(obs["rgb"], demos.obs["rgb"][0])
    np.testing.assert_allclose(obs["state"], demos.obs["state"][0], atol=1e-6)


def test_an_existing_file_is_kept_and_a_bad_key_is_named(demo_file) -> None:
    summary, _ = demo_file
    before = summary.path.stat().st_mtime_ns
    with pytest.raises(UserError, match="already exists"):
        record_demos(DemoConfig(TASK, episodes=1, out=str(summary.path)))
    assert summary.path.stat().st_mtime_ns == before
    with pytest.raises(UserError, match="episodes"):
        parse_demo_args(TASK, ["episode=3"])
    cfg = parse_demo_args(TASK, ["episodes=3", "obs_mode=state", "overwrite=true"])
    assert (cfg.episodes, cfg.obs_mode, cfg.overwrite) == (3, "state", True)
    with pytest.raises(UserError, match="integer"):
        parse_demo_args(TASK, ["episodes=many"])
