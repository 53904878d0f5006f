"""Dynamic sampling: find the groups whose rewards carry no learning signal (DAPO).

A group-relative estimator (GRPO, RLOO) gives every sample of a group with equal rewards an
advantage of exactly 0: all correct or all wrong, the group teaches nothing, yet it still counts
in the loss's denominators and dilutes the batch. DAPO's dynamic sampling (veRL
``algorithm.filter_groups``) drops such groups and samples more prompts until the batch is full;
TRL logs their share as ``frac_reward_zero_std``. A group of one has no spread either.

"Zero spread" is exact equality of the group's rewards, the same test the advantage estimators
use for their 0, so the samples kept here are exactly those with a non-zero advantage (barring a
sample that happens to equal its group's mean).
"""

from __future__ import annotations

import torch

from embodied.rl._groups import as_float_rewards, has_spread, make_groups

__all__ = ["frac_reward_zero_std", "zero_std_group_mask"]


def zero_std_group_mask(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
) -> torch.Tensor:
    """``(N,)`` bool: True for the samples of groups whose rewards are not all equal (to keep).

    Args:
        rewards: ``(N,)`` one scalar per rollout, the metric to filter on (veRL
            ``filter_groups.metric``: the accuracy or the sequence reward); integers are cast.
        group_ids: ``(N,)`` integer group label per sample, any values, in any order.
        group_size: instead of ``group_ids``, groups are consecutive runs of ``group_size``.
            Pass exactly one of the two.

    Returns:
        ``(N,)`` bool mask in the order of ``rewards``; False for every sample of a group with
        zero spread (including groups of one).
    """
    fn = "zero_std_group_mask"
    rewards = as_float_rewards(fn, rewards)
    groups = make_groups(fn, rewards, group_size, group_ids)
    return has_spread(groups, rewards)[groups.index]


def frac_reward_zero_std(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
) -> torch.Tensor:
    """Share of *groups* whose rewards have zero spread, as a 0-d float tensor (TRL's metric).

    TRL averages over samples; with groups of equal size (``rollout.n``) that is the same number.
    Watch it: near 1.0 the gradient is (almost) 0, whatever the loss value says.

    Args:
        rewards, group_ids, group_size: see :func:`zero_std_group_mask`.
    """
    fn = "frac_reward_zero_std"
    rewards = as_float_rewards(fn, rewards)
    groups = make_groups(fn, rewards, group_size, group_ids)
    if groups.num_groups == 0:
        raise ValueError(f"{fn}: `rewards` is empty (N = 0)")
    return (~has_spread(groups, rewards)).to(rewards.dtype).mean()
