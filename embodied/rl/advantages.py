"""Advantage estimators: GAE for critic-based PPO, group-relative advantages for GRPO and RLOO.

Pure functions on time-major tensors. Shapes use ``T`` (rollout steps) and ``B`` (parallel
envs); GRPO works on ``N`` flat samples (e.g. ``G`` groups of ``S`` rollouts from the same
initial state or task).

Pipelines pick an estimator by name from :data:`ADVANTAGE_ESTIMATORS`
(``ADVANTAGE_ESTIMATORS.get(cfg.advantage)(**inputs)``) rather than branching on strings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from embodied.registry import Registry
from embodied.rl._checks import (
    as_bool,
    check_floating,
    check_mask,
    check_range,
    check_rank,
    check_shape,
    check_tensor,
    masked_mean,
)
from embodied.rl._groups import as_float_rewards, group_reduce, has_spread, make_groups

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "gae",
    "grpo_advantages",
    "normalize_advantages",
    "rloo_advantages",
]

ADVANTAGE_ESTIMATORS: Registry[Callable[..., Any]] = Registry("advantage estimator")


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor | None,
    last_values: torch.Tensor,
    gamma: float,
    lam: float,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016), telling termination from truncation.

    Timing convention: ``values[t] = V(obs_t)``; acting in ``obs_t`` yields ``rewards[t]``,
    ``terminated[t]`` and ``truncated[t]``. The value of the next state *of the same episode* is

    * ``0`` if ``terminated[t]`` (a true terminal state has no future; termination wins if
      both flags are set),
    * ``final_values[t]`` if ``truncated[t]`` (a time limit cut the episode short; the env has
      already auto-reset, so ``values[t + 1]`` belongs to the next episode and the final
      observation's value must be supplied separately),
    * ``values[t + 1]`` otherwise, and ``last_values`` for ``t = T - 1``.

    Then ``delta_t = rewards[t] + gamma * next_value_t - values[t]`` and the recursion is cut at
    every episode end, terminated or truncated::

        A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   done_t = terminated_t | truncated_t

    With ``lam = 1`` the advantage is the bootstrapped discounted return minus ``values``; with
    ``lam = 0`` it is the one-step TD error ``delta_t``.

    Args:
        rewards: ``(T, B)`` float, reward received after acting at step ``t``.
        values: ``(T, B)`` float, ``V(obs_t)`` under the policy that collected the data.
        terminated: ``(T, B)`` bool (or 0/1), the episode reached a terminal state at ``t``.
        truncated: ``(T, B)`` bool (or 0/1), the episode was cut (time limit) at ``t``.
        final_values: ``(T, B)`` float, ``V(final obs)`` of an episode truncated at ``t``. Only
            read where ``truncated`` is True, so other entries may hold anything, NaN included.
            ``None`` is allowed when nothing is truncated (a ``ValueError`` otherwise).
        last_values: ``(B,)`` float, ``V(obs_T)``: the observation after the last step, used to
            bootstrap step ``T - 1`` when it did not end an episode.
        gamma: discount factor in ``[0, 1]``.
        lam: GAE lambda in ``[0, 1]``.
        valid: optional ``(T, B)`` bool, False on padded steps (e.g. envs that stopped
            collecting). A padded step gets advantage 0 and its TD error is not propagated to
            earlier steps: the recursion sees ``A_{t+1} = 0`` after it. A valid step followed by
            padding without an episode end still bootstraps from ``values[t + 1]``, so padding
            should follow an episode end (or ``values`` there should hold the right bootstrap);
            padded ``values`` must be finite.

    Returns:
        ``(advantages, returns)``, both ``(T, B)``, with ``returns = advantages + values`` (the
        value targets; equal to ``values`` on padded steps).

    Raises:
        ValueError: on wrong shapes, non-float rewards/values, ``gamma``/``lam`` outside
            ``[0, 1]``, or truncated steps without ``final_values``.
    """
    fn = "gae"
    rewards = check_rank(fn, "rewards", rewards, 2, "(T, B)")
    num_steps, num_envs = rewards.shape
    if num_steps == 0:
        raise ValueError(f"{fn}: the rollout is empty (T = 0)")
    for name, x in (("values", values), ("terminated", terminated), ("truncated", truncated)):
        check_shape(fn, name, x, (num_steps, num_envs), "(T, B)", "rewards")
    check_shape(fn, "last_values", last_values, (num_envs,), "(B,)", "rewards.shape[1]")
    check_floating(fn, "rewards", rewards)
    check_floating(fn, "values", values)
    check_floating(fn, "last_values", last_values)
    check_range(fn, "gamma", gamma, 0.0, 1.0)
    check_range(fn, "lam", lam, 0.0, 1.0)
    terminated = as_bool(fn, "terminated", terminated)
    truncated = as_bool(fn, "truncated", truncated)
    if valid is not None:
        valid = check_mask(fn, "valid", valid, (num_steps, num_envs), "rewards")

    # V of the next state inside the same episode. (T, B)
    next_values = torch.cat([values[1:], last_values.unsqueeze(0)], dim=0)
    if final_values is not None:
        check_shape(fn, "final_values", final_values, (num_steps, num_envs), "(T, B)", "rewards")
        check_floating(fn, "final_values", final_values)
        next_values = torch.where(truncated, final_values, next_values)
    elif bool(truncated.any()):
        raise ValueError(
            f"{fn}: `truncated` has True entries but `final_values` is None; a truncated episode "
            "bootstraps from the value of its final observation, pass it as `final_values`"
        )
    zero = torch.zeros((), dtype=next_values.dtype, device=next_values.device)
    next_values = torch.where(terminated, zero, next_values)

    deltas = rewards + gamma * next_values - values  # (T, B)
    # Carry factor for A_{t+1} -> A_t, zero wherever an episode ended at t.
    carry = gamma * lam * (~(terminated | truncated)).to(deltas.dtype)  # (T, B)
    if valid is not None:
        deltas = torch.where(valid, deltas, zero)

    advantage_next = torch.zeros_like(deltas[0])  # (B,)
    advantages_reversed = []
    for t in reversed(range(num_steps)):
        advantage_next = deltas[t] + carry[t] * advantage_next
        if valid is not None:
            advantage_next = torch.where(valid[t], advantage_next, zero)
        advantages_reversed.append(advantage_next)
    advantages = torch.stack(advantages_reversed[::-1], dim=0)  # (T, B)
    return advantages, advantages + values


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(
    rewards: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024, DeepSeekMath): no critic.

    Each sample is compared with the other rollouts of its group (same task / initial state)::

        A_i = (r_i - mean_g) / (std_g + eps)      (or r_i - mean_g if normalize_std is False)

    ``std_g`` is the **sample** standard deviation (Bessel-corrected, ``n - 1`` in the
    denominator), as ``torch.std``'s default computes it and as DeepSeekMath's GRPO and verl use.
    We pin this choice so advantages match those reference implementations number for number;
    with the small groups typical of GRPO (4-16) the two differ noticeably (by
    ``sqrt(n / (n - 1))``). ``normalize_std=False`` gives the Dr. GRPO variant (Liu et al. 2025),
    which drops the division to avoid up-weighting near-constant groups.

    A group whose rewards are all equal (including a group of one) carries no learning signal
    and gets exactly 0, rather than a rounding residue divided by ``eps``.

    Args:
        rewards: ``(N,)`` one scalar reward per rollout (integers are cast to float).
        group_size: groups are consecutive runs of ``group_size`` samples; ``N`` must be a
            multiple of it.
        group_ids: ``(N,)`` integer group label per sample, any values, in any order.
            Pass exactly one of ``group_size`` and ``group_ids``.
        eps: added to the std before dividing.
        normalize_std: divide by the group std (GRPO) or only subtract the mean (Dr. GRPO).

    Returns:
        ``(N,)`` advantages, float, in the order of ``rewards``.

    Raises:
        ValueError: on a wrong shape, both or neither of ``group_size``/``group_ids``, a
            ``group_size`` that does not divide ``N``, or non-integer ``group_ids``.
    """
    fn = "grpo_advantages"
    rewards = as_float_rewards(fn, rewards)
    if eps < 0:
        raise ValueError(f"{fn}: `eps` must be >= 0, got {eps}")
    groups = make_groups(fn, rewards, group_size, group_ids)

    counts = group_reduce(groups, torch.ones_like(rewards), "sum")  # (G,)
    means = group_reduce(groups, rewards, "sum") / counts  # (G,)
    centered = rewards - means[groups.index]  # (N,)
    constant = ~has_spread(groups, rewards)[groups.index]  # (N,)
    if normalize_std:
        variances = group_reduce(groups, centered.square(), "sum") / (counts - 1).clamp(min=1)
        advantages = centered / (variances.sqrt()[groups.index] + eps)
    else:
        advantages = centered
    return torch.where(constant, torch.zeros_like(advantages), advantages)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(
    rewards: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE leave-one-out advantages (Kool et al. 2019; Ahmadian et al. 2024, RLOO).

    Each sample's baseline is the mean reward of the *other* samples of its group::

        A_i = r_i - (sum_g - r_i) / (n_g - 1) = n_g / (n_g - 1) * (r_i - mean_g)

    which is unbiased (the baseline does not depend on the sample it is subtracted from). There is
    no division by the std. A group of one has no other sample to compare with and gets 0, as
    does a group whose rewards are all equal.

    Args:
        rewards: ``(N,)`` one scalar reward per rollout (integers are cast to float).
        group_size: groups are consecutive runs of ``group_size`` samples.
        group_ids: ``(N,)`` integer group label per sample, any values, in any order.
            Pass exactly one of ``group_size`` and ``group_ids``.

    Returns:
        ``(N,)`` advantages, float, in the order of ``rewards``.
    """
    fn = "rloo_advantages"
    rewards = as_float_rewards(fn, rewards)
    groups = make_groups(fn, rewards, group_size, group_ids)
    counts = group_reduce(groups, torch.ones_like(rewards), "sum")[groups.index]  # (N,)
    sums = group_reduce(groups, rewards, "sum")[groups.index]  # (N,)
    advantages = rewards - (sums - rewards) / (counts - 1).clamp(min=1)
    constant = ~has_spread(groups, rewards)[groups.index]  # (N,), includes groups of one
    return torch.where(constant, torch.zeros_like(advantages), advantages)


