"""What flows between the reasoning workers, and the trajectory a scored chunk becomes.

    rollout ──GeneratedChunk (token ids, logprobs, texts; whole groups)──▶ reward
    reward  ──ScoredChunk (a TrajectoryBatch with rewards, and reward statistics)──▶ trainer

A response is one decision of a one-step episode, so a chunk of n responses is a
:class:`~embodied.rl.TrajectoryBatch` with T = 1, B = n, C = 1:

    obs       {"prompt_ids": (1, n, P) long, "prompt_mask": (1, n, P) bool}, left-padded to
              P = data.max_prompt_length, so chunks of one run concatenate
    actions   (1, n, K) response token ids, K = max_new_tokens
    logprobs  (1, n, K) the rollout's logprobs; action_mask (1, n, K) the response mask (all False
              for a response left out of the loss: a truncated one with reward.mask_truncated)
    rewards   (1, n, 1) the verifier's score (with any overlong penalty); success (1, n, 1) correct
    terminated (1, n, 1) True; truncated False; valid True; group_ids (n,) one id per prompt draw
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from embodied.rl import TrajectoryBatch, frac_reward_zero_std
from pipelines.reasoning.prompts import PromptChunk
from pipelines.reasoning.rollout import Generation
from pipelines.reasoning.verifiers import RewardBatch, RewardFunction


def widen_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad (n, P') prompts to (n, width); ValueError when a prompt is longer than ``width``."""
    n, current = prompt_ids.shape
    longest = int(prompt_mask.sum(dim=1).max()) if n else 0
    if longest > width:
        raise ValueError(f"a prompt has {longest} tokens, more than data.max_prompt_length={width}")
    ids = np.full((n, width), pad_id, dtype=np.int64)
    mask = np.zeros((n, width), dtype=bool)
    keep = min(current, width)  # columns of left padding beyond `width` are all padding
    ids[:, width - keep :] = prompt_ids[:, current - keep :].numpy()
    mask[:, width - keep :] = prompt_mask[:, current - keep :].numpy()
    return ids, mask


@dataclass
class GeneratedChunk:
    """One chunk of whole groups as the rollout generated it (n = prompts x G responses, prompt-major).

    ``prompt_ids`` / ``prompt_mask`` (n, P); ``response_ids``, ``logprobs``, ``response_mask``
    (n, K); ``truncated`` (n,); ``group_ids`` (n,) int64; ``ground_truths``, ``data_sources``,
    ``texts``: n strings; ``uids``: the prompts' record uids (n / G)."""

    index: int
    first_prompt: int
    group_size: int
    uids: list[str]
    group_ids: np.ndarray
    ground_truths: list[str]
    data_sources: list[str]
    texts: list[str]
    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    response_ids: np.ndarray
    logprobs: np.ndarray
    response_mask: np.ndarray
    truncated: np.ndarray
    version: int
    generate_s: float

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def of(cls, chunk: PromptChunk, gen: Generation, group_size: int, prompt_width: int, pad_id: int,
           version: int, generate_s: float) -> GeneratedChunk:
        """The message for ``chunk`` from its generation (``group_size`` responses per prompt)."""
        if len(gen) != len(chunk) * group_size:
            raise ValueError(f"chunk {chunk.index}: {len(gen)} responses for {len(chunk)} prompts x {group_size}")
        ids, mask = widen_prompts(gen.prompt_ids, gen.prompt_mask, prompt_width, pad_id)

        def per_sample(values: Sequence[Any]) -> list[Any]:
            return [v for v in values for _ in range(group_size)]

        return cls(
            index=chunk.index,
            first_prompt=chunk.first,
            group_size=group_size,
            uids=[d.record.uid for d in chunk.draws],
            group_ids=np.repeat(np.array([d.group_id for d in chunk.draws], dtype=np.int64), group_size),
            ground_truths=per_sample([d.record.ground_truth for d in chunk.draws]),
            data_sources=per_sample([d.record.data_source for d in chunk.draws]),
            texts=list(gen.texts),
            prompt_ids=ids,
            prompt_mask=mask,
            response_ids=gen.response_ids.numpy().astype(np.int64),
            logprobs=gen.logprobs.numpy().astype(np.float32),
            response_mask=gen.response_mask.numpy().astype(bool),
            truncated=gen.truncated.numpy().astype(bool),
            version=version,
            generate_s=generate_s,
        )


