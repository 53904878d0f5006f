"""Checks and preparation before a reasoning run writes anything: the warm start, the model
directory, the dataset files, the verifiers of their data sources, and every prompt's length.

    data = prepare(cfg, log)     # UserError naming what to fix, or the records the run trains on

With ``warm_start.enabled`` the cached SFT runs first (``pipelines.reasoning.sft``); its model
becomes ``policy.kwargs.model_path`` and its data ``data.train_files`` / ``data.val_files`` where
those are empty, written into ``cfg`` so that the run's ``config.yaml`` names them. GRPO is refused
unless the SFT stopped at its accuracy target (``warm_start.require_target``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.errors import UserError
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.data import PromptRecord, read_records
from pipelines.reasoning.verifiers import RewardFunction, verifier_name_for
from policies.lm.options import parse_options


@dataclass
class PreparedData:
    """What a run trains and evaluates on, after the checks."""

    train: list[PromptRecord]
    """Training prompts (overlong ones dropped with ``data.filter_overlong_prompts``)."""
    val: list[PromptRecord]
    """Held-out problems of the evaluation (the first ``eval.problems``; empty: no evaluation)."""
    dropped: int = 0
    """Training prompts longer than ``data.max_prompt_length`` that were dropped."""
    warm_start: dict[str, Any] = field(default_factory=dict)
    """The SFT warm start's metrics (``warm_start/*``), empty without one."""


