"""Rollout/trainer importance-sampling weights (veRL rollout_is, TRL vllm_importance_sampling_mode).

Weights are set exactly through log-probs: ``rollout_logprobs = 0`` and ``old_logprobs = log(w)``.
"""

from __future__ import annotations

import math

import pytest
import torch

from embodied.errors import UserError
from embodied.rl import TRL_IS_MODES, ISModeAlias, rollout_is_weights

NAN = float("nan")
# B = 2, K = 3; row 1's last token is padding (NaN log-probs there).
RAW = [[0.5, 1.5, 3.0], [4.0, 1.0, 1.0]]
MASK = [[True, True, True], [True, True, False]]


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.tensor(RAW, dtype=torch.float64).log()
    old[1, 2] = NAN
    rollout = torch.zeros(2, 3, dtype=torch.float64)
    rollout[1, 2] = NAN
    return old, rollout, torch.tensor(MASK)


def assert_close(actual: torch.Tensor, expected: list | float) -> None:
    expected_t = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual, expected_t, rtol=0, atol=1e-12)


# Mean |old - rollout| over the 5 valid tokens: (log 2 + log 1.5 + log 3 + log 4 + 0) / 5
ABS_DIFF = (math.log(2.0) + math.log(1.5) + math.log(3.0) + math.log(4.0)) / 5


def test_token_truncate() -> None:
    weights, stats = rollout_is_weights(*inputs(), level="token", threshold=2.0)
    # 3 -> 2 and 4 -> 2; padding gets weight 0
    assert_close(weights, [[0.5, 1.5, 2.0], [2.0, 1.0, 0.0]])
    assert_close(stats["ratio_mean"], (0.5 + 1.5 + 3.0 + 4.0 + 1.0) / 5)
    assert_close(stats["weight_mean"], (0.5 + 1.5 + 2.0 + 2.0 + 1.0) / 5)
    assert_close(stats["frac_truncated"], 2 / 5)
    assert_close(stats["logprob_abs_diff"], ABS_DIFF)


def test_token_mask() -> None:
    weights, stats = rollout_is_weights(*inputs(), level="token", threshold=2.0, mode="mask")
    # above the threshold -> 0, the others keep their ratio (not 1)
    assert_close(weights, [[0.5, 1.5, 0.0], [0.0, 1.0, 0.0]])
    assert_close(stats["weight_mean"], 3.0 / 5)
    assert_close(stats["frac_masked"], 2 / 5)
    assert "frac_truncated" not in stats


def test_sequence_truncate() -> None:
    # Sequence weights: row 0: 0.5 * 1.5 * 3 = 2.25; row 1: 4 * 1 = 4 (padding not in the product)
    weights, stats = rollout_is_weights(*inputs(), level="sequence", threshold=3.0)
    assert_close(weights, [[2.25, 2.25, 2.25], [3.0, 3.0, 0.0]])
    # statistics over the two sequences
    assert_close(stats["ratio_mean"], (2.25 + 4.0) / 2)
    assert_close(stats["weight_mean"], (2.25 + 3.0) / 2)
    assert_close(stats["frac_truncated"], 1 / 2)
    assert_close(stats["logprob_abs_diff"], ABS_DIFF)  # always per token


def test_sequence_mask() -> None:
    weights, stats = rollout_is_weights(*inputs(), level="sequence", threshold=3.0, mode="mask")
    assert_close(weights, [[2.25, 2.25, 2.25], [0.0, 0.0, 0.0]])  # the whole sequence dropped
    assert_close(stats["frac_masked"], 1 / 2)


def test_lower_threshold() -> None:
    weights, stats = rollout_is_weights(*inputs(), threshold=2.0, threshold_low=0.8)
    assert_close(weights, [[0.8, 1.5, 2.0], [2.0, 1.0, 0.0]])  # 0.5 -> 0.8
    assert_close(stats["frac_truncated"], 3 / 5)
    weights, _ = rollout_is_weights(*inputs(), threshold=2.0, threshold_low=0.8, mode="mask")
    assert_close(weights, [[0.0, 1.5, 0.0], [0.0, 1.0, 0.0]])


def test_weights_are_detached_and_a_long_sequence_stays_finite() -> None:
    old = torch.ones(1, 200, dtype=torch.float64, requires_grad=True)  # log-ratio 1 per token
    weights, stats = rollout_is_weights(old, torch.zeros(1, 200, dtype=torch.float64),
                                        level="sequence", threshold=2.0)  # fmt: skip
    assert not weights.requires_grad
    assert_close(weights, [[2.0] * 200])  # exp(200) would overflow float32; clamped, truncated
    assert torch.isfinite(stats["ratio_mean"])


def test_per_action_inputs() -> None:
    old = torch.tensor([math.log(3.0), 0.0], dtype=torch.float64)
    for level in ("token", "sequence"):  # the same for one token per sample
        weights, _ = rollout_is_weights(old, torch.zeros(2, dtype=torch.float64), level=level)
        assert_close(weights, [2.0, 1.0])


def test_trl_mode_names() -> None:
    assert TRL_IS_MODES == {
        "token_truncate": ISModeAlias("token", "truncate"),
        "token_mask": ISModeAlias("token", "mask"),
        "sequence_truncate": ISModeAlias("sequence", "truncate"),
        "sequence_mask": ISModeAlias("sequence", "mask"),
    }
    level, mode = TRL_IS_MODES["sequence_mask"]
    weights, _ = rollout_is_weights(*inputs(), threshold=3.0, level=level, mode=mode)
    assert_close(weights, [[2.25, 2.25, 2.25], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"level": "seq"}, UserError, r"unknown `level` 'seq'\. Did you mean 'sequence'"),
        (
            {"level": "token_truncate"},
            UserError,
            r"TRL's vllm_importance_sampling_mode for level='token', mode='truncate'",
        ),
        ({"mode": "clip"}, UserError, r"unknown `mode` 'clip'"),
        ({"threshold": 0.0}, ValueError, r"`threshold` must be a number > 0"),
        ({"threshold_low": 2.0}, ValueError, r"`threshold_low` must be in \(0, threshold = 2"),
        ({"rollout_logprobs": torch.zeros(3, 2)}, ValueError, r"`rollout_logprobs` must have"),
        ({"mask": torch.ones(2, 3)}, ValueError, r"`mask` must be a bool tensor"),
        ({"old_logprobs": torch.zeros(1, 2, 3)}, ValueError, r"`old_logprobs` must have shape"),
    ],
)
def test_rejects_bad_inputs(kwargs: dict, error: type, message: str) -> None:
    old, rollout, mask = inputs()
    args: dict = {"old_logprobs": old, "rollout_logprobs": rollout, "mask": mask, "threshold": 2.0}
    args.update(kwargs)
    with pytest.raises(error, match=r"rollout_is_weights: .*" + message):
        rollout_is_weights(**args)
