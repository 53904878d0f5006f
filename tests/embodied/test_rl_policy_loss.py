"""The per-token clipped policy loss (clip-higher, dual clip, IS weights) on hand-computed numbers.

Ratios are set exactly through log-probs: ``old_logprobs = 0`` and ``new_logprobs = log(r)``, so
``d loss / d new_logprob = d loss / d log r``, which is ``-A * r`` on the unclipped branch and 0
on a clipped or capped one.
"""

from __future__ import annotations

import math

import pytest
import torch

from embodied.rl import agg_loss, policy_loss_per_token

NAN = float("nan")


def tensor(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def logprobs_for(ratios: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(new_logprobs requiring grad, zero old_logprobs) with exp(new - old) = ratios."""
    new = torch.tensor(ratios, dtype=torch.float64).log().requires_grad_()
    return new, torch.zeros_like(new.detach())


def assert_close(actual: torch.Tensor, expected: list | float) -> None:
    torch.testing.assert_close(actual.detach(), tensor(expected), rtol=0, atol=1e-9)


# --------------------------------------------------------------------------------------------
# A (B = 2, K = 4) batch with per-sequence advantages, eps_low 0.2, eps_high 0.28 (range
# [0.8, 1.28]), dual clip c = 3. Row 1's last token is padding (NaN old log-prob).
#
#   row 0, A = +1:  r = 1.25  inside        l = -1.25   grad -1.25
#                   r = 1.5   above 1.28    l = -1.28   grad 0      (clipped high)
#                   r = 0.5   below 0.8     l = -0.5    grad -0.5   (pessimistic: unclipped)
#                   r = 1.0                 l = -1.0    grad -1.0
#   row 1, A = -1:  r = 10    max(10, 1.28) = 10 > c = 3 -> l = 3, grad 0 (dual cap)
#                   r = 2     max(2, 1.28) = 2 < 3       -> l = 2, grad 2
#                   r = 0.5   max(0.5, 0.8) = 0.8        -> l = 0.8, grad 0 (clipped low)
#                   padding                              -> l = 0, grad 0
# --------------------------------------------------------------------------------------------

RATIOS = [[1.25, 1.5, 0.5, 1.0], [10.0, 2.0, 0.5, 1.0]]
ADVANTAGES = [1.0, -1.0]
MASK = [[True, True, True, True], [True, True, True, False]]
EXPECTED_LOSS_MAT = [[-1.25, -1.28, -0.5, -1.0], [3.0, 2.0, 0.8, 0.0]]
EXPECTED_GRAD = [[-1.25, 0.0, -0.5, -1.0], [0.0, 2.0, 0.0, 0.0]]
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}


def run_batch(**overrides: object) -> tuple[torch.Tensor, torch.Tensor, dict]:
    new, old = logprobs_for(RATIOS)
    old[1, 3] = NAN
    kwargs: dict = {"mask": torch.tensor(MASK), **CLIP}
    kwargs.update(overrides)
    loss_mat, stats = policy_loss_per_token(new, old, tensor(ADVANTAGES), **kwargs)
    return new, loss_mat, stats


def test_loss_matrix_and_gradient_hand_computed() -> None:
    new, loss_mat, _ = run_batch()
    assert_close(loss_mat, EXPECTED_LOSS_MAT)
    loss_mat.sum().backward()
    assert_close(new.grad, EXPECTED_GRAD)


def test_token_mean_of_the_matrix() -> None:
    new, loss_mat, _ = run_batch()
    loss = agg_loss(loss_mat, torch.tensor(MASK), "token-mean")
    # (-1.25 - 1.28 - 0.5 - 1.0 + 3 + 2 + 0.8) / 7 valid tokens = 1.77 / 7
    assert_close(loss, 1.77 / 7)
    loss.backward()
    assert_close(new.grad, [[g / 7 for g in row] for row in EXPECTED_GRAD])


def test_stats_over_valid_tokens() -> None:
    _, _, stats = run_batch()
    assert all(not v.requires_grad for v in stats.values())
    assert_close(stats["clipfrac_high"], 1 / 7)  # r = 1.5 with A > 0
    assert_close(stats["clipfrac_low"], 1 / 7)  # r = 0.5 with A < 0
    assert_close(stats["pg_clipfrac"], 2 / 7)  # the two above: the clipped branch is active
    assert_close(stats["pg_clipfrac_lower"], 1 / 7)  # r = 10 with A < 0: the dual cap
    # valid ratios sum to 1.25 + 1.5 + 0.5 + 1 + 10 + 2 + 0.5 = 16.75, product 9.375
    assert_close(stats["ratio_mean"], 16.75 / 7)
    assert_close(stats["ppo_kl"], -math.log(9.375) / 7)  # mean of -log r
    assert_close(stats["approx_kl"], (16.75 - 7 - math.log(9.375)) / 7)  # mean of r - 1 - log r


def test_clip_higher_leaves_ratios_between_the_two_bounds_unclipped() -> None:
    # A = +1, r = 1.25: above 1 + 0.2 but below 1 + 0.28.
    new, old = logprobs_for([1.25])
    loss_mat, stats = policy_loss_per_token(
        new, old, tensor([1.0]), clip_ratio_low=0.2, clip_ratio_high=0.28
    )
    loss_mat.sum().backward()
    assert_close(loss_mat, [-1.25])  # -A * r, not clipped
    assert_close(new.grad, [-1.25])  # and it still pushes r up
    assert_close(stats["clipfrac_high"], 0.0)
    # Symmetric clipping (clip_ratio_high defaults to clip_ratio_low) clips it: -1.2, gradient 0.
    new, old = logprobs_for([1.25])
    loss_mat, stats = policy_loss_per_token(new, old, tensor([1.0]), clip_ratio_low=0.2)
    loss_mat.sum().backward()
    assert_close(loss_mat, [-1.2])
    assert_close(new.grad, [0.0])
    assert_close(stats["clipfrac_high"], 1.0)


def test_dual_clip_caps_negative_advantages_at_minus_c_times_a() -> None:
    # A = -2, c = 3: r = 5 -> 2 * 5 = 10 capped at -c * A = 6 (gradient 0); r = 2 -> 4 (< 6).
    new, old = logprobs_for([5.0, 2.0])
    loss_mat, stats = policy_loss_per_token(new, old, tensor([-2.0, -2.0]), clip_ratio_c=3.0)
    loss_mat.sum().backward()
    assert_close(loss_mat, [6.0, 4.0])
    assert_close(new.grad, [0.0, 4.0])  # -A * r = 2 * 2 on the uncapped one
    assert_close(stats["pg_clipfrac_lower"], 0.5)
    # Off: the loss grows with r.
    loss_mat, stats = policy_loss_per_token(new, old, tensor([-2.0, -2.0]))
    assert_close(loss_mat, [10.0, 4.0])
    assert_close(stats["pg_clipfrac_lower"], 0.0)
    # Positive advantages are never capped: A = +2, r = 5 -> -2 * min(5, 1.2) = -2.4.
    loss_mat, _ = policy_loss_per_token(new, old, tensor([2.0, 2.0]), clip_ratio_c=3.0)
    assert_close(loss_mat, [-2.4, -2.4])


def test_per_sequence_advantages_equal_their_broadcast() -> None:
    _, per_sequence, _ = run_batch()
    new, old = logprobs_for(RATIOS)
    broadcast = tensor(ADVANTAGES).unsqueeze(-1).expand(2, 4)
    per_token, _ = policy_loss_per_token(new, old, broadcast, mask=torch.tensor(MASK), **CLIP)
    assert_close(per_sequence, per_token.detach().tolist())


def test_importance_weights_are_multiplied_in_and_detached() -> None:
    weights = tensor([[2.0, 2.0, 2.0, 2.0], [0.5, 0.5, 0.5, NAN]]).requires_grad_()
    new, loss_mat, stats = run_batch(is_weights=weights)
    expected = [[2 * x for x in EXPECTED_LOSS_MAT[0]], [0.5 * x for x in EXPECTED_LOSS_MAT[1]]]
    assert_close(loss_mat, expected)  # the NaN weight sits on padding and is never used
    loss_mat.sum().backward()
    assert_close(new.grad, [[2 * g for g in EXPECTED_GRAD[0]], [0.5 * g for g in EXPECTED_GRAD[1]]])
    assert weights.grad is None
    assert_close(stats["ratio_mean"], 16.75 / 7)  # statistics are not weighted
    # Per-sequence weights (B,) broadcast like advantages.
    _, per_sequence, _ = run_batch(is_weights=tensor([2.0, 0.5]))
    assert_close(per_sequence, expected)


def test_per_action_policy_without_mask() -> None:
    # An MLP policy: one log-prob per sample. Same numbers as row 0 above.
    new, old = logprobs_for([1.25, 1.5, 0.5, 1.0])
    loss_mat, stats = policy_loss_per_token(new, old, tensor([1.0] * 4), **CLIP)
    assert_close(loss_mat, EXPECTED_LOSS_MAT[0])
    assert_close(stats["clipfrac_high"], 0.25)


def test_extreme_log_ratio_stays_finite() -> None:
    new = tensor([500.0, -500.0]).requires_grad_()
    loss_mat, stats = policy_loss_per_token(new, tensor([0.0, 0.0]), tensor([-1.0, 1.0]))
    loss_mat.sum().backward()
    assert torch.isfinite(loss_mat).all() and torch.isfinite(new.grad).all()
    assert all(math.isfinite(float(v)) for v in stats.values())
    assert_close(stats["ppo_kl"], 0.0)  # log r clamped to +20 and -20: mean of -log r is 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"new_logprobs": torch.zeros(2, 4, 1)}, r"`new_logprobs` must have shape \(B, K\)"),
        ({"old_logprobs": torch.zeros(2, 3)}, r"`old_logprobs` must have shape \(2, 4\) to match"),
        ({"advantages": tensor([1.0, 1.0, 1.0])}, r"`advantages` must have shape \(B, K\) or"),
        ({"is_weights": torch.ones(4)}, r"`is_weights` must have shape \(B, K\) or \(B,\)"),
        ({"mask": torch.ones(2, 4)}, r"`mask` must be a bool tensor"),
        ({"clip_ratio_low": 0.0}, r"`clip_ratio_low` must be in \(0, 1\)"),
        ({"clip_ratio_high": -0.1}, r"`clip_ratio_high` must be > 0"),
        ({"clip_ratio_c": 1.0}, r"`clip_ratio_c` must be > 1"),
    ],
)
def test_rejects_bad_inputs(kwargs: dict, message: str) -> None:
    args: dict = {
        "new_logprobs": torch.zeros(2, 4, dtype=torch.float64),
        "old_logprobs": torch.zeros(2, 4, dtype=torch.float64),
        "advantages": tensor([1.0, -1.0]),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=r"policy_loss_per_token: " + message):
        policy_loss_per_token(**args)
