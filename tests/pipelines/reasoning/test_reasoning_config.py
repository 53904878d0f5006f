"""The reasoning config (checked when built) and the preflight (files, model, verifiers, prompt
lengths: checked before a run writes anything)."""

from __future__ import annotations

import json

import pytest

from embodied.config import apply_overrides
from embodied.errors import ConfigError, UserError
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.preflight import prepare
from tests.pipelines.reasoning.tiny import tiny_config


def build(*overrides: str) -> ReasoningConfig:
    return apply_overrides(ReasoningConfig, {}, list(overrides))


@pytest.mark.parametrize("overrides, needle", [
    (["algo.group_size=1"], "group_size must be >= 2"),
    (["data.train_batch_size=64", "algo.num_minibatches=3"], "algo.num_minibatches=3 must divide data.train_batch_size=64"),
    (["algo.num_minibatches=4", "plan.chunks=3"], "plan.chunks=3 must divide algo.num_minibatches=4"),
    (["policy.name=mlp"], "policy.name must be causal_lm"),
    (["algo.name=ppo"], "'grpo'"),
    (["policy.kwargs.max_new_tokens=8", "reward.max_response_length=6"], "differs from policy.kwargs.max_new_tokens=8"),
    (["workers.rollout_device=gpu"], "workers.rollout_device must be cpu, cuda"),
    (["algo.iterations=0"], "algo.iterations must be >= 1"),
])
def test_bad_values_are_config_errors_naming_the_key(overrides, needle) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        build(*overrides)
    assert needle in str(err.value)


def test_defaults_aliases_and_budget() -> None:
    cfg = build("algo.num_generations=4", "algo.ppo_epochs=2", "policy.kwargs.max_new_tokens=32", "data.train_batch_size=8")
    assert (cfg.algo.group_size, cfg.algo.epochs) == (4, 2)  # TRL's and veRL's names
    assert cfg.reward.max_response_length == 32  # the overlong penalty's L_max follows the rollout's
    assert (cfg.algo.lr, cfg.algo.anneal_lr, cfg.algo.loss_agg_mode, cfg.algo.use_kl_loss) == (1e-6, False, "token-mean", False)
    assert cfg.algo.outcome == "return" and cfg.samples_per_iteration == 32
    assert cfg.total_prompts == 100 * 8 and cfg.total_iterations == 100
    cfg = build("algo.total_prompts=20", "data.train_batch_size=8")
    assert cfg.total_prompts == 20 and cfg.total_iterations == 3  # whole iterations


def test_a_missing_file_model_or_setting_is_one_user_error(tmp_path) -> None:
    cfg = tiny_config(tmp_path)
    cfg.data.train_files = [str(tmp_path / "nope.jsonl")]
    with pytest.raises(UserError, match="nope.jsonl' does not exist"):
        prepare(cfg, log=lambda line: None)
    cfg.data.train_files = []
    with pytest.raises(UserError, match="data.train_files is empty"):
        prepare(cfg, log=lambda line: None)
    cfg = tiny_config(tmp_path / "b", "policy.kwargs.model_path=''")
    with pytest.raises(UserError, match="policy.kwargs.model_path is not set"):
        prepare(cfg, log=lambda line: None)
    cfg = tiny_config(tmp_path / "c", f"policy.kwargs.model_path={tmp_path}")
    with pytest.raises(UserError, match="not a Hugging Face model directory"):
        prepare(cfg, log=lambda line: None)


def test_a_data_source_without_a_verifier_is_refused(tmp_path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"data_source": "my/puzzles", "prompt": "1+1=", "answer": "2"}) + "\n")
    cfg = tiny_config(tmp_path, f"data.train_files=[{rows}]", "data.val_files=[]", "reward.verifier=auto")
    with pytest.raises(UserError, match="no verifier is known for data_source 'my/puzzles'"):
        prepare(cfg, log=lambda line: None)
    cfg.reward.verifier = "exact"
    assert len(prepare(cfg, log=lambda line: None).train) == 1


def test_overlong_prompts_stop_the_run_or_are_dropped(tmp_path) -> None:
    cfg = tiny_config(tmp_path, "data.max_prompt_length=5")  # "47+85=" has 6 tokens, "7+85=" 5
    with pytest.raises(UserError, match=r"has 6 tokens, more than data.max_prompt_length=5"):
        prepare(cfg, log=lambda line: None)
    lines: list[str] = []
    cfg.data.filter_overlong_prompts = True
    data = prepare(cfg, log=lines.append)
    assert data.dropped > 0 and len(data.train) == 200 - data.dropped
    assert any(f"dropped {data.dropped}" in line for line in lines)
    assert any("loss_agg_mode=token-mean" in line and "norm_adv_by_std_in_grpo=True" in line for line in lines)
    cfg = tiny_config(tmp_path / "long", "data.max_prompt_length=126")  # + 4 response tokens > 128 positions
    with pytest.raises(UserError, match="exceeds the model's max_position_embeddings=128"):
        prepare(cfg, log=lambda line: None)
