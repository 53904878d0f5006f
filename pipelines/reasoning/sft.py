"""Supervised warm start of a tiny causal LM on the synthetic arithmetic task, cached by config.

GRPO learns only from groups whose samples disagree: from ~0% accuracy nearly every group of 8 is
all-wrong and the gradient is zero (see docs/reasoning.md). So the CPU demo first trains a tiny
Qwen2 from scratch by cross-entropy on the response tokens (the answer and its EOS; prompt tokens
carry no loss) until sampled accuracy is in the range GRPO can raise, and no further:

    result = run_sft(SFTConfig(), cache_dir="~/.cache/embodied/sft")
    result.model_dir       # a Hugging Face directory for policy.kwargs.model_path
    result.data_files      # {"train": ..., "test": ...} veRL-schema JSONL of the same problems
    result.metrics         # eval/greedy_acc, eval/sampled_acc, eval/pass@8, sft/time_s, ...

Training runs through the policy's own ``evaluate`` (left-padded prompts, the RL position ids),
so SFT and RL see the same inputs. The result is cached under ``cache_dir/sft-<hash of the config
and library versions>``; a second call with the same config loads it. The defaults are the
calibrated settings of docs/reasoning.md. ``python -m pipelines.reasoning.sft --help`` runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from embodied.config import apply_overrides, to_dict
from embodied.errors import UserError
from pipelines.reasoning.data import PromptRecord, read_records
from pipelines.reasoning.synthetic import ArithConfig, result_width, write_arith_dataset
from pipelines.reasoning.verifiers import RewardConfig, RewardFunction
from policies.lm.options import CausalLMOptions
from policies.lm.tiny import TinyModelConfig, write_tiny_model

if TYPE_CHECKING:  # transformers loads only when a policy is built (SFTConfig is part of config schemas)
    from policies.lm.policy import CausalLMPolicy

#: Bump when the training code changes what a cached result would be.
CACHE_VERSION = 1


@dataclass
class SFTConfig:
    """The warm start: model, data, optimisation and its budget, evaluation."""

    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    """The tiny Qwen2 trained from its random initialisation (its defaults are the calibrated size)."""
    data: ArithConfig = field(default_factory=ArithConfig)
    """The synthetic problems (train split trains, test split evaluates)."""
    steps: int = 3000
    """Optimizer steps (the step budget)."""
    time_budget_s: float = 300.0
    """Training stops after this many seconds even if ``steps`` are not done (0: no limit)."""
    stop_at_sampled_acc: float = 0.3
    """Stop as soon as sampled accuracy on the validation problems reaches this (0: never): the
    model then has enough right samples for GRPO and enough wrong ones to learn from."""
    check_every: int = 25
    """Steps between validation checks of the stopping rule (a fifth of it once the validation
    accuracy is past half the target)."""
    val_problems: int = 200
    """Validation problems of the stopping rule: the last ones of the train split, kept out of SFT."""
    val_samples: int = 4
    """Samples per validation problem."""
    batch_size: int = 64
    """Problems per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warmup, then cosine decay to ``lr * final_lr_fraction``)."""
    warmup_steps: int = 20
    """Steps of linear warmup."""
    final_lr_fraction: float = 1.0
    """Learning rate at the last step, as a fraction of ``lr``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    seed: int = 0
    """Seed of the batch order and of sampling during evaluation."""
    eval_problems: int = 500
    """Held-out problems evaluated (at most the test split)."""
    eval_samples: int = 8
    """Samples per problem for sampled accuracy (pass@1) and pass@k (k = eval_samples)."""
    eval_batch_size: int = 1024
    """Sequences per ``generate`` call in evaluation."""
    eval_every: int = 0
    """Also evaluate every this many steps (metrics ``curve``); 0: only at the end."""

    def validate(self) -> None:
        self.data.validate()
        positive = ("steps", "batch_size", "eval_problems", "eval_samples", "eval_batch_size", "check_every", "val_samples")
        for name in positive:
            if getattr(self, name) < 1:
                raise UserError(f"sft.{name}={getattr(self, name)!r} must be a positive integer.")
        if self.lr <= 0 or not 0 <= self.final_lr_fraction <= 1 or self.warmup_steps < 0 or self.time_budget_s < 0:
            raise UserError("sft.lr must be > 0, final_lr_fraction in [0, 1], warmup_steps and time_budget_s >= 0.")
        if not 0 <= self.stop_at_sampled_acc <= 1 or self.val_problems < 0:
            raise UserError("sft.stop_at_sampled_acc must be in [0, 1] and sft.val_problems >= 0.")
        if self.stop_at_sampled_acc and not self.val_problems:
            raise UserError("sft.stop_at_sampled_acc needs validation problems: set sft.val_problems > 0.")


@dataclass
class SFTResult:
    """Where the warm-started model and its data are, and how it did."""

    model_dir: Path
    data_files: dict[str, Path]
    metrics: dict[str, Any]
    cached: bool


