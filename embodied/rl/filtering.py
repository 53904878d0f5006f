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

__all__ = ["ZERO_SIGNAL_WARN_EVERY", "ZeroSignalMonitor", "frac_reward_zero_std", "zero_std_group_mask"]

#: After the first warning, a run that keeps getting batches without signal is told again at most
#: once per this many batches: often enough to see in a log, rarely enough not to drown it.
ZERO_SIGNAL_WARN_EVERY = 50


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


class ZeroSignalMonitor:
    """Says when a batch has no learning signal: every group's rewards are equal, so every advantage
    is 0 and the update changes nothing (a run of such batches learns nothing, silently).

    :meth:`observe` takes each batch's share of zero-spread groups and returns a one-line warning
    the first time the share is 1, then at most once per ``every`` batches while it happens again
    (with how many such batches there were since the last warning); None otherwise."""

    def __init__(self, every: int = ZERO_SIGNAL_WARN_EVERY, unit: str = "batch") -> None:
        if every < 1:
            raise ValueError(f"ZeroSignalMonitor: every must be >= 1 (got {every})")
        self.every = every
        self.unit = unit  # what one observation is, in the warning ("batch", "iteration")
        self.units = unit + ("(es)" if unit.endswith(("s", "sh", "ch", "x", "z")) else "(s)")
        self.batches = 0
        self.zero_signal_batches = 0
        self._last_warned: int | None = None  # the batch number of the last warning
        self._since_warned = 0

    def observe(self, frac_zero_std: float, num_groups: int | None = None) -> str | None:
        """The warning for a batch whose groups (``num_groups``, None: not known) have
        ``frac_zero_std`` zero spread."""
        self.batches += 1
        if frac_zero_std < 1.0:
            return None
        self.zero_signal_batches += 1
        self._since_warned += 1
        if self._last_warned is not None and self.batches - self._last_warned < self.every:
            return None
        count, self._since_warned, self._last_warned = self._since_warned, 0, self.batches
        seen = "" if self.zero_signal_batches == 1 else f" ({count} such {self.units} since the last warning)"
        groups = "the groups" if num_groups is None else f"{num_groups} group(s)"
        return (
            f"no learning signal: all {groups} of {self.unit} {self.batches} have equal rewards, so every "
            f"advantage is 0 and the update does nothing{seen}. Raise algo.group_size, use harder data (all "
            "right) or easier data / a warm start (all wrong), or raise the sampling temperature for more varied "
            "samples."
        )
