"""A small reasoning setup for tests: a tiny random Qwen2 and synthetic arithmetic files written to
a temporary directory, and a verifier a random model satisfies often enough to give GRPO a signal."""

from __future__ import annotations

from pathlib import Path

from embodied.config import apply_overrides
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.synthetic import ArithConfig, write_arith_dataset
from policies.lm.tiny import TinyModelConfig, write_tiny_model

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
#: a custom verifier (``module:function``) rewarding responses whose first character has an even
#: code: a random byte-level model gets it right half of the time, so most groups disagree
EVEN_FIRST_CHARACTER = "tests.pipelines.reasoning.tiny:even_first_character"


def even_first_character(response: str, ground_truth: str) -> bool:
    return bool(response) and ord(response[0]) % 2 == 0


def tiny_files(directory: Path, model: TinyModelConfig = SMALL) -> tuple[Path, dict[str, Path]]:
    """(model dir, {"train": ..., "test": ...}): two-digit addition (prompts of 4 to 6 tokens), 200
    training and 20 held-out problems."""
    model_dir = write_tiny_model(directory / "model", model)
    files = write_arith_dataset(directory / "data", ArithConfig(digits=2, test_size=20, train_size=200))
    return model_dir, files


def tiny_config(directory: Path, *overrides: str) -> ReasoningConfig:
    """A reasoning config on :func:`tiny_files` in ``directory`` (4 prompts x 4 responses of 4
    tokens, 2 minibatches, no logging sinks, the local backend), with ``overrides`` on top."""
    model_dir, files = tiny_files(directory)
    return apply_overrides(ReasoningConfig, {}, [
        f"policy.kwargs.model_path={model_dir}", "policy.kwargs.max_new_tokens=4",
        f"data.train_files=[{files['train']}]", f"data.val_files=[{files['test']}]", "data.max_prompt_length=8",
        "data.train_batch_size=4", "algo.group_size=4", "algo.num_minibatches=2", "algo.lr=1e-2",
        f"reward.verifier={EVEN_FIRST_CHARACTER}", "eval.problems=8", "eval.samples=2",
        "cluster.backend=local", "plan.profile=false", "logging.wandb=false", "logging.tensorboard=false",
        *overrides,
    ])