def cache_key(cfg: SFTConfig) -> str:
    """Hash of the config and of what else decides the result (library versions, CACHE_VERSION)."""
    import transformers

    identity = {"config": to_dict(cfg), "version": CACHE_VERSION, "torch": torch.__version__, "transformers": transformers.__version__}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def run_sft(cfg: SFTConfig, cache_dir: str | Path) -> SFTResult:
    """Train (or load the cached result of) the warm start described by ``cfg``."""
    cfg.validate()
    cache_dir = Path(cache_dir).expanduser()
    final = cache_dir / f"sft-{cache_key(cfg)}"
    if (final / "sft.json").is_file():
        return _load(final, cached=True)
    work = cache_dir / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        data_files = write_arith_dataset(work / "data", cfg.data, fmt="jsonl")
        write_tiny_model(work / "init", cfg.model)
        policy = sft_policy(work / "init", cfg.data)
        train = read_records(data_files["train"])
        test = read_records(data_files["test"])[: cfg.eval_problems]
        held = cfg.val_problems if cfg.stop_at_sampled_acc else 0
        if held >= len(train):
            raise UserError(f"sft.val_problems={held} leaves no training problems of {len(train)}.")
        train, val = (train[:-held], train[-held:]) if held else (train, [])
        metrics = train_sft(policy, train, cfg, eval_records=test, val_records=val)
        policy.save_pretrained(work / "model")
        shutil.rmtree(work / "init")
        summary = {"config": to_dict(cfg), "key": final.name, "metrics": metrics}
        (work / "sft.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if not final.exists():
            work.rename(final)  # atomic: a cache entry is complete or absent
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _load(final, cached=False)


def _load(directory: Path, cached: bool) -> SFTResult:
    summary = json.loads((directory / "sft.json").read_text(encoding="utf-8"))
    files = {split: directory / "data" / f"{split}.jsonl" for split in ("train", "test")}
    return SFTResult(model_dir=directory / "model", data_files=files, metrics=summary["metrics"], cached=cached)


def max_answer_tokens(policy: CausalLMPolicy, records: Sequence[PromptRecord]) -> int:
    return max(len(policy.tokenizer(r.ground_truth, add_special_tokens=False)["input_ids"]) for r in records)


def sft_policy(model_dir: str | Path, data: ArithConfig) -> CausalLMPolicy:
    """The policy SFT trains and evaluates: temperature 1, no top-k/top-p (the RL rollout's
    distribution), room for the longest answer (digits and a sign), its EOS and one token more."""
    from policies.lm.policy import CausalLMPolicy

    longest = max(result_width(op, data.digits) for op in data.operations) + 1
    return CausalLMPolicy(CausalLMOptions(model_path=str(model_dir), max_new_tokens=longest + 2))


def response_batch(policy: CausalLMPolicy, answers: Sequence[str], width: int) -> torch.Tensor:
    """Target responses (B, width): each answer's tokens, its EOS, then the pad id."""
    eos = policy.eos_token_ids[0]
    actions = torch.full((len(answers), width), policy.pad_token_id, dtype=torch.long)
    for i, answer in enumerate(answers):
        ids = policy.tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos]
        if len(ids) > width:
            raise UserError(f"answer {answer!r} needs {len(ids)} tokens with its EOS; responses have {width}.")
        actions[i, : len(ids)] = torch.tensor(ids)
    return actions.to(policy.device)


def sft_loss(policy: CausalLMPolicy, records: Sequence[PromptRecord], width: int) -> torch.Tensor:
    """Mean cross-entropy (nats per token) of the answers and their EOS given the prompts."""
    obs = policy.encode_prompts([r.prompt for r in records])
    actions = response_batch(policy, [r.ground_truth for r in records], width)
    logprobs = policy.evaluate(obs, actions).logprobs  # (B, K), 0 after each EOS
    mask = policy.response_mask(actions)
    return -(logprobs * mask).sum() / mask.sum()