def normalize_advantages(
    advantages: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """Shift and scale advantages to mean 0 and std 1 over the valid entries.

    ``(A - mean) / (std + eps)`` with the sample std (``n - 1``, ``torch.std``'s default, as in
    GRPO above and CleanRL's PPO). Statistics use only entries where ``mask`` is True;
    masked-out entries come back as 0 so they add nothing to a loss. Fewer than two valid entries
    give all zeros (there is no spread to normalize by).

    Args:
        advantages: float tensor of any shape, e.g. ``(T, B)`` or ``(N,)``.
        mask: optional bool tensor of the same shape, True = valid.
        eps: added to the std before dividing.

    Returns:
        A tensor of the same shape as ``advantages``.
    """
    fn = "normalize_advantages"
    advantages = check_tensor(fn, "advantages", advantages)
    check_floating(fn, "advantages", advantages)
    if mask is None:  # every entry valid (PPO's minibatches): five ops, as CleanRL's one line
        if advantages.numel() < 2:
            return torch.zeros_like(advantages)
        return (advantages - advantages.mean()) / (advantages.std() + eps)
    mask = check_mask(fn, "mask", mask, advantages.shape, "advantages")
    zero = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    mean = masked_mean(advantages, mask)
    centered = torch.where(mask, advantages - mean, zero)
    count = mask.sum()
    variance = centered.square().sum() / (count - 1).clamp(min=1).to(advantages.dtype)
    return centered / (variance.sqrt() + eps)
