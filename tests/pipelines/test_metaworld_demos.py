"""`embodied demos` on Meta-World: its own scripted policies' successful episodes, recorded through
the project's Meta-World adapter into ManiSkill's trajectory layout, read back by h5py (and
ManiSkill's reader where it is installed) and by `load_demos`, and accepted by `embodied sft`'s
recipe check for an MT10 recipe."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embodied.errors import UserError

pytest.importorskip("metaworld", reason="Meta-World is not installed (pip install 'embodied[metaworld]')")
pytest.importorskip("h5py", reason="the demo files need h5py")

from envs.adapters.metaworld_adapter import INSTRUCTIONS, MT10  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.registry import make_vec_env  # noqa: E402
from pipelines.demo_sources import source_for  # noqa: E402
from pipelines.demos import DemoConfig, load_demos, read_meta, record_demos, summary_json  # noqa: E402
from policies.base import INSTRUCTION_KEY  # noqa: E402

TASK, SIZE, SEED = "reach-v3", 32, 3
pytestmark = pytest.mark.xdist_group("metaworld_demos")  # the recorded files are module fixtures: one worker builds them


@pytest.fixture(scope="module")
def rgb_file(tmp_path_factory):
    """Two rgb episodes of reach-v3 from seeds 3 and 4 (layouts 3 and 4)."""
    out = tmp_path_factory.mktemp("demos") / "reach.h5"
    lines: list[str] = []
    summary = record_demos(DemoConfig(f"metaworld/{TASK}", episodes=2, out=str(out), obs_mode="rgb", image_size=SIZE, seed=SEED),
                           log=lines.append)
    return summary, lines


@pytest.fixture(scope="module")
def mt10_file(tmp_path_factory):
    """One state episode of each MT10 task, seed 0 first, in one file."""
    out = tmp_path_factory.mktemp("demos") / "mt10.h5"
    return record_demos(DemoConfig("metaworld_mt10", episodes=1, out=str(out), obs_mode="state"), log=lambda _: None)


def test_ids_find_their_source_and_an_unknown_one_is_named() -> None:
    assert source_for("metaworld_mt10").name == source_for("metaworld/reach-v3").name == "metaworld"
    assert source_for("PickCube-v1").name == "maniskill"
    with pytest.raises(UserError, match="Did you mean 'PickCube-v1'.*metaworld_mt10"):
        source_for("PickCube-v2")


def test_an_rgb_file_is_maniskills_layout_with_the_adapters_frames(rgb_file) -> None:
    import h5py

    summary, lines = rgb_file
    assert (summary.kept, summary.attempted, summary.seeds) == (2, 2, [SEED, SEED + 1])  # the expert succeeds on both seeds
    assert len(lines) == summary.attempted + 1 and "expert success" in lines[0]
    meta = json.loads(summary.path.with_suffix(".json").read_text())
    assert meta["env_info"]["env_id"] == f"metaworld/{TASK}" and meta["env_info"]["instruction"] == INSTRUCTIONS[TASK]
    assert meta["env_info"]["env_kwargs"]["image_size"] == SIZE and meta["source_type"] == "scripted"
    assert meta["embodied"]["action_low"] == [-1.0] * 4 and meta["embodied"]["image_size"] == SIZE
    episodes = meta["episodes"]
    assert [(e["episode_id"], e["reset_kwargs"]["seed"], e["layout"]) for e in episodes] == [(0, SEED, SEED), (1, SEED + 1, SEED + 1)]
    with h5py.File(summary.path, "r") as h5:
        assert sorted(h5) == ["traj_0", "traj_1"]
        for entry in episodes:
            traj = h5[f"traj_{entry['episode_id']}"]
            steps = entry["elapsed_steps"]
            assert traj["actions"].shape == (steps, 4) and traj["actions"].dtype == np.float32
            assert np.abs(traj["actions"][:]).max() <= 1.0
            assert list(traj["obs"]) == ["sensor_data"]  # the rgb contract: frames only
            assert traj["obs"]["sensor_data"]["corner"]["rgb"].shape == (steps + 1, SIZE, SIZE, 3)
            assert traj["success"][-1] and not traj["success"][:-1].any() and traj["terminated"][-1]
            assert not traj["truncated"][:].any() and traj["rewards"].shape == (steps,)
    demos = load_demos([summary.path], chunk=2)
    assert set(demos.obs) == {"rgb", INSTRUCTION_KEY} and demos.episodes == 2
    assert len(demos) == sum(e["elapsed_steps"] for e in episodes) and demos.actions.shape == (len(demos), 2, 4)
    env = make_vec_env(EnvConfig(id=f"metaworld/{TASK}", num_envs=1, backend="inprocess", obs_mode="rgb", image_size=SIZE), seed=0)
    try:
        obs = env.reset(seed=SEED)  # what a policy trained on this task sees first
    finally:
        env.close()
    np.testing.assert_array_equal(np.asarray(obs["rgb"])[0], demos.obs["rgb"][0])


@pytest.mark.slow  # the MT10 file: ten Meta-World task sets to build (~2-4 s each)
def test_a_suite_is_one_file_with_each_episodes_task_and_instruction(mt10_file) -> None:
    summary = mt10_file
    assert summary.kept == 10 and list(summary.tasks) == [f"metaworld/{t}" for t in MT10]
    for task in ("reach-v3", "pick-place-v3"):
        assert summary.tasks[f"metaworld/{task}"].attempted == 1  # the expert succeeds on seed 0
    assert json.loads(summary_json(summary))["tasks"]["metaworld/reach-v3"]["kept"] == 1
    meta = read_meta(summary.path)
    assert meta.env_id == "metaworld_mt10" and meta.instruction is None and meta.control_mode is None
    assert [e["env_id"] for e in meta.episodes] == [f"metaworld/{t}" for t in MT10]
    demos = load_demos([summary.path])
    assert set(demos.obs) == {"state", INSTRUCTION_KEY} and demos.obs["state"].shape[1:] == (39,) and demos.episodes == 10
    first_of_each = [demos.obs[INSTRUCTION_KEY][demos.episode == i][0] for i in range(10)]
    assert first_of_each == [INSTRUCTIONS[t] for t in MT10]
    assert load_demos([summary.path], limit=1).episodes == 10  # the limit is per task of a suite's file


@pytest.mark.slow  # the MT10 file: ten Meta-World task sets to build (~2-4 s each)
def test_maniskills_own_reader_reads_a_suite_file(mt10_file) -> None:
    dataset_module = pytest.importorskip("mani_skill.trajectory.dataset")
    dataset = dataset_module.ManiSkillTrajectoryDataset(str(mt10_file.path), success_only=True)
    assert len(dataset) == sum(e["elapsed_steps"] for e in read_meta(mt10_file.path).episodes)
    assert dataset[0]["obs"].shape == (39,) and dataset[0]["action"].shape == (4,)


@pytest.mark.slow  # the MT10 file: ten Meta-World task sets to build (~2-4 s each)
def test_sft_accepts_mt10_demos_for_an_mt10_recipe_and_refuses_one_task_for_it(mt10_file, rgb_file) -> None:
    pytest.importorskip("transformers", reason="the VLA recipes need the vla extra")
    from pipelines.cli import build_train_config
    from pipelines.sft import check_recipe_fits
    from pipelines.sft_cli import build_sft_config, parse_sft_args

    recipe = "maniskill_pickcube_openvlaoft_ppo_tiny"
    check_recipe_fits(build_train_config([recipe, "env.id=metaworld_mt10", "env.obs_mode=state", "env.kwargs={}"]), [read_meta(mt10_file.path)])
    target, sft, overrides = parse_sft_args(["openvla_oft", f"demos={mt10_file.path}"])  # `embodied sft openvla_oft demos=...`
    cfg = build_sft_config(target, sft, overrides)
    assert (cfg.env.id, cfg.env.obs_mode, cfg.env.kwargs) == ("metaworld_mt10", "state", {})  # no ManiSkill controller left
    check_recipe_fits(cfg, [read_meta(mt10_file.path)])
    with pytest.raises(UserError, match="metaworld/reach-v3"):
        check_recipe_fits(build_train_config([recipe, "env.id=metaworld_mt10", f"env.image_size={SIZE}", "env.kwargs={}"]),
                          [read_meta(rgb_file[0].path)])
