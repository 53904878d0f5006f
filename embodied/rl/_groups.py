"""Grouping of flat samples for group-relative estimators and filters (GRPO, RLOO, filtering).

A batch of ``N`` rollouts is split into groups (the ``n`` samples drawn for one prompt, task or
initial state) either by ``group_size`` (consecutive runs) or by explicit integer ``group_ids``.
Every group-wise statistic here is a scatter over a dense group index, so no Python loop runs
over samples and the order of the samples does not matter.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from embodied.rl._checks import check_rank, check_shape


class Groups(NamedTuple):
    """Dense group membership of ``N`` samples."""

    index: torch.Tensor  # (N,) long, group of each sample in [0, num_groups)
    num_groups: int


def as_float_rewards(fn: str, rewards: object) -> torch.Tensor:
    """``(N,)`` rewards as a float tensor (integers, e.g. 0/1 accuracy, are cast)."""
    rewards = check_rank(fn, "rewards", rewards, 1, "(N,)")
    if rewards.dtype == torch.bool or not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    return rewards


def make_groups(
    fn: str, rewards: torch.Tensor, group_size: int | None, group_ids: torch.Tensor | None
) -> Groups:
    """Group membership from exactly one of ``group_size`` and ``group_ids``.

    Args:
        fn: the public function's name, for error messages.
        rewards: ``(N,)``, only its length and device are used.
        group_size: groups are consecutive runs of ``group_size`` samples.
        group_ids: ``(N,)`` integer label per sample, any values, in any order.
    """
    num_samples = rewards.shape[0]
    if (group_size is None) == (group_ids is None):
        raise ValueError(f"{fn}: pass exactly one of `group_size` and `group_ids`")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"{fn}: `group_size` must be a positive int, got {group_size!r}")
        if num_samples % group_size != 0:
            raise ValueError(
                f"{fn}: N = {num_samples} rewards do not split into groups of "
                f"group_size = {group_size} (N must be a multiple of group_size)"
            )
        index = torch.arange(num_samples, device=rewards.device) // group_size  # (N,)
        return Groups(index, num_samples // group_size)
    group_ids = check_shape(fn, "group_ids", group_ids, (num_samples,), "(N,)", "rewards")
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"{fn}: `group_ids` must be an integer tensor, got {group_ids.dtype}")
    unique_ids, index = torch.unique(group_ids, return_inverse=True)
    return Groups(index.to(rewards.device), unique_ids.numel())


def group_reduce(
    groups: Groups, values: torch.Tensor, kind: Literal["sum", "amax", "amin"]
) -> torch.Tensor:
    """Per-group ``sum``, ``amax`` or ``amin`` of ``(N,)`` values -> ``(num_groups,)``."""
    if kind == "sum":
        return values.new_zeros(groups.num_groups).index_add_(0, groups.index, values)
    fill = float("-inf") if kind == "amax" else float("inf")
    out = values.new_full((groups.num_groups,), fill)
    return out.scatter_reduce_(0, groups.index, values, reduce=kind, include_self=True)


def has_spread(groups: Groups, rewards: torch.Tensor) -> torch.Tensor:
    """``(num_groups,)`` bool: the group's rewards are not all exactly equal.

    Exact equality (not a tolerance) so that this agrees sample for sample with the
    advantage estimators, which give exactly 0 to such groups. A group of one has no spread.
    """
    return group_reduce(groups, rewards, "amax") != group_reduce(groups, rewards, "amin")