@dataclass
class ScoredChunk:
    """A chunk with its rewards: the trajectory the trainer trains on, and what to log about it.

    ``response_lengths`` / ``prompt_lengths`` (n,) tokens (EOS included; before any loss masking);
    ``truncated`` (n,); ``reward_sums``: each of the reward function's mean metrics times n (sums
    add up over chunks); ``errors``: the reward function's first error messages."""

    index: int
    first_prompt: int
    batch: TrajectoryBatch
    response_lengths: np.ndarray
    prompt_lengths: np.ndarray
    truncated: np.ndarray
    reward_sums: dict[str, float]
    reward_s: float
    generate_s: float
    errors: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.batch.num_envs


def trajectory_of(chunk: GeneratedChunk, rewards: RewardBatch) -> TrajectoryBatch:
    """The (T = 1, B = n, C = 1) trajectory of a scored chunk (see the module docstring)."""
    n = len(chunk)
    scores = np.asarray(rewards.scores, dtype=np.float32).reshape(1, n, 1)
    correct = np.asarray([r.acc for r in rewards.results], dtype=bool).reshape(1, n, 1)
    in_loss = np.asarray(rewards.loss_mask, dtype=bool)
    return TrajectoryBatch(
        obs={"prompt_ids": chunk.prompt_ids[None], "prompt_mask": chunk.prompt_mask[None]},
        actions=chunk.response_ids[None],
        logprobs=chunk.logprobs[None],
        rewards=scores,
        terminated=np.ones((1, n, 1), dtype=bool),
        truncated=np.zeros((1, n, 1), dtype=bool),
        valid=np.ones((1, n, 1), dtype=bool),
        action_mask=(chunk.response_mask & in_loss[:, None])[None],
        success=correct,
        group_ids=chunk.group_ids.copy(),
        version=chunk.version,
    ).check()


def score_chunk(chunk: GeneratedChunk, reward: RewardFunction) -> ScoredChunk:
    """Score a generated chunk with the reward function (timed)."""
    t0 = time.perf_counter()
    lengths = chunk.response_mask.sum(axis=1)
    scored = reward(chunk.texts, chunk.ground_truths, chunk.data_sources, response_lengths=lengths.tolist(),
                    truncated=chunk.truncated.tolist())
    reward_s = time.perf_counter() - t0
    n = len(chunk)
    sums = {k: float(v) * n if not k.endswith("_errors") else float(v) for k, v in scored.metrics.items()
            if k != "response/clipped_ratio"}  # response_length/clip_ratio is computed from the tokens
    return ScoredChunk(
        index=chunk.index, first_prompt=chunk.first_prompt, batch=trajectory_of(chunk, scored),
        response_lengths=lengths.astype(np.int64), prompt_lengths=chunk.prompt_mask.sum(axis=1).astype(np.int64),
        truncated=chunk.truncated.copy(), reward_sums=sums, reward_s=reward_s, generate_s=chunk.generate_s,
        errors=list(scored.errors),
    )


def iteration_metrics(chunks: Sequence[ScoredChunk]) -> dict[str, float]:
    """What users look for about an iteration's responses (veRL / TRL names under namespaces):
    ``reward/mean``, ``reward/std``, ``reward/acc``, ``reward/frac_reward_zero_std`` (share of
    groups whose rewards are all equal: no gradient from them), ``reward/format_error_rate``,
    ``reward/gold_errors``, ``reward/verifier_errors``, ``reward/overlong_penalty_mean``,
    ``response_length/{mean,max,min,clip_ratio}`` (tokens, EOS included; clip ratio: share cut at
    max_new_tokens) and ``prompt_length/mean``."""
    n = sum(len(c) for c in chunks)
    scores = np.concatenate([c.batch.rewards.reshape(-1) for c in chunks])
    groups = np.concatenate([c.batch.group_ids for c in chunks])
    lengths = np.concatenate([c.response_lengths for c in chunks])
    sums: dict[str, float] = {}
    for c in chunks:
        for k, v in c.reward_sums.items():
            sums[k] = sums.get(k, 0.0) + v
    out = {k: (v if k.endswith("_errors") else v / n) for k, v in sums.items()}
    out.update({
        "reward/std": float(scores.std()),
        "reward/frac_reward_zero_std": float(frac_reward_zero_std(torch.as_tensor(scores), torch.as_tensor(groups))),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": float(np.concatenate([c.truncated for c in chunks]).mean()),
        "prompt_length/mean": float(np.concatenate([c.prompt_lengths for c in chunks]).mean()),
    })
    return out
