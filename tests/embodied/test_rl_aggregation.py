"""Loss aggregation (veRL loss_agg_mode): hand-computed numbers and micro-batch invariance."""

from __future__ import annotations

import typing

import pytest
import torch

from embodied.errors import UserError
from embodied.rl import (
    LOSS_AGG_ALIASES,
    LOSS_AGG_MODES,
    LossAggAlias,
    LossAggMode,
    agg_entropy,
    agg_loss,
    loss_agg_counts,
    resolve_loss_agg_mode,
)

NAN = float("nan")
MODES = list(typing.get_args(LossAggMode))

# B = 3 sequences, K = 4 tokens. Masked entries hold NaN to prove they never leak in.
#   row 0: valid [1, 2, 3]  -> token sum 6, 3 tokens
#   row 1: valid [5]        -> token sum 5, 1 token
#   row 2: no valid token (a padding row) -> not counted as a sequence
LOSS = [[1.0, 2.0, 3.0, NAN], [5.0, NAN, NAN, NAN], [NAN, NAN, NAN, NAN]]
MASK = [[True, True, True, False], [True, False, False, False], [False, False, False, False]]


def tensor(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def flags(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def value(x: torch.Tensor) -> float:
    return float(x.detach())


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 11 / 4),  # (6 + 5) / 4 valid tokens
        ("seq-mean-token-sum", 11 / 2),  # (6 + 5) / 2 sequences
        ("seq-mean-token-mean", (2.0 + 5.0) / 2),  # (6 / 3 + 5 / 1) / 2
        ("seq-mean-token-sum-norm", (6 / 4 + 5 / 4) / 2),  # (6 / K + 5 / K) / 2, K = 4
    ],
)
def test_modes_on_a_hand_worked_masked_batch(mode: str, expected: float) -> None:
    assert value(agg_loss(tensor(LOSS), flags(MASK), mode)) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 11 / 10),  # num_tokens = 10
        ("seq-mean-token-sum", 11 / 4),  # num_seqs = 4
        ("seq-mean-token-mean", 7 / 4),
        ("seq-mean-token-sum-norm", (6 / 10 + 5 / 10) / 4),  # loss_scale_factor = 10
    ],
)
def test_global_denominators_replace_the_local_counts(mode: str, expected: float) -> None:
    # Each mode reads only its own count, so both can always be passed.
    out = agg_loss(
        tensor(LOSS), flags(MASK), mode, num_tokens=10, num_seqs=torch.tensor(4),
        loss_scale_factor=10,
    )  # fmt: skip
    assert value(out) == pytest.approx(expected, abs=1e-12)


def test_per_sample_inputs_are_one_token_per_sample() -> None:
    # (B,) losses of an MLP policy: every mode is the mean over valid samples, (1 + 2) / 2.
    losses, mask = tensor([1.0, 2.0, NAN]), flags([True, True, False])
    for mode in MODES:
        assert value(agg_loss(losses, mask, mode)) == pytest.approx(1.5, abs=1e-12), mode
    # ... and the sum over the whole minibatch's 4 samples when those are passed.
    assert value(agg_loss(losses, mask, "token-mean", num_tokens=4)) == pytest.approx(0.75)
    assert value(agg_loss(losses, mask, "seq-mean-token-mean", num_seqs=4)) == pytest.approx(0.75)
    assert value(agg_loss(tensor([1.0, 3.0]), None, "token-mean")) == pytest.approx(2.0)


def test_all_padding_gives_zero_not_nan() -> None:
    for mode in MODES:
        out = agg_loss(tensor([[NAN, NAN]]), flags([[False, False]]), mode)
        assert value(out) == 0.0, mode