def run_warm_start(cfg: ReasoningConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """Run (or load) the cached SFT of ``cfg.warm_start``; fill in the model and data it made."""
    from pipelines.reasoning.sft import run_sft

    ws = cfg.warm_start
    log(f"[reasoning] warm start: supervised fine-tuning of a tiny Qwen2 (cached in {ws.cache_dir}) ...")
    result = run_sft(ws.sft, ws.cache_dir)
    metrics = result.metrics
    reason = metrics.get("sft/stop_reason")
    summary = (f"stopped by {reason!r} after {metrics.get('sft/steps')} steps, {metrics.get('sft/time_s')} s; held-out "
               f"greedy {100 * metrics.get('eval/greedy_acc', float('nan')):.1f}%, sampled "
               f"{100 * metrics.get('eval/sampled_acc', float('nan')):.1f}%")
    log(f"[reasoning] warm start {'(cached) ' if result.cached else ''}{summary}; model {result.model_dir}")
    if reason != "target" and ws.require_target:
        raise UserError(
            f"The SFT warm start did not reach its target (sampled validation accuracy "
            f"{metrics.get('sft/val_sampled_acc', float('nan')):.2f} < warm_start.sft.stop_at_sampled_acc="
            f"{ws.sft.stop_at_sampled_acc}; {summary}). GRPO from this start would see mostly all-wrong groups and "
            "get no gradient. Raise warm_start.sft.steps or warm_start.sft.time_budget_s, try another "
            "warm_start.sft.seed, or set warm_start.require_target=false to start anyway."
        )
    cfg.policy.kwargs["model_path"] = str(result.model_dir)
    if not cfg.data.train_files:
        cfg.data.train_files = [str(result.data_files["train"])]
    if not cfg.data.val_files:
        cfg.data.val_files = [str(result.data_files["test"])]
    keep = ("sft/steps", "sft/stop_reason", "sft/time_s", "eval/greedy_acc", "eval/sampled_acc", "eval/pass@8")
    return {f"warm_start/{k.split('/', 1)[1] if k.startswith('sft/') else k.replace('/', '_')}": metrics[k]
            for k in keep if k in metrics}


def prepare(cfg: ReasoningConfig, log: Callable[[str], None] = print) -> PreparedData:
    """Every check a reasoning run needs before it writes anything; returns its prompts."""
    warm = run_warm_start(cfg, log) if cfg.warm_start.enabled else {}
    if not cfg.policy.kwargs.get("model_path"):
        raise UserError(
            "policy.kwargs.model_path is not set: point it at a local Hugging Face model directory (config.json, "
            "weights, tokenizer files), e.g. `embodied train reasoning_grpo policy.kwargs.model_path=/models/"
            "Qwen2.5-0.5B-Instruct data.train_files=[/data/gsm8k/train.parquet]`."
        )
    options = parse_options(cfg.policy.kwargs)
    if not cfg.data.train_files:
        raise UserError(
            "data.train_files is empty: give the training prompts as veRL parquet or JSONL files (or TRL "
            "prompt-only rows), e.g. data.train_files=[/data/gsm8k/train.parquet] data.val_files=[/data/gsm8k/test.parquet]."
        )
    train = read_records(cfg.data.train_files, cfg.data)
    val = read_records(cfg.data.val_files, cfg.data) if cfg.data.val_files else []
    if cfg.eval.problems:
        val = val[: cfg.eval.problems]
    check_verifiers(cfg, train + val)
    train, dropped = check_prompt_lengths(cfg, options, train, log)
    if not train:
        raise UserError(f"no training prompt fits data.max_prompt_length={cfg.data.max_prompt_length}; raise it.")
    if not val:
        log("[reasoning] no data.val_files: the run is not evaluated (eval/* metrics are left out)")
    log(f"[reasoning] {len(train):,} training prompts, {len(val):,} held-out problems; GRPO with "
        f"algo.loss_agg_mode={cfg.algo.loss_agg_mode}, algo.norm_adv_by_std_in_grpo={cfg.algo.norm_adv_by_std_in_grpo} "
        f"({'group std' if cfg.algo.norm_adv_by_std_in_grpo else 'no std: Dr. GRPO'}), {cfg.data.train_batch_size} prompts x "
        f"{cfg.algo.group_size} responses per iteration in {cfg.algo.num_minibatches} minibatch(es), lr {cfg.algo.lr:g}, "
        f"KL loss {'on' if cfg.algo.use_kl_loss else 'off'}")
    return PreparedData(train=train, val=val, dropped=dropped, warm_start=warm)


def check_verifiers(cfg: ReasoningConfig, records: list[PromptRecord]) -> None:
    """Build the reward function (an unknown verifier name fails here) and, with ``verifier: auto``,
    find a verifier for every data source (an unknown one is a UserError asking for reward.verifier)."""
    RewardFunction(cfg.reward).close()
    if cfg.reward.verifier == "auto":
        for source in sorted({r.data_source for r in records}):
            verifier_name_for(source)


def check_prompt_lengths(cfg: ReasoningConfig, options: Any, records: list[PromptRecord],
                         log: Callable[[str], None]) -> tuple[list[PromptRecord], int]:
    """Count every prompt's tokens as the rollout will feed them (chat template included); drop the
    ones longer than ``data.max_prompt_length`` with ``data.filter_overlong_prompts``, else stop with
    a UserError naming the first. Loads the tokenizer only, never the weights."""
    from policies.lm.policy import load_tokenizer, prompt_token_ids

    tokenizer = load_tokenizer(options)
    limit = cfg.data.max_prompt_length
    kept: list[PromptRecord] = []
    longest = 0
    for record in records:
        length = len(prompt_token_ids(tokenizer, record.prompt, options.chat_template, options.model_path))
        if length > limit and not cfg.data.filter_overlong_prompts:
            raise UserError(
                f"prompt {record.uid!r} has {length} tokens, more than data.max_prompt_length={limit}. Raise "
                "data.max_prompt_length, or set data.filter_overlong_prompts=true to drop such prompts."
            )
        if length <= limit:
            kept.append(record)
            longest = max(longest, length)
    dropped = len(records) - len(kept)
    if dropped:
        log(f"[reasoning] dropped {dropped:,} of {len(records):,} training prompts longer than {limit} tokens")
    total = limit + int(options.max_new_tokens)
    config = Path(options.model_path).expanduser() / "config.json"
    positions = json.loads(config.read_text()).get("max_position_embeddings")
    if positions is not None and total > int(positions):
        raise UserError(
            f"data.max_prompt_length={limit} + policy.kwargs.max_new_tokens={options.max_new_tokens} = {total} tokens "
            f"exceeds the model's max_position_embeddings={positions}; lower one of them."
        )
    return kept, dropped
