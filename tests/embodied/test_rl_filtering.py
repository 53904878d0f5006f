"""Dynamic sampling: zero-spread groups are found exactly, in any order, and agree with GRPO."""

from __future__ import annotations

import pytest
import torch

from embodied.rl import ZeroSignalMonitor, frac_reward_zero_std, grpo_advantages, zero_std_group_mask

# Four groups, interleaved, with arbitrary labels:
#   group 0 = [1, 1, 1]   all equal        -> dropped
#   group 5 = [0, 1, 0]   spread           -> kept
#   group 7 = [2]         a group of one   -> dropped
#   group 9 = [3, 3]      all equal        -> dropped
REWARDS = [1.0, 0.0, 1.0, 2.0, 1.0, 3.0, 0.0, 1.0, 3.0]
GROUP_IDS = [0, 5, 0, 7, 5, 9, 5, 0, 9]
KEPT = [False, True, False, False, True, False, True, False, False]


def test_drops_exactly_the_zero_spread_groups() -> None:
    mask = zero_std_group_mask(torch.tensor(REWARDS), torch.tensor(GROUP_IDS))
    assert mask.dtype == torch.bool
    assert mask.tolist() == KEPT
    # 3 of the 4 groups have no spread
    assert float(frac_reward_zero_std(torch.tensor(REWARDS), torch.tensor(GROUP_IDS))) == 0.75


def test_consecutive_groups_and_integer_rewards() -> None:
    # group_size 2: [0, 0] no spread, [1, 1] no spread, [0, 1] spread
    rewards = torch.tensor([0, 0, 1, 1, 0, 1])  # 0/1 accuracy as integers
    assert zero_std_group_mask(rewards, group_size=2).tolist() == [False] * 4 + [True] * 2
    assert float(frac_reward_zero_std(rewards, group_size=2)) == pytest.approx(2 / 3)
    all_equal = torch.ones(4, dtype=torch.bool)
    assert float(frac_reward_zero_std(all_equal, group_size=2)) == 1.0


def test_kept_samples_are_the_ones_with_a_grpo_signal() -> None:
    rewards, group_ids = torch.tensor(REWARDS), torch.tensor(GROUP_IDS)
    advantages = grpo_advantages(rewards, group_ids=group_ids)
    # no sample of this batch equals its group's mean, so "kept" == "non-zero advantage"
    assert (advantages != 0).tolist() == zero_std_group_mask(rewards, group_ids).tolist()


def test_tiny_spread_is_spread() -> None:
    # Exact comparison: a group differing in the last bit still has a (tiny) signal.
    rewards = torch.tensor([0.1, 0.1 + 1e-12], dtype=torch.float64)
    assert zero_std_group_mask(rewards, group_size=2).tolist() == [True, True]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"pass exactly one of `group_size` and `group_ids`"),
        ({"group_ids": torch.zeros(9), "group_size": 3}, r"pass exactly one"),
        ({"group_ids": torch.zeros(9)}, r"`group_ids` must be an integer tensor"),
        ({"group_ids": torch.zeros(8, dtype=torch.long)}, r"`group_ids` must have shape \(N,\)"),
        ({"group_size": 2}, r"N = 9 rewards do not split into groups of group_size = 2"),
    ],
)
def test_rejects_bad_inputs(kwargs: dict, message: str) -> None:
    for fn in (zero_std_group_mask, frac_reward_zero_std):
        with pytest.raises(ValueError, match=fn.__name__ + ": " + message):
            fn(torch.tensor(REWARDS), **kwargs)
    with pytest.raises(ValueError, match=r"`rewards` must have 1 dimension"):
        zero_std_group_mask(torch.zeros(2, 2), group_size=2)


def test_zero_signal_monitor_warns_first_then_every_n_batches() -> None:
    monitor = ZeroSignalMonitor(every=3)
    said = [monitor.observe(frac, 4) for frac in [0.5, 1.0, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0, 1.0]]
    # batches 2 (the first), 5 would be 3 after it but has signal, so 6; then 9
    assert [i + 1 for i, s in enumerate(said) if s is not None] == [2, 6, 9]
    assert "all 4 group(s) of batch 2" in said[1] and "group_size" in said[1] and "temperature" in said[1]
    assert "(3 such batch(es) since the last warning)" in said[5]  # batches 3, 4 and 6
    assert monitor.zero_signal_batches == 7 and monitor.batches == 9
    assert all(ZeroSignalMonitor().observe(frac, 4) is None for frac in (0.0, 0.5, 0.99))
    with pytest.raises(ValueError, match="every must be >= 1"):
        ZeroSignalMonitor(every=0)
