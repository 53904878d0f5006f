"""`embodied sft`: behaviour cloning of a VLA on demonstration files made here lowers the held-out
NLL, writes a dir that `policy.init` loads into the RL recipes' policies, and refuses demos of
another controller, task or image size."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from embodied.errors import UserError

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (pip install 'embodied[maniskill]')")
pytest.importorskip("transformers", reason="the VLA policies need the vla extra")

from pipelines.cli import build_train_config, main  # noqa: E402
from pipelines.demos import load_demos, read_meta  # noqa: E402
from pipelines.sft_cli import parse_sft_args  # noqa: E402
from pipelines.sft import SFTConfig, check_recipe_fits, demo_spaces, per_token, run_sft  # noqa: E402
from pipelines.warmstart import mean_nll  # noqa: E402
from policies.registry import build_policy  # noqa: E402

RECIPE = "maniskill_pickcube_openvlaoft_ppo_tiny"
EPISODES = 4  # the episodes of the pickcube_demos fixture (tests/conftest.py)


@pytest.fixture(scope="module")
def sft_run(pickcube_demos, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "pick"
    cfg = build_train_config([RECIPE])
    lines: list[str] = []
    result = run_sft(cfg, SFTConfig(demos=[str(pickcube_demos)], out=str(out), epochs=4, lr=1e-3, batch_size=16, val_fraction=0.25),
                     log=lines.append)
    return cfg, result, lines


def test_sft_lowers_the_held_out_nll_and_reports_it_every_epoch(sft_run) -> None:
    _, result, lines = sft_run
    m = result.metrics
    assert m["sft/episodes"] == EPISODES and m["sft/validation_frames"] > 0
    assert m["sft/val_nll_first"] == pytest.approx(np.log(256), abs=0.5)  # a random tiny head: near uniform per token
    assert m["sft/val_nll_best"] < m["sft/val_nll_first"] - 0.5
    assert [e["epoch"] for e in m["sft/epochs"]] == [1, 2, 3, 4]
    assert sum("held-out NLL" in line for line in lines) >= 5  # before training and after each epoch


def test_the_sft_dir_initialises_the_ppo_and_grpo_policies_with_its_weights(sft_run, pickcube_demos) -> None:
    cfg, result, _ = sft_run
    files = {p.name for p in result.path.iterdir()}
    assert {"model.safetensors", "state.json", "sft.json", "recipe.yaml"} <= files
    assert json.loads((result.path / "sft.json").read_text())["metrics"]["sft/best_epoch"] == result.metrics["sft/best_epoch"]
    assert build_train_config([str(result.path / "recipe.yaml")]).policy.init == str(result.path.resolve())
    meta = read_meta(pickcube_demos)
    demos = load_demos([pickcube_demos], chunk=cfg.policy.action_chunk)
    obs_space, action_space = demo_spaces(demos, meta.action_low, meta.action_high)
    ppo = build_policy(dataclasses.replace(per_token(cfg.policy), init=str(result.path)), obs_space, action_space)
    actions = torch.as_tensor(ppo.encode_actions(torch.as_tensor(demos.actions)))
    rows = np.arange(len(demos))
    fresh = build_policy(per_token(cfg.policy), obs_space, action_space)
    assert mean_nll(ppo.eval(), demos, actions, rows, 32) < mean_nll(fresh.eval(), demos, actions, rows, 32) - 0.5
    grpo_policy = dataclasses.replace(cfg.policy, kwargs={**cfg.policy.kwargs, "value_head": 0}, init=str(result.path))
    build_policy(grpo_policy, obs_space, action_space)  # no critic in the file: it fits a policy without one


def test_demos_of_another_controller_task_or_size_are_refused(pickcube_demos) -> None:
    meta = read_meta(pickcube_demos)
    with pytest.raises(UserError, match="control_mode=pd_ee_delta_pos"):
        check_recipe_fits(build_train_config([RECIPE, "env.kwargs.control_mode=pd_joint_delta_pos"]), [meta])
    with pytest.raises(UserError, match="env.id=PickCube-v1"):
        check_recipe_fits(build_train_config([RECIPE, "env.id=PushCube-v1"]), [meta])
    with pytest.raises(UserError, match="image_size=64"):
        check_recipe_fits(build_train_config([RECIPE, "env.image_size=64"]), [meta])


def test_embodied_sft_of_a_policy_name_reads_the_env_from_the_demos(pickcube_demos, tmp_path, capsys) -> None:
    out = tmp_path / "oft"
    assert main(["sft", "openvla_oft", f"demos={pickcube_demos}", f"out={out}", "epochs=1", "batch_size=64"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["path"] == str(out) and summary["episodes"] == EPISODES
    assert main(["sft", "openvla_oft", f"demos={pickcube_demos}", f"out={out}", "epochs=1"]) == 2  # exists: nothing overwritten
    assert main(["sft", RECIPE, f"demos={pickcube_demos}", "epoch=3"]) == 2  # a misspelt key
    assert parse_sft_args([RECIPE, f"demos={pickcube_demos}", "lr=3e-4", "policy.kwargs.lora_rank=8"])[1:] == (
        SFTConfig(demos=[str(pickcube_demos)], lr=3e-4), ["policy.kwargs.lora_rank=8"])


@pytest.mark.slow
def test_a_train_run_starts_from_the_sft_dir(sft_run, tmp_path) -> None:
    _, result, _ = sft_run
    run = tmp_path / "run"
    code = main(["train", RECIPE, f"policy.init={result.path}", "algo.total_env_steps=104", "env.num_envs=2", "env.num_procs=1",
                 "eval.episodes=2", "eval.num_envs=2", "plan.profile=false", f"run.dir={run}"])
    assert code == 0
    from embodied.config import load_yaml

    assert load_yaml(run / "config.yaml")["policy"]["init"] == str(result.path)
    assert (run / "checkpoints" / "latest").is_file()
