"""PPO / GRPO loss terms pinned to hand-computed numbers (the arithmetic is in the comments).

Ratios are set exactly through log-probs: ``old_logprobs = 0`` and ``new_logprobs = log(r)``.
"""

from __future__ import annotations

import math

import pytest
import torch

from embodied.rl import agg_loss, policy_loss_per_token, should_stop_early, value_errors


def tensor(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def logprobs_for(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(new_logprobs requiring grad, old_logprobs) with exp(new - old) = ratios."""
    new = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=True)
    return new, torch.zeros(len(ratios), dtype=torch.float64)


def surrogate(new, old, advantages, mask=None, clip_ratio=0.2, dual_clip=None, clip_ratio_high=None):
    """The clipped surrogate as an algorithm computes it: per-element losses, token-mean over the mask."""
    per, stats = policy_loss_per_token(new, old, advantages, mask, clip_ratio_low=clip_ratio,
                                       clip_ratio_high=clip_ratio_high, clip_ratio_c=dual_clip)
    return agg_loss(per, mask, "token-mean"), stats


def close(actual: torch.Tensor | float, expected: float) -> bool:
    if isinstance(actual, torch.Tensor):
        actual = actual.detach()
    return float(actual) == pytest.approx(expected, abs=1e-9)


# --------------------------------------------------------------------------------------------
# Clipped surrogate, clip_ratio = 0.2 -> ratios are clipped to [0.8, 1.2].
# Per sample l = max(-A * r, -A * clip(r)); dl/dlog r = -A * r when the unclipped branch is
# chosen, 0 when the clipped one is.
# --------------------------------------------------------------------------------------------

SURROGATE_CASES = [
    # ratio, advantage, loss, d loss / d new_logprob
    pytest.param(1.1, 2.0, -2.2, -2.2, id="A>0 inside: -2 * 1.1"),
    pytest.param(1.5, 2.0, -2.4, 0.0, id="A>0 above: -2 * min(1.5, 1.2), no gradient"),
    pytest.param(0.5, 2.0, -1.0, -1.0, id="A>0 below: -2 * 0.5 (pessimistic, unclipped)"),
    pytest.param(1.1, -2.0, 2.2, 2.2, id="A<0 inside: 2 * 1.1"),
    pytest.param(1.5, -2.0, 3.0, 3.0, id="A<0 above: 2 * max(1.5, 0.8) (unclipped)"),
    pytest.param(0.5, -2.0, 1.6, 0.0, id="A<0 below: 2 * max(0.5, 0.8), no gradient"),
]


@pytest.mark.parametrize(("ratio", "advantage", "expected_loss", "expected_grad"), SURROGATE_CASES)
def test_policy_loss_single_sample(
    ratio: float, advantage: float, expected_loss: float, expected_grad: float
) -> None:
    new, old = logprobs_for([ratio])
    loss, _ = surrogate(new, old, tensor([advantage]), clip_ratio=0.2)
    assert close(loss, expected_loss)
    loss.backward()
    assert close(new.grad[0], expected_grad)


def test_policy_loss_batch_mean_and_stats() -> None:
    ratios = [1.1, 1.5, 0.5, 1.1, 1.5, 0.5]
    new, old = logprobs_for(ratios)
    advantages = tensor([2.0, 2.0, 2.0, -2.0, -2.0, -2.0])
    loss, stats = surrogate(new, old, advantages, clip_ratio=0.2)
    # (-2.2 - 2.4 - 1.0 + 2.2 + 3.0 + 1.6) / 6 = 1.2 / 6 = 0.2
    assert close(loss, 0.2)
    # the clipped branch is the one in force for (1.5, A>0) and (0.5, A<0): 2 / 6
    assert close(stats["pg_clipfrac"], 2 / 6)
    assert close(stats["clipfrac_high"], 1 / 6) and close(stats["clipfrac_low"], 1 / 6)
    # (1.1 + 1.5 + 0.5) * 2 / 6 = 6.2 / 6
    assert close(stats["ratio_mean"], 6.2 / 6)
    # k3 = (r - 1) - ln r:  r=1.1: 0.1 - 0.0953102 = 0.0046898;  r=1.5: 0.5 - 0.4054651 = 0.0945349;
    #                       r=0.5: -0.5 + 0.6931472 = 0.1931472;  mean = 0.2923719 * 2 / 6
    assert float(stats["approx_kl"]) == pytest.approx(0.2923719 / 3, abs=1e-7)
    assert close(stats["pg_clipfrac_lower"], 0.0)  # dual clip off
    assert all(not value.requires_grad for value in stats.values())


def test_policy_loss_time_major_shape() -> None:
    # The same six samples laid out as (T=3, B=2) give the same mean.
    new, old = logprobs_for([1.1, 1.5, 0.5, 1.1, 1.5, 0.5])
    advantages = tensor([2.0, 2.0, 2.0, -2.0, -2.0, -2.0])
    loss, _ = surrogate(new.view(3, 2), old.view(3, 2), advantages.view(3, 2))
    assert close(loss, 0.2)


def test_dual_clip_bounds_large_ratio_with_negative_advantage() -> None:
    # dual_clip c = 3, clip 0.2.  For A < 0:  l = -A * min(max(r, 0.8), 3)
    #   r = 10,  A = -1: standard 1 * 10 = 10, dual min(10, 3) = 3   (bound active, no gradient)
    #   r = 2,   A = -1: 2 < 3 -> 2                                   (inactive, gradient 2)
    #   r = 10,  A = +1: positive advantage, dual clip n/a -> -min(10, 1.2) = -1.2
    #   r = 0.5, A = -1: max(0.5, 0.8) = 0.8
    ratios = [10.0, 2.0, 10.0, 0.5]
    advantages = tensor([-1.0, -1.0, 1.0, -1.0])
    new, old = logprobs_for(ratios)
    loss, stats = surrogate(new, old, advantages, clip_ratio=0.2, dual_clip=3.0)
    # (3 + 2 - 1.2 + 0.8) / 4 = 4.6 / 4
    assert close(loss, 1.15)
    assert close(stats["pg_clipfrac_lower"], 1 / 4)  # the -c * A cap is in force for the first sample
    assert close(stats["pg_clipfrac"], 2 / 4)  # (10, A>0) above 1.2 and (0.5, A<0) below 0.8
    loss.backward()
    # d/dlog r of l / 4:  [0 (bounded), -A * r / 4 = 2 / 4, 0 (clipped), 0 (clipped)]
    torch.testing.assert_close(new.grad, tensor([0.0, 0.5, 0.0, 0.0]), rtol=0, atol=1e-9)

    # Without dual clip the first sample costs 10: (10 + 2 - 1.2 + 0.8) / 4 = 2.9
    plain, _ = surrogate(new, old, advantages, clip_ratio=0.2)
    assert close(plain, 2.9)


def test_asymmetric_clip_ratio_high() -> None:
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]
    #   r = 1.5,  A = +1: -min(1.5, 1.28) = -1.28
    #   r = 1.25, A = +1: inside -> -1.25 (the symmetric range would clip it to -1.2)
    #   r = 0.5,  A = -1: max(0.5, 0.8) = 0.8   (low side unchanged)
    new, old = logprobs_for([1.5, 1.25, 0.5])
    loss, stats = surrogate(
        new, old, tensor([1.0, 1.0, -1.0]), clip_ratio=0.2, clip_ratio_high=0.28
    )
    assert close(loss, (-1.28 - 1.25 + 0.8) / 3)
    assert close(stats["pg_clipfrac"], 2 / 3)  # 1.5 above 1.28 (A>0), 0.5 below 0.8 (A<0); 1.25 is inside


def test_policy_loss_mask_ignores_padding_even_if_nan() -> None:
    new, old = logprobs_for([1.1, 1.5])
    old = torch.tensor([0.0, float("nan")], dtype=torch.float64)
    advantages = tensor([2.0, float("nan")])
    mask = torch.tensor([True, False])
    loss, stats = surrogate(new, old, advantages, mask=mask)
    assert close(loss, -2.2)  # only the first sample: -2 * 1.1
    assert close(stats["ratio_mean"], 1.1)
    assert close(stats["pg_clipfrac"], 0.0)
    loss.backward()
    torch.testing.assert_close(new.grad, tensor([-2.2, 0.0]), rtol=0, atol=1e-9)


def test_policy_loss_all_masked_is_zero_not_nan() -> None:
    new, old = logprobs_for([1.1, 1.5])
    loss, _ = surrogate(new, old, tensor([1.0, 1.0]), mask=torch.tensor([False, False]))
    assert float(loss.detach()) == 0.0


def test_policy_loss_extreme_log_ratio_stays_finite() -> None:
    new = torch.tensor([500.0], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([0.0], dtype=torch.float64)
    # log-ratio clamped to 20; dual clip caps the loss at -3 * A = 3
    loss, stats = surrogate(new, old, tensor([-1.0]), dual_clip=3.0)
    loss.backward()
    assert close(loss, 3.0)
    assert torch.isfinite(new.grad).all() and math.isfinite(float(stats["approx_kl"]))


# --------------------------------------------------------------------------------------------
# Value errors (PPO2's clipped value loss, before the mean over a minibatch's samples)
# --------------------------------------------------------------------------------------------

# sample 0: V = 1.8, V_old = 1.0, R = 2.0 -> unclipped (0.2)^2 = 0.04; V_clip = 1.2, (0.8)^2 = 0.64
# sample 1: V = 1.1, V_old = 1.0, R = 1.5 -> inside the clip range: (0.4)^2 = 0.16 both ways
NEW_VALUES = [1.8, 1.1]
OLD_VALUES = [1.0, 1.0]
RETURNS = [2.0, 1.5]


def test_value_errors_unclipped() -> None:
    # 0.5 * (0.04, 0.16)
    errors = value_errors(tensor(NEW_VALUES), tensor(OLD_VALUES), tensor(RETURNS))
    torch.testing.assert_close(errors, tensor([0.02, 0.08]), rtol=0, atol=1e-12)


def test_value_errors_clipped_take_the_larger_error() -> None:
    new_values = tensor(NEW_VALUES).requires_grad_()
    errors = value_errors(new_values, tensor(OLD_VALUES), tensor(RETURNS), clip=0.2)
    # 0.5 * (max(0.04, 0.64), 0.16)
    torch.testing.assert_close(errors.detach(), tensor([0.32, 0.08]), rtol=0, atol=1e-12)
    errors.sum().backward()
    # sample 0: the clipped branch is constant in V -> 0; sample 1: 0.5 * 2 * (1.1 - 1.5)
    torch.testing.assert_close(new_values.grad, tensor([0.0, -0.4]), rtol=0, atol=1e-9)


def test_value_errors_clip_keeps_unclipped_when_it_is_larger() -> None:
    # V = 2.0, V_old = 1.0, R = 1.5: unclipped 0.25, V_clip = 1.2 -> 0.09; max = 0.25 -> 0.125
    assert close(value_errors(tensor([2.0]), tensor([1.0]), tensor([1.5]), clip=0.2)[0], 0.125)


def test_value_errors_clip_requires_old_values_and_equal_shapes() -> None:
    with pytest.raises(ValueError, match="`old_values` is required"):
        value_errors(tensor(NEW_VALUES), None, tensor(RETURNS), clip=0.2)
    with pytest.raises(ValueError, match=r"`returns` must have shape"):
        value_errors(tensor([1.0, 2.0]), None, tensor([[1.0, 2.0]]))


def test_should_stop_early() -> None:
    assert should_stop_early(torch.tensor(1e9), None) is False
    assert should_stop_early(torch.tensor(0.02), 0.01) is True
    assert should_stop_early(0.005, 0.01) is False
    assert should_stop_early(0.01, 0.01) is False  # strictly greater
    with pytest.raises(ValueError, match="target_kl"):
        should_stop_early(0.01, 0.0)


# --------------------------------------------------------------------------------------------
# PPO's whole loss on a minibatch, as the algorithm object forms it
# --------------------------------------------------------------------------------------------


class FixedPolicy:
    """A stand-in whose ``evaluate`` returns given logprobs, entropy and values."""

    def __init__(self, logprobs, entropy, values) -> None:
        self.out = (logprobs, entropy, values)

    def evaluate(self, obs, actions):
        from policies.base import Evaluation

        return Evaluation(*self.out)


def test_ppo_loss_combines_policy_value_and_entropy() -> None:
    from embodied.algorithms import AlgoConfig, build_algorithm
    from embodied.rl import Samples, loss_agg_counts

    new, old = logprobs_for([1.1, 1.5])
    mb = Samples(obs={}, actions=torch.zeros(2), logprobs=old,
                 fields={"advantages": tensor([2.0, 2.0]), "old_values": tensor(OLD_VALUES), "returns": tensor(RETURNS)})
    ppo = build_algorithm(AlgoConfig(clip_ratio=0.2, value_clip=0.2, vf_coef=0.5, entropy_coeff=0.01))
    loss, stats = ppo.loss(FixedPolicy(new, tensor([1.0, 2.0]), tensor(NEW_VALUES)), mb, loss_agg_counts(torch.ones(2, dtype=torch.bool)))
    # policy  = (-2 * 1.1 - 2 * 1.2) / 2 = -2.3
    # value   = 0.5 * (0.64 + 0.16) / 2 = 0.2 (the clipped case above), times vf_coef 0.5 = 0.1
    # entropy = (1 + 2) / 2 = 1.5, times entropy_coeff 0.01 = 0.015, subtracted
    assert close(loss, -2.3 + 0.1 - 0.015)
    assert close(stats["losses/policy"], -2.3)
    assert close(stats["losses/value"], 0.2)
    assert close(stats["losses/entropy"], 1.5)
    assert close(stats["losses/pg_clipfrac"], 0.5)  # 1.5 is above 1.2 with A > 0
    assert close(stats["losses/ratio_mean"], 1.3)
    # (0.0046898 + 0.0945349) / 2
    assert float(stats["losses/approx_kl"]) == pytest.approx(0.04961235, abs=1e-7)


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"advantages": tensor([1.0, 1.0, 1.0])}, r"`advantages`"),
        ({"old_logprobs": torch.zeros(3, dtype=torch.float64)}, r"`old_logprobs` must have shape"),
        ({"mask": torch.ones(2)}, r"`mask` must be a bool tensor"),
        ({"mask": torch.ones(3, dtype=torch.bool)}, r"`mask` must have shape"),
        ({"clip_ratio_c": 1.0}, r"`clip_ratio_c` must be > 1"),
        ({"clip_ratio_low": 0.0}, r"`clip_ratio_low` must be in \(0, 1\)"),
        ({"clip_ratio_high": -0.1}, r"`clip_ratio_high` must be > 0"),
        ({"advantages": [1.0, 1.0]}, r"`advantages` must be a torch.Tensor"),
    ],
)
def test_policy_loss_rejects_bad_inputs(kwargs: dict, message: str) -> None:
    args = {
        "new_logprobs": torch.zeros(2, dtype=torch.float64),
        "old_logprobs": torch.zeros(2, dtype=torch.float64),
        "advantages": tensor([1.0, -1.0]),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        policy_loss_per_token(**args)
