"""`embodied sft` of a tiny π0 trains by flow matching: on scripted PickCube demos made here the
held-out flow-matching MSE (scored at the same draws every epoch) falls, and the written dir
initialises the π0 PPO recipe's policy (and a critic-free one) with the weights of the best epoch."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill", reason="ManiSkill is not installed (pip install 'embodied[maniskill]')")
pytest.importorskip("transformers", reason="the π0 policies need the vla extra")

from pipelines.cli import build_train_config, main  # noqa: E402
from pipelines.collect import to_torch  # noqa: E402
from pipelines.demos import load_demos, read_meta  # noqa: E402
from pipelines.sft import SFTConfig, demo_spaces, objective_of, run_sft  # noqa: E402
from pipelines.warmstart import mean_nll, split_episodes  # noqa: E402
from policies.registry import build_policy  # noqa: E402

RECIPE = "maniskill_pickcube_pi0_ppo_tiny"
EPISODES = 4  # the episodes of the pickcube_demos fixture (tests/conftest.py)
SEED = 0


@pytest.fixture(scope="module")
def sft_run(pickcube_demos, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "pick-pi0"
    cfg = build_train_config([RECIPE, f"seed={SEED}"])
    lines: list[str] = []
    result = run_sft(cfg, SFTConfig(demos=[str(pickcube_demos)], out=str(out), epochs=4, lr=1e-3, batch_size=16, val_fraction=0.25),
                     log=lines.append)
    return cfg, result, lines


def _spaces_and_demos(cfg, pickcube_demos):
    meta = read_meta(pickcube_demos)
    demos = load_demos([pickcube_demos], chunk=cfg.policy.action_chunk)
    return (*demo_spaces(demos, meta.action_low, meta.action_high), demos)


def _held_out_loss(policy, demos) -> float:
    """The held-out flow-matching MSE as SFT scores it (the same rows, batches and draws)."""
    objective = objective_of(policy, demos, SEED)
    _, rows = split_episodes(demos, 0.25, SEED)
    return mean_nll(policy.eval(), demos, objective.actions, rows, 16, loss=objective.held_out())


def test_sft_of_a_flow_policy_lowers_the_held_out_flow_matching_loss(sft_run) -> None:
    _, result, lines = sft_run
    m = result.metrics
    assert m["sft/objective"] == "flow_mse" and "sft/val_nll_first" not in m
    assert m["sft/episodes"] == EPISODES and m["sft/validation_frames"] > 0
    assert 0.5 < m["sft/val_flow_mse_first"] < 3.0  # a random velocity against noise - actions: about the target's variance
    assert m["sft/val_flow_mse_best"] < m["sft/val_flow_mse_first"] - 0.1
    assert [e["epoch"] for e in m["sft/epochs"]] == [1, 2, 3, 4]
    assert sum("held-out flow-matching MSE" in line for line in lines) >= 5  # before training and after each epoch


def test_the_held_out_loss_is_scored_at_the_same_draws_each_time(sft_run, pickcube_demos) -> None:
    cfg, _, _ = sft_run
    obs_space, action_space, demos = _spaces_and_demos(cfg, pickcube_demos)
    torch.manual_seed(1)
    policy = build_policy(cfg.policy, obs_space, action_space)
    first, again = _held_out_loss(policy, demos), _held_out_loss(policy, demos)
    assert first == again
    objective = objective_of(policy, demos, SEED)
    obs = to_torch(demos.select(np.arange(8)), torch.device("cpu"))
    with torch.no_grad():
        draws = [objective.loss(policy, obs, objective.actions[:8]).item() for _ in range(2)]
    assert draws[0] != draws[1]  # training draws fresh times and noise


def test_the_sft_dir_initialises_the_pi0_ppo_and_grpo_policies_with_the_best_epoch(sft_run, pickcube_demos) -> None:
    cfg, result, _ = sft_run
    assert {"model.safetensors", "state.json", "sft.json", "recipe.yaml"} <= {p.name for p in result.path.iterdir()}
    assert build_train_config([str(result.path / "recipe.yaml")]).policy.init == str(result.path.resolve())
    obs_space, action_space, demos = _spaces_and_demos(cfg, pickcube_demos)
    torch.manual_seed(1)  # another initialisation than SFT's: what matches comes from the file
    ppo = build_policy(dataclasses.replace(cfg.policy, init=str(result.path)), obs_space, action_space)
    assert ppo.has_critic
    assert _held_out_loss(ppo, demos) == pytest.approx(result.metrics["sft/val_flow_mse_best"], rel=1e-5)
    torch.manual_seed(1)
    fresh = build_policy(cfg.policy, obs_space, action_space)
    assert _held_out_loss(fresh, demos) > result.metrics["sft/val_flow_mse_best"] + 0.1
    grpo = dataclasses.replace(cfg.policy, kwargs={**cfg.policy.kwargs, "add_value_head": 0}, init=str(result.path))
    assert not build_policy(grpo, obs_space, action_space).has_critic  # no critic in the file: it fits a policy without one


def test_embodied_sft_pi0_reads_the_env_from_the_demos(pickcube_demos, tmp_path, capsys) -> None:
    out = tmp_path / "pi0"
    assert main(["sft", "pi0", f"demos={pickcube_demos}", f"out={out}", "epochs=1", "batch_size=64"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["path"] == str(out) and summary["episodes"] == EPISODES
    assert np.isfinite(summary["val_flow_mse_first"]) and np.isfinite(summary["val_flow_mse_best"])