def train_sft(
    policy: CausalLMPolicy,
    records: Sequence[PromptRecord],
    cfg: SFTConfig,
    eval_records: Sequence[PromptRecord] = (),
    val_records: Sequence[PromptRecord] = (),
) -> dict[str, Any]:
    """Up to ``cfg.steps`` AdamW steps of :func:`sft_loss` on shuffled batches; stops early when the
    sampled accuracy on ``val_records`` reaches ``cfg.stop_at_sampled_acc`` (checked every
    ``cfg.check_every`` steps) or at the time budget. Then, with ``eval_records``, the held-out
    accuracies. Returns the metrics."""
    if not records:
        raise UserError("SFT got no training records.")
    width = max_answer_tokens(policy, records) + 1
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, cfg))
    order = _batches(len(records), cfg.batch_size, random.Random(cfg.seed))
    policy.train()
    losses: list[float] = []
    curve: list[dict[str, Any]] = []
    start = time.perf_counter()
    train_s = 0.0
    step = 0
    stop_reason = "steps"
    val_acc = float("nan")
    while step < cfg.steps:
        if cfg.time_budget_s and train_s > cfg.time_budget_s:
            stop_reason = "time"
            break
        tick = time.perf_counter()
        loss = sft_loss(policy, [records[i] for i in next(order)], width)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        train_s += time.perf_counter() - tick
        losses.append(loss.item())
        step += 1
        if cfg.eval_every and eval_records and step % cfg.eval_every == 0 and step < cfg.steps:
            point = evaluate_accuracy(policy, eval_records, cfg.eval_samples, cfg.eval_batch_size, cfg.seed)
            curve.append({"step": step, "train_s": round(train_s, 2), **point})
            policy.train()
        # Checks come 5x more often once validation accuracy is past half the target: the last
        # stretch of the transition is steep (docs/reasoning.md).
        every = cfg.check_every if not val_acc >= cfg.stop_at_sampled_acc / 2 else max(1, cfg.check_every // 5)
        if cfg.stop_at_sampled_acc and val_records and step % every == 0:
            tick = time.perf_counter()
            val_acc = sampled_accuracy(policy, val_records, cfg.val_samples, cfg.eval_batch_size, cfg.seed + step)
            train_s += time.perf_counter() - tick  # the rule's checks are part of the budget
            policy.train()
            if val_acc >= cfg.stop_at_sampled_acc:
                stop_reason = "target"
                break
    metrics: dict[str, Any] = {
        "sft/steps": step,
        "sft/stop_reason": stop_reason,
        "sft/val_sampled_acc": val_acc,
        "sft/time_s": round(train_s, 2),
        "sft/wall_s": round(time.perf_counter() - start, 2),
        "sft/loss_first": losses[0],
        "sft/loss_last": sum(losses[-10:]) / len(losses[-10:]),
    }
    if eval_records:
        tick = time.perf_counter()
        metrics.update(evaluate_accuracy(policy, eval_records, cfg.eval_samples, cfg.eval_batch_size, cfg.seed))
        metrics["eval/time_s"] = round(time.perf_counter() - tick, 2)
    if curve:
        metrics["curve"] = curve
    return metrics


def _lr_factor(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    low = cfg.final_lr_fraction
    return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _batches(count: int, size: int, rng: random.Random):
    """Endless batches of indices: epochs of a fresh permutation each."""
    pending: list[int] = []
    while True:
        while len(pending) < size:
            epoch = list(range(count))
            rng.shuffle(epoch)
            pending.extend(epoch)
        yield pending[:size]
        del pending[:size]


@torch.no_grad()
def evaluate_accuracy(
    policy: CausalLMPolicy,
    records: Sequence[PromptRecord],
    samples: int = 8,
    batch_size: int = 1024,
    seed: int = 0,
    reward: RewardFunction | None = None,
) -> dict[str, float]:
    """Held-out accuracy: greedy, sampled (mean over ``samples`` per problem: pass@1) and
    pass@``samples`` (any of them right), scored by the records' verifiers."""
    reward = reward or RewardFunction(RewardConfig())
    greedy = _correct(policy, records, True, batch_size, reward)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        repeated = [r for r in records for _ in range(samples)]
        sampled = torch.tensor(_correct(policy, repeated, False, batch_size, reward)).reshape(len(records), samples)
    return {
        "eval/problems": float(len(records)),
        "eval/greedy_acc": sum(greedy) / len(records),
        "eval/sampled_acc": sampled.float().mean().item(),
        f"eval/pass@{samples}": sampled.any(dim=1).float().mean().item(),
    }


@torch.no_grad()
def sampled_accuracy(
    policy: CausalLMPolicy, records: Sequence[PromptRecord], samples: int, batch_size: int, seed: int
) -> float:
    """Mean accuracy of ``samples`` sampled responses per problem (the stopping rule's measure)."""
    reward = RewardFunction(RewardConfig())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        correct = _correct(policy, [r for r in records for _ in range(samples)], False, batch_size, reward)
    return sum(correct) / len(correct)


def _correct(
    policy: CausalLMPolicy, records: Sequence[PromptRecord], greedy: bool, batch_size: int, reward: RewardFunction
) -> list[bool]:
    policy.eval()
    correct: list[bool] = []
    for begin in range(0, len(records), batch_size):
        chunk = records[begin : begin + batch_size]
        out = policy.act(policy.encode_prompts([r.prompt for r in chunk]), deterministic=greedy)
        texts = policy.decode(out.actions, out.mask)
        scored = reward(texts, [r.ground_truth for r in chunk], [r.data_source for r in chunk])
        correct.extend(result.acc for result in scored.results)
    return correct


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Warm-start a tiny Qwen2 on synthetic arithmetic (cached).")
    parser.add_argument("--cache-dir", default="~/.cache/embodied/sft", help="where results are cached")
    parser.add_argument("overrides", nargs="*", help="SFTConfig fields as key=value (e.g. steps=200 model.num_layers=3)")
    args = parser.parse_args(argv)
    cfg = apply_overrides(SFTConfig, {}, list(args.overrides))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = run_sft(cfg, args.cache_dir)
    summary = {k: v for k, v in result.metrics.items() if k != "curve"}
    print(json.dumps({"model_dir": str(result.model_dir), "cached": result.cached, **summary}, indent=2))
    for point in result.metrics.get("curve", []):
        print(json.dumps(point))


if __name__ == "__main__":
    main()