def test_gradient_reaches_valid_tokens_only() -> None:
    loss_mat = tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]).requires_grad_()
    mask = flags([[True, True, True, False], [True, False, False, False]])
    agg_loss(loss_mat, mask, "seq-mean-token-mean").backward()
    # d/dl of (mean(row0 valid) + mean(row1 valid)) / 2: 1/6 on row 0's three, 1/2 on row 1's one
    expected = tensor([[1 / 6, 1 / 6, 1 / 6, 0.0], [1 / 2, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(loss_mat.grad, expected, rtol=0, atol=1e-12)


def test_loss_agg_counts() -> None:
    counts = loss_agg_counts(flags(MASK))
    assert (int(counts.num_tokens), int(counts.num_seqs)) == (4, 2)
    counts = loss_agg_counts(flags([True, False, True]))
    assert (int(counts.num_tokens), int(counts.num_seqs)) == (2, 2)


# --------------------------------------------------------------------------------------------
# Micro-batching: the summed micro-batch losses equal the whole minibatch's, gradient included.
# --------------------------------------------------------------------------------------------

NUM_SEQS, NUM_TOKENS_PER_SEQ = 8, 5


def minibatch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(NUM_SEQS, NUM_TOKENS_PER_SEQ, dtype=torch.float64, generator=generator)
    # Response lengths 5, 1, 3, 0 (a padding row), 2, 5, 4, 1: micro-batches get unequal counts.
    lengths = torch.tensor([5, 1, 3, 0, 2, 5, 4, 1])
    mask = torch.arange(NUM_TOKENS_PER_SEQ).unsqueeze(0) < lengths.unsqueeze(1)  # (B, K)
    return features, mask


def per_token_loss(weights: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    # Any differentiable per-token function of shared parameters will do. (B, K)
    return torch.tanh(features * weights[0] + weights[1]) * features


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_micro_batches", [1, 2, 4])
def test_micro_batches_sum_to_the_whole_minibatch(mode: str, num_micro_batches: int) -> None:
    features, mask = minibatch()
    counts = loss_agg_counts(mask)  # of the whole minibatch: 21 tokens, 7 sequences
    assert (int(counts.num_tokens), int(counts.num_seqs)) == (21, 7)

    whole_weights = torch.tensor([0.7, -0.3], dtype=torch.float64, requires_grad=True)
    whole = agg_loss(per_token_loss(whole_weights, features), mask, mode)
    whole.backward()

    split_weights = whole_weights.detach().clone().requires_grad_()
    total = torch.zeros((), dtype=torch.float64)
    for feats, micro_mask in zip(
        features.chunk(num_micro_batches), mask.chunk(num_micro_batches), strict=True
    ):
        micro_loss = agg_loss(
            per_token_loss(split_weights, feats), micro_mask, mode,
            num_tokens=counts.num_tokens, num_seqs=counts.num_seqs,
            loss_scale_factor=NUM_TOKENS_PER_SEQ,
        )  # fmt: skip
        micro_loss.backward()  # gradients accumulate, as in gradient accumulation
        total = total + micro_loss.detach()

    torch.testing.assert_close(total, whole.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(split_weights.grad, whole_weights.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_local_counts_weight_unequal_micro_batches_wrongly(mode: str) -> None:
    # The control for the test above: without the global counts each half (9 and 12 tokens,
    # 3 and 4 sequences) is averaged on its own, and the mean of the halves is not the whole's.
    features, mask = minibatch()
    weights = torch.tensor([0.7, -0.3], dtype=torch.float64)
    whole = agg_loss(per_token_loss(weights, features), mask, mode)
    halves = [
        agg_loss(per_token_loss(weights, f), m, mode)
        for f, m in zip(features.chunk(2), mask.chunk(2), strict=True)
    ]
    assert abs(value(sum(halves) / 2) - value(whole)) > 1e-3


# --------------------------------------------------------------------------------------------
# Entropy, names, errors
# --------------------------------------------------------------------------------------------


def test_agg_entropy_uses_the_same_modes() -> None:
    entropy, mask = tensor(LOSS), flags(MASK)
    for mode in MODES:
        expected = agg_loss(entropy, mask, mode, num_tokens=10, num_seqs=4)
        out = agg_entropy(entropy, mask, mode, num_tokens=10, num_seqs=4)
        assert value(out) == value(expected), mode
    assert value(agg_entropy(entropy, mask, "token-mean")) == pytest.approx(11 / 4)


def test_registry_and_literal_name_the_same_modes() -> None:
    assert sorted(MODES) == LOSS_AGG_MODES.names()


def test_trl_aliases() -> None:
    assert LOSS_AGG_ALIASES == {
        "dapo": LossAggAlias("token-mean", global_denominator=True),
        "bnpo": LossAggAlias("token-mean", global_denominator=False),
        "grpo": LossAggAlias("seq-mean-token-mean", global_denominator=True),
        "dr_grpo": LossAggAlias("seq-mean-token-sum-norm", global_denominator=True),
    }
    assert resolve_loss_agg_mode("dr_grpo") == ("seq-mean-token-sum-norm", True)
    assert resolve_loss_agg_mode("bnpo") == ("token-mean", False)
    assert resolve_loss_agg_mode("seq-mean-token-sum") == ("seq-mean-token-sum", True)
    with pytest.raises(UserError, match=r"'dr-grpo'\. Did you mean 'dr_grpo'"):
        resolve_loss_agg_mode("dr-grpo")


def test_unknown_mode_is_a_user_error_with_suggestions() -> None:
    message = r"agg_loss: unknown `mode` 'token_mean'\. Did you mean 'token-mean'"
    with pytest.raises(UserError, match=message):
        agg_loss(tensor(LOSS), flags(MASK), "token_mean")
    with pytest.raises(UserError, match=r"'dapo' is TRL's loss_type name for 'token-mean'"):
        agg_loss(tensor(LOSS), flags(MASK), "dapo")
    with pytest.raises(UserError, match=r"agg_entropy: unknown `mode`"):
        agg_entropy(tensor(LOSS), flags(MASK), "mean")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_mat": torch.zeros(2, 3, 4)}, r"agg_loss: `loss_mat` must have shape \(B, K\)"),
        ({"loss_mat": torch.zeros(3, 4, dtype=torch.long)}, r"`loss_mat` must be a floating-point"),
        ({"mask": flags(MASK)[:2]}, r"agg_loss: `mask` must have shape \(3, 4\) to match"),
        ({"mask": tensor(MASK)}, r"`mask` must be a bool tensor"),
        ({"num_tokens": -1}, r"`num_tokens` must be >= 0, got -1"),
        ({"num_seqs": torch.tensor([4, 4])}, r"`num_seqs` must be a number or a 0-d tensor"),
        ({"num_tokens": True}, r"`num_tokens` must be a number"),
        ({"loss_scale_factor": 0}, r"`loss_scale_factor` must be > 0"),
    ],
)
def test_agg_loss_rejects_bad_inputs(kwargs: dict, message: str) -> None:
    args: dict = {"loss_mat": tensor(LOSS), "mask": flags(MASK), "mode": "token-mean"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        agg_loss(**args)


def test_agg_entropy_errors_name_its_argument() -> None:
    with pytest.raises(ValueError, match=r"agg_entropy: `entropy` must have shape"):
        agg_entropy(torch.zeros(2, 2, 2), None, "token-mean")
    with pytest.raises(ValueError, match=r"loss_agg_counts: `mask` must be a bool tensor"):
        loss_agg_counts(tensor(MASK))
