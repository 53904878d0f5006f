"""`embodied sft` of one policy on several ManiSkill tasks (env.id a task list): each task's demo
frames show exactly the state and cameras the list's envs show that task, so the cloned policy
reads in training what it read in its demonstrations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embodied.errors import UserError

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (pip install 'embodied[maniskill]')")
pytest.importorskip("transformers", reason="the VLA policies need the vla extra")

from envs.registry import make_vec_env  # noqa: E402
from pipelines.cli import build_train_config  # noqa: E402
from pipelines.demos import DemoConfig, load_demos, read_meta, record_demos, task_list_layout  # noqa: E402
from pipelines.sft import SFTConfig, check_recipe_fits, run_sft  # noqa: E402

TASKS = ("PushCube-v1", "PickCube-v1")
LIST = ",".join(TASKS)
SIZE = 16


@pytest.fixture(scope="module")
def demo_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    paths = []
    for task in TASKS:
        out = root / f"{task}.h5"
        record_demos(DemoConfig(task, episodes=2, out=str(out), image_size=SIZE), log=lambda _: None)
        paths.append(str(out))
    return paths


def list_config():
    return build_train_config(["maniskill_pickcube_openvlaoft_ppo_tiny", f"env.id={LIST}", f"env.image_size={SIZE}",
                               f"policy.kwargs.tiny.image_size={SIZE}", "policy.kwargs.tiny_proprio=1", "env.backend=inprocess"])


@pytest.mark.slow
def test_demo_frames_show_the_task_lists_observation(demo_paths):
    layout = task_list_layout(list(TASKS), demo_paths)
    demos = load_demos(demo_paths, layout=layout)
    assert demos.obs["state"].shape[1] == layout.dim == 29
    assert "rgb/hand_camera" not in demos.obs  # PickCube has it, PushCube does not: the list keeps the shared camera
    cfg = list_config()
    for task, path in zip(TASKS, demo_paths):
        seed = read_meta(path).episodes[0]["episode_seed"]
        env = make_vec_env(dataclasses.replace(cfg.env, num_envs=1, kwargs={**cfg.env.kwargs, "task": task}), seed=0)
        try:
            first = env.reset(seed=seed)
        finally:
            env.close()
        rows = np.flatnonzero(demos.episode == TASKS.index(task) * 2)  # the file's first episode
        np.testing.assert_allclose(demos.obs["state"][rows[0]], first["state"][0], atol=1e-5)
        np.testing.assert_array_equal(demos.obs["rgb"][rows[0]], first["rgb"][0])


@pytest.mark.slow
def test_sft_on_a_task_list_trains_one_policy_and_names_a_missing_task(demo_paths, tmp_path):
    cfg = list_config()
    check_recipe_fits(cfg, [read_meta(p) for p in demo_paths])
    result = run_sft(cfg, SFTConfig(demos=demo_paths, out=str(tmp_path / "sft"), epochs=1, batch_size=8, val_fraction=0.25),
                     log=lambda _: None)
    assert result.metrics["sft/episodes"] == 4
    with pytest.raises(UserError, match="no episode of PickCube-v1"):
        run_sft(cfg, SFTConfig(demos=demo_paths[:1], out=str(tmp_path / "sft2"), epochs=1), log=lambda _: None)
