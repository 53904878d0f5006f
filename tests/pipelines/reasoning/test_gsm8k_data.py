"""GSM8K's own JSONL ("question", "answer" ending in "#### N") with a local model directory: the
``reasoning_grpo_gsm8k`` recipe reads it, the preflight accepts it, and the gsm8k verifier scores it."""

from __future__ import annotations

import json

from embodied.config import apply_overrides
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.data import DataConfig, read_records
from pipelines.reasoning.preflight import prepare
from pipelines.reasoning.verifiers import RewardFunction
from pipelines.recipes import load_recipe
from policies.lm.tiny import TinyModelConfig, write_tiny_model

ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
               "in April and May.\n#### 72"},
    {"question": "A shop sells 1,000 pens a day. How many in 2 days?", "answer": "1000*2 = 2000\n#### 2,000"},
]
SUFFIX = " Let's think step by step and output the final answer after \"####\"."


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_prompt_suffix_and_chat_prompts(tmp_path) -> None:
    write_jsonl(tmp_path / "d.jsonl", [
        {"question": "2+2?", "answer": "#### 4"},
        {"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3?"}], "answer": "6"},
    ])
    chat = read_records(tmp_path / "d.jsonl", DataConfig(prompt_key="question", chat_prompts=True, prompt_suffix=" Answer:"))
    assert chat[0].prompt == [{"role": "user", "content": "2+2? Answer:"}] and chat[0].ground_truth == "#### 4"
    # a chat prompt gets the suffix on its last message; a string prompt stays a string without chat_prompts
    assert chat[1].prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3? Answer:"}]
    plain = read_records(tmp_path / "d.jsonl", DataConfig(prompt_key="question", prompt_suffix=" Answer:"))
    assert plain[0].prompt == "2+2? Answer:"


def test_gsm8k_jsonl_and_a_local_model_through_the_recipe(tmp_path) -> None:
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    model_dir = write_tiny_model(tmp_path / "model", TinyModelConfig(style="chat", max_position_embeddings=512))
    _, data = load_recipe("reasoning_grpo_gsm8k")
    cfg = apply_overrides(ReasoningConfig, data, [
        f"policy.kwargs.model_path={model_dir}", f"data.train_files=[{tmp_path / 'train.jsonl'}]",
        f"data.val_files=[{tmp_path / 'test.jsonl'}]", "policy.kwargs.max_new_tokens=64", "data.max_prompt_length=400",
        "data.train_batch_size=2", "algo.num_minibatches=1",
    ])
    prepared = prepare(cfg, log=lambda line: None)
    assert [r.uid for r in prepared.train] == ["train/0", "train/1"] and len(prepared.val) == 1
    first = prepared.train[0]
    assert first.prompt == [{"role": "user", "content": ROWS[0]["question"] + SUFFIX}]
    assert first.data_source == "openai/gsm8k" and first.ground_truth.endswith("#### 72")
    reward = RewardFunction(cfg.reward)
    responses = ["48 + 24 = 72 #### 72", "#### 71", "so 2000 pens.\n#### 2,000", "The answer is 2000"]
    golds = [first.ground_truth, first.ground_truth, prepared.train[1].ground_truth, prepared.train[1].ground_truth]
    batch = reward(responses, golds, [first.data_source] * 4)
    assert [r.acc for r in batch.results] == [True, False, True, False]  # strict: the last "#### N" only
    assert batch.metrics["reward/gold_errors"] == 0.0 and batch.metrics["reward/format_error_rate"] == 0.25
    assert read_records(tmp_path / "train.jsonl", cfg.data) == prepared.train
