"""The SFT warm start: its loss is the response tokens' cross-entropy (checked against the model's
plain forward on unpadded rows), a few steps lower it, the stopping rule stops, evaluation scores
what the policy generates, and results are cached by config."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn import functional as F

from embodied.errors import UserError
from pipelines.reasoning.data import PromptRecord
from pipelines.reasoning.sft import SFTConfig, evaluate_accuracy, run_sft, sft_loss, train_sft
from pipelines.reasoning.synthetic import ArithConfig, make_arith_rows
from policies.lm.options import CausalLMOptions
from policies.lm.policy import CausalLMPolicy
from policies.lm.tiny import TinyModelConfig, write_tiny_model

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def records(cfg: ArithConfig, split: str) -> list[PromptRecord]:
    return [
        PromptRecord(f"{split}/{i}", row["prompt"], row["reward_model"]["ground_truth"], row["data_source"], {})
        for i, row in enumerate(make_arith_rows(cfg)[split])
    ]


@pytest.fixture
def policy(tmp_path) -> CausalLMPolicy:
    return CausalLMPolicy(CausalLMOptions(model_path=str(write_tiny_model(tmp_path / "m", SMALL)), max_new_tokens=5))


def test_loss_is_the_cross_entropy_of_answer_and_eos(policy) -> None:
    batch = [
        PromptRecord("a", "7+85=", "29", "synthetic/arith", {}),  # mixed prompt and answer lengths
        PromptRecord("b", [{"role": "user", "content": "47+85="}], "231", "synthetic/arith", {}),
    ]
    loss = sft_loss(policy, batch, width=5)
    total, tokens = 0.0, 0
    for prompt, answer in (("7+85=", "29"), ("47+85=", "231")):
        prompt_ids = list(prompt.encode())
        target = list(answer.encode()) + [256]  # the answer's bytes and <|endoftext|>
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([prompt_ids + target])).logits[0]
        start = len(prompt_ids) - 1
        total += F.cross_entropy(logits[start : start + len(target)], torch.tensor(target), reduction="sum").item()
        tokens += len(target)
    assert loss.item() == pytest.approx(total / tokens, rel=1e-5)


def test_a_few_steps_lower_the_loss(policy) -> None:
    data = ArithConfig(digits=1, test_size=20)
    cfg = SFTConfig(steps=40, batch_size=32, lr=1e-2, warmup_steps=5, stop_at_sampled_acc=0.0, time_budget_s=0)
    metrics = train_sft(policy, records(data, "train"), cfg)
    assert metrics["sft/steps"] == 40 and metrics["sft/stop_reason"] == "steps"
    assert metrics["sft/loss_last"] < 0.5 * metrics["sft/loss_first"]


def test_stopping_rule_stops_at_the_first_check_that_reaches_the_target(policy) -> None:
    data = ArithConfig(digits=1, test_size=20)
    train = records(data, "train")
    cfg = SFTConfig(steps=300, batch_size=32, lr=1e-2, warmup_steps=5, check_every=10, stop_at_sampled_acc=0.05,
                    val_samples=4, time_budget_s=0)
    metrics = train_sft(policy, train[:-20], cfg, val_records=train[-20:])
    # Checks every 10 steps, every 2 once past half the target.
    assert metrics["sft/stop_reason"] == "target" and metrics["sft/steps"] % 2 == 0 and metrics["sft/steps"] < 300
    assert metrics["sft/val_sampled_acc"] >= 0.05
    # Golds no sample can produce: the rule never fires and the step budget ends training.
    impossible = [PromptRecord(r.uid, r.prompt, "x" * 9, r.data_source, {}) for r in train[:10]]
    metrics = train_sft(policy, train, SFTConfig(steps=20, check_every=5, stop_at_sampled_acc=0.05, time_budget_s=0),
                        val_records=impossible)
    assert metrics["sft/stop_reason"] == "steps" and metrics["sft/steps"] == 20 and metrics["sft/val_sampled_acc"] == 0.0
    with pytest.raises(UserError, match="val_problems"):
        SFTConfig(val_problems=0).validate()


def test_evaluate_accuracy_scores_the_generated_answers(policy) -> None:
    problems = records(ArithConfig(digits=1, test_size=12), "test")
    greedy = policy.act(policy.encode_prompts([r.prompt for r in problems]), deterministic=True)
    texts = policy.decode(greedy.actions)
    own = [PromptRecord(r.uid, r.prompt, text, r.data_source, {}) for r, text in zip(problems, texts) if text.strip()]
    assert own, "the untrained model answered nothing but whitespace"
    metrics = evaluate_accuracy(policy, own, samples=4)
    assert metrics["eval/greedy_acc"] == 1.0  # its own greedy answers are right by construction
    assert metrics["eval/sampled_acc"] <= metrics["eval/pass@4"] <= 1.0
    wrong = [PromptRecord(r.uid, r.prompt, "nope", r.data_source, {}) for r in problems]
    assert evaluate_accuracy(policy, wrong, samples=2) == {
        "eval/problems": 12.0, "eval/greedy_acc": 0.0, "eval/sampled_acc": 0.0, "eval/pass@2": 0.0,
    }


def test_run_sft_writes_a_loadable_model_and_caches_it(tmp_path) -> None:
    cfg = SFTConfig(
        model=SMALL, data=ArithConfig(digits=1, test_size=20), steps=6, batch_size=16, stop_at_sampled_acc=0.0,
        eval_problems=10, eval_samples=2,
    )
    first = run_sft(cfg, tmp_path)
    assert not first.cached and first.metrics["sft/steps"] == 6 and "eval/pass@2" in first.metrics
    assert (first.model_dir / "config.json").is_file() and first.data_files["test"].is_file()
    second = run_sft(cfg, tmp_path)
    assert second.cached and second.model_dir == first.model_dir and second.metrics == first.metrics
    summary = json.loads((first.model_dir.parent / "sft.json").read_text())
    assert summary["config"]["steps"] == 6
    other = run_sft(SFTConfig(**{**cfg.__dict__, "steps": 7}), tmp_path)
    assert other.model_dir != first.model_dir and not other.cached
    policy = CausalLMPolicy(CausalLMOptions(model_path=str(first.model_dir)))
    assert policy.act(policy.encode_prompts(["1+2="])).actions.shape == (1, 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.model_dir.parent.name, other.model_dir.parent.name])
