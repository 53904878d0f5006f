"""RL math: advantage estimators, PPO/GRPO losses and their aggregation as pure torch functions.

Tensors are time-major ``(T, B)`` (rollout steps, parallel envs), flat ``(N,)`` samples, or
``(B, K)`` tokens of ``B`` sequences (an LLM's response, a VLA's action tokens) with a bool mask.
Names of options follow veRL (``loss_agg_mode``, ``clip_ratio_low/high/c``, ``kl_loss_type``,
``rollout_is``); TRL's names map onto them through ``LOSS_AGG_ALIASES`` and ``TRL_IS_MODES``.
"""

from embodied.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    gae,
    grpo_advantages,
    normalize_advantages,
    rloo_advantages,
)
from embodied.rl.aggregation import (
    LOSS_AGG_ALIASES,
    LOSS_AGG_MODES,
    LossAggAlias,
    LossAggCounts,
    LossAggMode,
    agg_entropy,
    agg_loss,
    loss_agg_counts,
    resolve_loss_agg_mode,
)
from embodied.rl.filtering import ZERO_SIGNAL_WARN_EVERY, ZeroSignalMonitor, frac_reward_zero_std, zero_std_group_mask
from embodied.rl.importance import (
    TRL_IS_MODES,
    ISLevel,
    ISMode,
    ISModeAlias,
    rollout_is_weights,
)
from embodied.rl.kl import KL_ESTIMATORS, kl_penalty
from embodied.rl.losses import policy_loss_per_token, should_stop_early, value_errors
from embodied.rl.returns import (
    OutcomeKind,
    bootstrap_rule,
    chunk_bootstrap_discount,
    chunk_rewards,
    decision_ends,
    first_episode_mask,
    first_episode_outcome,
    first_episode_returns_to_go,
)
from embodied.rl.trajectory import Samples, TrajectoryBatch, is_text, micro_batches

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_ALIASES",
    "LOSS_AGG_MODES",
    "TRL_IS_MODES",
    "ZERO_SIGNAL_WARN_EVERY",
    "ISLevel",
    "ISMode",
    "ISModeAlias",
    "LossAggAlias",
    "LossAggCounts",
    "LossAggMode",
    "ZeroSignalMonitor",
    "agg_entropy",
    "agg_loss",
    "frac_reward_zero_std",
    "gae",
    "grpo_advantages",
    "kl_penalty",
    "loss_agg_counts",
    "normalize_advantages",
    "policy_loss_per_token",
    "resolve_loss_agg_mode",
    "rloo_advantages",
    "rollout_is_weights",
    "should_stop_early",
    "value_errors",
    "zero_std_group_mask",
    "OutcomeKind",
    "Samples",
    "TrajectoryBatch",
    "bootstrap_rule",
    "chunk_bootstrap_discount",
    "chunk_rewards",
    "decision_ends",
    "first_episode_mask",
    "first_episode_outcome",
    "first_episode_returns_to_go",
    "is_text",
    "micro_batches",
]
