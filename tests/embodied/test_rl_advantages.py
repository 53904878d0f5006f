"""Advantage estimators pinned to hand-computed numbers (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.errors import UserError
from embodied.rl import (
    ADVANTAGE_ESTIMATORS,
    gae,
    grpo_advantages,
    normalize_advantages,
    rloo_advantages,
)


def tensor(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def flags(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def assert_close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, tensor(expected), rtol=0, atol=1e-9)


# --------------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------------

# One rollout, T = 3 steps, B = 2 envs, identical rewards and values in both envs. Env 0
# TERMINATES at t = 1; env 1 is TRUNCATED at t = 1 with V(final obs) = 6. Both auto-reset, so
# t = 2 is the first step of a new episode. gamma = lam = 0.5, gamma * lam = 0.25.
REWARDS = [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
VALUES = [[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]]
TERMINATED = [[False, False], [True, False], [False, False]]
TRUNCATED = [[False, False], [False, True], [False, False]]
NAN = float("nan")
# Only [1][1] is truncated; every other entry is NaN to prove it is never read.
FINAL_VALUES = [[NAN, NAN], [NAN, 6.0], [NAN, NAN]]
LAST_VALUES = [8.0, 8.0]


def run_mixed_episode_ends() -> tuple[torch.Tensor, torch.Tensor]:
    return gae(
        tensor(REWARDS),
        tensor(VALUES),
        flags(TERMINATED),
        flags(TRUNCATED),
        tensor(FINAL_VALUES),
        tensor(LAST_VALUES),
        gamma=0.5,
        lam=0.5,
    )


def test_gae_termination_vs_truncation_hand_computed() -> None:
    advantages, returns = run_mixed_episode_ends()
    # t = 2, both envs (new episode, not done, bootstrap from last_values = 8):
    #   delta = 1 + 0.5 * 8 - 4 = 1                      A = 1
    # t = 1, env 0 terminated (next value 0, recursion cut):
    #   delta = 1 + 0 - 2 = -1                           A = -1
    # t = 1, env 1 truncated (next value = final value 6, recursion cut):
    #   delta = 1 + 0.5 * 6 - 2 = 2                      A = 2
    # t = 0, next value = values[1] = 2:
    #   delta = 1 + 0.5 * 2 - 1 = 1
    #   env 0: A = 1 + 0.25 * (-1) = 0.75                env 1: A = 1 + 0.25 * 2 = 1.5
    assert_close(advantages, [[0.75, 1.5], [-1.0, 2.0], [1.0, 1.0]])
    # returns = A + V
    assert_close(returns, [[1.75, 2.5], [1.0, 4.0], [5.0, 5.0]])


def test_gae_no_bootstrap_or_recursion_across_episode_boundary() -> None:
    advantages, _ = run_mixed_episode_ends()
    # Had t = 1 bootstrapped from values[2] = 4 (the next episode's first state), env 0 would get
    # delta = 1 + 0.5 * 4 - 2 = 1; had the recursion not been cut, A_2 = 1 would leak in:
    # -1 + 0.25 * 1 = -0.75. Neither happens.
    assert advantages[1, 0].item() == pytest.approx(-1.0, abs=1e-12)
    assert advantages[1, 1].item() == pytest.approx(2.0, abs=1e-12)
    # Changing rewards/values of the next episode leaves the ended step untouched.
    rewards = tensor(REWARDS)
    rewards[2] = 100.0
    values = tensor(VALUES)
    values[2] = -50.0
    changed, _ = gae(
        rewards,
        values,
        flags(TERMINATED),
        flags(TRUNCATED),
        tensor(FINAL_VALUES),
        tensor(LAST_VALUES),
        gamma=0.5,
        lam=0.5,
    )
    assert_close(changed[:2], [[0.75, 1.5], [-1.0, 2.0]])


def test_gae_final_values_only_read_where_truncated() -> None:
    advantages, returns = run_mixed_episode_ends()  # FINAL_VALUES is NaN except where truncated
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()


def test_gae_final_values_may_be_none_without_truncation() -> None:
    # T = 1, B = 1, terminated: delta = 2 + 0 - 0.5 = 1.5
    advantages, _ = gae(
        tensor([[2.0]]), tensor([[0.5]]), flags([[True]]), flags([[False]]), None,
        tensor([9.0]), gamma=0.9, lam=0.9,
    )  # fmt: skip
    assert_close(advantages, [[1.5]])


def test_gae_bootstraps_from_last_values() -> None:
    # T = 2, B = 2, zero rewards and values, no episode ends, gamma = lam = 0.5.
    # last_values = [8, 0]:
    #   env 0: A_1 = 0 + 0.5 * 8 - 0 = 4;  A_0 = 0 + 0.25 * 4 = 1
    #   env 1: all zeros
    zeros = tensor([[0.0, 0.0], [0.0, 0.0]])
    no = flags([[False, False], [False, False]])
    advantages, returns = gae(zeros, zeros, no, no, None, tensor([8.0, 0.0]), gamma=0.5, lam=0.5)
    assert_close(advantages, [[1.0, 0.0], [4.0, 0.0]])
    assert_close(returns, [[1.0, 0.0], [4.0, 0.0]])
    # The same rollout terminated at t = 1 ignores last_values.
    terminated = flags([[False, False], [True, False]])
    advantages, _ = gae(zeros, zeros, terminated, no, None, tensor([8.0, 0.0]), gamma=0.5, lam=0.5)
    assert_close(advantages, [[0.0, 0.0], [0.0, 0.0]])


# A single env, T = 3, no episode end: rewards [1, 2, 3], values [0.5, 1, 1.5], V(obs_3) = 4,
# gamma = 0.5.
SINGLE_REWARDS = [[1.0], [2.0], [3.0]]
SINGLE_VALUES = [[0.5], [1.0], [1.5]]
SINGLE_NOT_DONE = [[False], [False], [False]]


def test_gae_lambda_one_is_discounted_return_minus_value() -> None:
    advantages, returns = gae(
        tensor(SINGLE_REWARDS), tensor(SINGLE_VALUES), flags(SINGLE_NOT_DONE),
        flags(SINGLE_NOT_DONE), None, tensor([4.0]), gamma=0.5, lam=1.0,
    )  # fmt: skip
    # Bootstrapped discounted returns:
    #   G_2 = 3 + 0.5 * 4 = 5;  G_1 = 2 + 0.5 * 5 = 4.5;  G_0 = 1 + 0.5 * 4.5 = 3.25
    # A = G - V = [3.25 - 0.5, 4.5 - 1, 5 - 1.5] = [2.75, 3.5, 3.5]
    assert_close(returns, [[3.25], [4.5], [5.0]])
    assert_close(advantages, [[2.75], [3.5], [3.5]])


def test_gae_lambda_zero_is_one_step_td_error() -> None:
    advantages, _ = gae(
        tensor(SINGLE_REWARDS), tensor(SINGLE_VALUES), flags(SINGLE_NOT_DONE),
        flags(SINGLE_NOT_DONE), None, tensor([4.0]), gamma=0.5, lam=0.0,
    )  # fmt: skip
    # delta_0 = 1 + 0.5 * 1 - 0.5 = 1
    # delta_1 = 2 + 0.5 * 1.5 - 1 = 1.75
    # delta_2 = 3 + 0.5 * 4 - 1.5 = 3.5
    assert_close(advantages, [[1.0], [1.75], [3.5]])


def test_gae_valid_mask_zeroes_padding_and_stops_propagation() -> None:
    # T = 3, B = 1, values 0, no episode end, last_values 0, gamma = lam = 0.5; step 2 is padding
    # holding a huge reward.
    rewards = tensor([[1.0], [1.0], [100.0]])
    zeros = tensor([[0.0], [0.0], [0.0]])
    no = flags(SINGLE_NOT_DONE)
    valid = flags([[True], [True], [False]])
    advantages, returns = gae(
        rewards, zeros, no, no, None, tensor([0.0]), gamma=0.5, lam=0.5, valid=valid
    )
    # A_2 = 0 (padding); A_1 = 1 + 0.5 * values[2] - 0 + 0.25 * 0 = 1; A_0 = 1 + 0.25 * 1 = 1.25
    # (without the mask: A_2 = 100, A_1 = 1 + 25 = 26, ...)
    assert_close(advantages, [[1.25], [1.0], [0.0]])
    assert_close(returns, [[1.25], [1.0], [0.0]])


def test_gae_accepts_float_flags() -> None:
    advantages, _ = gae(
        tensor(REWARDS), tensor(VALUES), tensor(TERMINATED), tensor(TRUNCATED),
        tensor(FINAL_VALUES), tensor(LAST_VALUES), gamma=0.5, lam=0.5,
    )  # fmt: skip
    assert_close(advantages, [[0.75, 1.5], [-1.0, 2.0], [1.0, 1.0]])


def gae_args(**overrides: object) -> dict:
    args = dict(
        rewards=tensor(REWARDS), values=tensor(VALUES), terminated=flags(TERMINATED),
        truncated=flags(TRUNCATED), final_values=tensor(FINAL_VALUES),
        last_values=tensor(LAST_VALUES), gamma=0.5, lam=0.5,
    )  # fmt: skip
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rewards": tensor([1.0, 2.0])}, r"`rewards` must have 2 dimension\(s\) \(T, B\)"),
        ({"values": tensor(VALUES).T}, r"`values` must have shape \(T, B\) = \(3, 2\)"),
        ({"terminated": flags([[True, False]])}, r"`terminated` must have shape"),
        ({"truncated": flags(TRUNCATED)[:, :1]}, r"`truncated` must have shape"),
        ({"final_values": tensor([6.0, 6.0])}, r"`final_values` must have shape"),
        ({"last_values": tensor(VALUES)}, r"`last_values` must have shape \(B,\) = \(2,\)"),
        ({"final_values": None}, r"`final_values` is None"),
        ({"valid": flags([[True, True]])}, r"`valid` must have shape"),
        ({"valid": tensor(VALUES)}, r"`valid` must be a bool tensor"),
        ({"rewards": torch.ones(3, 2, dtype=torch.long)}, r"`rewards` must be a floating-point"),
        ({"gamma": 1.5}, r"`gamma` must be in \[0.0, 1.0\]"),
        ({"lam": -0.1}, r"`lam` must be in"),
        ({"rewards": torch.zeros(0, 2, dtype=torch.float64)}, r"empty"),
    ],
)
def test_gae_rejects_bad_inputs(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gae(**gae_args(**overrides))


# --------------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------------

# Two groups of 3.
#   group A = [1, 2, 3]: mean 2, deviations [-1, 0, 1], sample var (1 + 0 + 1) / 2 = 1, std 1
#     -> [-1, 0, 1]   (population std sqrt(2/3) would give [-1.2247, 0, 1.2247])
#   group B = [0, 0, 4]: mean 4/3, deviations [-4/3, -4/3, 8/3],
#     sample var (16/9 + 16/9 + 64/9) / 2 = 16/3, std 4 / sqrt(3)
#     -> [-1/sqrt(3), -1/sqrt(3), 2/sqrt(3)] = [-0.57735, -0.57735, 1.15470]
GRPO_REWARDS = [1.0, 2.0, 3.0, 0.0, 0.0, 4.0]
SQRT3 = math.sqrt(3.0)
GRPO_EXPECTED = [-1.0, 0.0, 1.0, -1 / SQRT3, -1 / SQRT3, 2 / SQRT3]


def test_grpo_two_consecutive_groups_use_sample_std() -> None:
    advantages = grpo_advantages(tensor(GRPO_REWARDS), group_size=3, eps=0.0)
    assert_close(advantages, GRPO_EXPECTED)


def test_grpo_eps_is_added_to_std() -> None:
    # group A std = 1 -> [-1, 0, 1] / (1 + 0.5)
    advantages = grpo_advantages(tensor([1.0, 2.0, 3.0]), group_size=3, eps=0.5)
    assert_close(advantages, [-1 / 1.5, 0.0, 1 / 1.5])


def test_grpo_explicit_group_ids_in_any_order() -> None:
    # The same two groups, interleaved, with arbitrary labels: A -> 7, B -> 3.
    rewards = tensor([1.0, 0.0, 2.0, 0.0, 3.0, 4.0])
    group_ids = torch.tensor([7, 3, 7, 3, 7, 3])
    advantages = grpo_advantages(rewards, group_ids=group_ids, eps=0.0)
    assert_close(advantages, [-1.0, -1 / SQRT3, 0.0, -1 / SQRT3, 1.0, 2 / SQRT3])


def test_grpo_without_std_normalization_only_centers() -> None:
    advantages = grpo_advantages(tensor(GRPO_REWARDS), group_size=3, normalize_std=False)
    # r - mean: [1-2, 2-2, 3-2, 0-4/3, 0-4/3, 4-4/3]
    assert_close(advantages, [-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3])


def test_grpo_constant_group_gives_exactly_zero() -> None:
    # 0.1 * 3 / 3 is not exactly 0.1 in floating point; the residue must not be divided by eps.
    rewards = tensor([0.1, 0.1, 0.1, 1.0, 2.0, 3.0])
    advantages = grpo_advantages(rewards, group_size=3)
    assert advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert_close(advantages[3:], [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6)])


def test_grpo_singleton_group_gives_zero() -> None:
    advantages = grpo_advantages(tensor([5.0, 1.0, 3.0]), group_ids=torch.tensor([0, 1, 1]))
    # group 0 = [5] alone -> 0; group 1 = [1, 3]: mean 2, sample std sqrt(2) -> [-0.7071, 0.7071]
    assert_close(advantages, [0.0, -1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6)])


def test_grpo_never_nan_for_singletons_or_zero_spread_even_without_eps() -> None:
    # Bessel's std of a group of one is 0/0 and of a constant group 0: with eps = 0 a naive
    # (r - mean) / std is NaN for both. Every sample here is in such a group.
    rewards = tensor([5.0, 2.0, 2.0, 2.0, -1.0, 0.0, 0.0])
    group_ids = torch.tensor([0, 1, 1, 1, 2, 3, 3])  # singletons 0 and 2, constant 1 and 3
    for normalize_std in (True, False):
        advantages = grpo_advantages(
            rewards, group_ids=group_ids, eps=0.0, normalize_std=normalize_std
        )
        assert advantages.tolist() == [0.0] * 7
    assert grpo_advantages(tensor([3.0, 4.0]), group_size=1, eps=0.0).tolist() == [0.0, 0.0]


def test_grpo_integer_rewards_are_cast_to_float() -> None:
    advantages = grpo_advantages(torch.tensor([1, 2, 3]), group_size=3, eps=0.0)
    assert advantages.dtype == torch.get_default_dtype()
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 0.0, 1.0]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rewards": tensor([[1.0, 2.0]]), "group_size": 2}, r"`rewards` must have 1 dimension"),
        ({"rewards": tensor(GRPO_REWARDS), "group_size": 4}, r"multiple of group_size"),
        ({"rewards": tensor(GRPO_REWARDS)}, r"exactly one of `group_size` and `group_ids`"),
        (
            {"rewards": tensor(GRPO_REWARDS), "group_size": 3, "group_ids": torch.zeros(6)},
            r"exactly one",
        ),
        ({"rewards": tensor(GRPO_REWARDS), "group_ids": torch.zeros(5, dtype=torch.int)}, "shape"),
        ({"rewards": tensor(GRPO_REWARDS), "group_ids": torch.zeros(6)}, r"integer tensor"),
        ({"rewards": tensor(GRPO_REWARDS), "group_size": 0}, r"positive int"),
    ],
)
def test_grpo_rejects_bad_inputs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        grpo_advantages(**kwargs)


# --------------------------------------------------------------------------------------------
# RLOO: the baseline is the mean of the *other* samples of the group
# --------------------------------------------------------------------------------------------


def test_rloo_leave_one_out_baseline() -> None:
    # group A = [1, 2, 3]: 1 - (2 + 3) / 2 = -1.5;  2 - (1 + 3) / 2 = 0;  3 - (1 + 2) / 2 = 1.5
    # group B = [0, 0, 4]: 0 - (0 + 4) / 2 = -2 (twice);  4 - (0 + 0) / 2 = 4
    advantages = rloo_advantages(tensor(GRPO_REWARDS), group_size=3)
    assert_close(advantages, [-1.5, 0.0, 1.5, -2.0, -2.0, 4.0])
    # = n / (n - 1) * (r - mean): for group B, 3/2 * (4 - 4/3) = 4
    shuffled = rloo_advantages(tensor([4.0, 1.0, 0.0]), group_ids=torch.tensor([2, 8, 2]))
    assert_close(shuffled, [4.0, 0.0, -4.0])  # [4, 0] and the singleton [1]


def test_rloo_singleton_and_constant_groups_give_zero() -> None:
    advantages = rloo_advantages(tensor([7.0, 2.0, 2.0]), group_ids=torch.tensor([0, 1, 1]))
    assert advantages.tolist() == [0.0, 0.0, 0.0]


def test_rloo_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"rloo_advantages: pass exactly one"):
        rloo_advantages(tensor(GRPO_REWARDS))
    with pytest.raises(ValueError, match=r"rloo_advantages: N = 6 rewards do not split"):
        rloo_advantages(tensor(GRPO_REWARDS), group_size=4)


# --------------------------------------------------------------------------------------------
# Normalization and the registry
# --------------------------------------------------------------------------------------------


def test_normalize_advantages_sample_std() -> None:
    # [1, 2, 3, 4]: mean 2.5, sample var (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    # -> [-1.5, -0.5, 0.5, 1.5] / sqrt(5/3)
    out = normalize_advantages(tensor([[1.0, 2.0], [3.0, 4.0]]), eps=0.0)
    scale = math.sqrt(5 / 3)
    assert_close(out, [[-1.5 / scale, -0.5 / scale], [0.5 / scale, 1.5 / scale]])


def test_normalize_advantages_with_mask() -> None:
    # valid [1, 3]: mean 2, sample std sqrt(2); the masked 100 is ignored and comes back as 0.
    out = normalize_advantages(tensor([1.0, 100.0, 3.0]), mask=flags([True, False, True]), eps=0.0)
    assert_close(out, [-1 / math.sqrt(2), 0.0, 1 / math.sqrt(2)])


def test_normalize_advantages_degenerate_inputs_give_zeros() -> None:
    assert normalize_advantages(tensor([3.0])).tolist() == [0.0]
    out = normalize_advantages(tensor([3.0, 4.0]), mask=flags([False, False]))
    assert out.tolist() == [0.0, 0.0]


def test_normalize_advantages_rejects_bad_mask() -> None:
    with pytest.raises(ValueError, match=r"`mask` must have shape"):
        normalize_advantages(tensor([1.0, 2.0]), mask=flags([True]))


def test_estimators_are_registered_by_name() -> None:
    assert ADVANTAGE_ESTIMATORS.names() == ["gae", "grpo", "rloo"]
    assert ADVANTAGE_ESTIMATORS.get("rloo") is rloo_advantages
    assert ADVANTAGE_ESTIMATORS.get("gae") is gae
    assert ADVANTAGE_ESTIMATORS.get("grpo") is grpo_advantages
    estimator = ADVANTAGE_ESTIMATORS.get("grpo")
    assert_close(estimator(tensor(GRPO_REWARDS), group_size=3, eps=0.0), GRPO_EXPECTED)
    with pytest.raises(UserError, match="grpo"):
        ADVANTAGE_ESTIMATORS.get("grp")
