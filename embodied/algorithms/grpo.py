"""GRPO (Shao et al. 2024, DeepSeekMath): no critic; each rollout is compared with its group.

A group is G rollouts from the same start: G envs reset to one initial state (embodied), or G
responses to one prompt (reasoning).

    advantages:  each env's first episode in the batch is one rollout; its outcome (``success`` or
                 the episode ``return``) is compared with its group's: ``(r - mean) / (std + eps)``
                 (``grpo``; without the std for Dr. GRPO), or the leave-one-out baseline (``rloo``).
                 Every decision of the episode gets the episode's advantage (with
                 ``episode_weight=equal`` scaled so that every episode weighs the same, whatever
                 its length); decisions after it ended (the env auto-reset) stay out of the loss.
                 With ``return_to_go`` each decision is scored by the rewards from it on, against
                 the group's members at the same step.
                 With ``filter_groups``, groups whose outcomes have no spread stay out too
                 (dynamic sampling). A batch in which no group has any spread teaches nothing:
                 that is logged as a warning (the first time, then at most once per
                 ``ZERO_SIGNAL_WARN_EVERY`` batches; ``embodied.rl.ZeroSignalMonitor``).
    minibatch:   advantages normalized to mean 0 / std 1 only with ``norm_adv`` (off by default).
    loss:        clipped surrogate (clip-higher, dual clip) - entropy bonus + kl_loss_coef * KL to
                 the reference, aggregated with ``loss_agg_mode``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from embodied.algorithms.base import ALGORITHMS, Advantages, Algorithm
from embodied.algorithms.config import AlgoConfig
from embodied.rl import (
    ADVANTAGE_ESTIMATORS,
    LossAggCounts,
    Samples,
    TrajectoryBatch,
    ZeroSignalMonitor,
    decision_ends,
    first_episode_mask,
    first_episode_outcome,
    first_episode_returns_to_go,
    frac_reward_zero_std,
    zero_std_group_mask,
)

LOG = logging.getLogger("embodied.grpo")


def equal_episode_weights(mask: torch.Tensor) -> torch.Tensor:
    """(B,) weights that make each column's episode (its decisions in ``mask`` (T, B)) weigh the
    same in a loss that averages decisions: the mean episode length / the episode's length."""
    lengths = mask.sum(0).float()
    mean = lengths[lengths > 0].mean() if (lengths > 0).any() else lengths.new_tensor(1.0)
    return torch.where(lengths > 0, mean / lengths.clamp(min=1), torch.zeros_like(lengths))


@ALGORITHMS.register("grpo")
class GRPO(Algorithm):
    """Group-relative policy optimization: outcome rewards, no critic."""

    name = "grpo"
    estimators = ("grpo", "rloo")

    def __init__(self, cfg: AlgoConfig) -> None:
        super().__init__(cfg)
        self.zero_signal = ZeroSignalMonitor()

    @property
    def grouped(self) -> bool:
        return True

    def advantages(self, batch: TrajectoryBatch) -> Advantages:
        cfg = self.cfg
        if batch.group_ids is None:
            raise ValueError("GRPO needs group ids in the batch: the rollout did not start envs in groups")
        group_ids = batch.group_ids.long()
        rewards = batch.rewards.float() * cfg.reward_scale
        outcome, finished = first_episode_outcome(
            rewards, batch.valid, batch.terminated, batch.truncated, batch.success,
            "return" if cfg.outcome == "return_to_go" else cfg.outcome,
        )  # (B,)
        terminated, truncated, _ = decision_ends(batch.terminated, batch.truncated, batch.valid)
        mask = first_episode_mask(terminated, truncated)  # (T, B)
        estimate = ADVANTAGE_ESTIMATORS.get(cfg.estimator)
        options = {"normalize_std": cfg.norm_adv_by_std_in_grpo} if cfg.estimator == "grpo" else {}
        if cfg.outcome == "return_to_go":  # a group per (step, group): the members still in their episode
            to_go = first_episode_returns_to_go(rewards, batch.valid, batch.terminated, batch.truncated, cfg.gamma)  # (T, B)
            steps = torch.arange(mask.shape[0], device=mask.device)[:, None] * (int(group_ids.max()) + 1)
            advantages = torch.zeros_like(to_go)
            advantages[mask] = estimate(to_go[mask], group_ids=(steps + group_ids[None, :])[mask], **options)
        else:
            advantages = estimate(outcome, group_ids=group_ids, **options).expand_as(mask)  # (T, B)
            if cfg.episode_weight == "equal":
                advantages = advantages * equal_episode_weights(mask)[None, :]
        if cfg.filter_groups:
            mask = mask & zero_std_group_mask(outcome, group_ids)[None, :]
        frac_zero_std = float(frac_reward_zero_std(outcome, group_ids))
        warning = self.zero_signal.observe(frac_zero_std, int(group_ids.unique().numel()))
        if warning is not None:
            LOG.warning(f"[grpo] {warning}")
        stats = {
            "grpo/outcome_mean": float(outcome.mean()),
            "grpo/frac_reward_zero_std": frac_zero_std,
            "grpo/unfinished_episodes": float((~finished).float().mean()),
            "grpo/decisions_in_loss": float(mask.float().mean()),
        }
        return Advantages(advantages.contiguous(), None, mask, stats)

    def loss(self, policy: Any, mb: Samples, counts: LossAggCounts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ev = policy.evaluate(mb.obs, mb.actions)
        return self.policy_objective(ev, mb, counts)
