"""KL penalty estimators (veRL kl_loss_type) against hand-computed values and gradients.

The worked example: the policy gives the sampled token probability 0.5, the reference 0.25, so
``x = logp - ref = log 2 = 0.693147``.
"""

from __future__ import annotations

import math

import pytest
import torch

from embodied.errors import UserError
from embodied.rl import KL_ESTIMATORS, kl_penalty

LOG2 = math.log(2.0)


def penalty_and_grad(kind: str, logp: float, ref: float) -> tuple[float, float]:
    logprobs = torch.tensor([logp], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(logprobs, torch.tensor([ref], dtype=torch.float64), kind)
    value.sum().backward()
    return float(value.detach()), float(logprobs.grad)


@pytest.mark.parametrize(
    ("kinds", "expected_value", "expected_grad"),
    [
        # k1 = x = log 2;  d/dlogp = 1
        (("k1", "kl"), LOG2, 1.0),
        # abs = |x| = log 2;  d/dlogp = sign(x) = 1
        (("abs",), LOG2, 1.0),
        # k2 = x^2 / 2 = 0.240227;  d/dlogp = x = log 2
        (("k2", "mse"), LOG2**2 / 2, LOG2),
        # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + log 2 - 1 = 0.193147;
        # d/dlogp = -exp(ref - logp) + 1 = 1 - 0.5
        (("k3", "low_var_kl"), 0.5 + LOG2 - 1.0, 0.5),
        # straight-through: the value of k3 with the gradient of k2
        (("k3+", "low_var_kl+"), 0.5 + LOG2 - 1.0, LOG2),
        (("k1+", "kl+"), LOG2, LOG2),
        (("k2+", "mse+"), LOG2**2 / 2, LOG2),
    ],
)
def test_estimators_hand_computed(
    kinds: tuple[str, ...], expected_value: float, expected_grad: float
) -> None:
    for kind in kinds:
        value, grad = penalty_and_grad(kind, math.log(0.5), math.log(0.25))
        assert value == pytest.approx(expected_value, abs=1e-12), kind
        assert grad == pytest.approx(expected_grad, abs=1e-12), kind


def test_policy_below_reference() -> None:
    # logp = log 0.25, ref = log 0.5: x = -log 2.
    assert penalty_and_grad("k1", math.log(0.25), math.log(0.5)) == pytest.approx((-LOG2, 1.0))
    assert penalty_and_grad("abs", math.log(0.25), math.log(0.5)) == pytest.approx((LOG2, -1.0))
    # k3 = exp(log 2) - log 2 - 1 = 1 - log 2;  d/dlogp = 1 - exp(log 2) = -1
    assert penalty_and_grad("k3", math.log(0.25), math.log(0.5)) == pytest.approx(
        (1.0 - LOG2, -1.0)
    )


def test_k3_clamps_far_from_the_reference() -> None:
    # ref - logp = -50 -> clamped to -20: exp(-20) + 20 - 1 = 19.000000002 -> clamped to 10
    assert penalty_and_grad("k3", 0.0, -50.0) == pytest.approx((10.0, 0.0))
    # ref - logp = +50 -> clamped to 20: exp(20) - 21 -> clamped to 10 (finite, no inf)
    assert penalty_and_grad("k3", -50.0, 0.0) == pytest.approx((10.0, 0.0))
    # Inside the clamp: x = 0 gives 0.
    assert penalty_and_grad("k3", -1.0, -1.0) == pytest.approx((0.0, 0.0))


def test_mask_ignores_nan_reference_on_padding() -> None:
    logprobs = torch.tensor([[math.log(0.5), -3.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(0.25), float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[True, False]])
    for kind in ("k1", "abs", "k2", "k3", "k3+"):
        logprobs.grad = None
        value = kl_penalty(logprobs, ref, kind, mask=mask)
        value.sum().backward()
        assert float(value.detach()[0, 1]) == 0.0, kind
        assert float(logprobs.grad[0, 1]) == 0.0, kind
        assert torch.isfinite(logprobs.grad).all(), kind


def test_registry_holds_verl_names() -> None:
    assert KL_ESTIMATORS.names() == ["abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]


def test_rejects_bad_inputs() -> None:
    logprobs = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"kl_penalty: `ref_logprobs` must have shape \(2, 3\)"):
        kl_penalty(logprobs, torch.zeros(3, 2, dtype=torch.float64), "k3")
    with pytest.raises(ValueError, match=r"kl_penalty: `mask` must be a bool tensor"):
        kl_penalty(logprobs, logprobs, "k3", mask=torch.ones(2, 3))
    with pytest.raises(UserError, match=r"kl_penalty: unknown `kind` 'k4'\. Did you mean"):
        kl_penalty(logprobs, logprobs, "k4")
    with pytest.raises(UserError, match=r"'low-var-kl'\. Did you mean 'low_var_kl'"):
        kl_penalty(logprobs, logprobs, "low-var-kl")
    with pytest.raises(UserError, match=r"'full' \(the exact KL over the vocabulary\)"):
        kl_penalty(logprobs, logprobs, "full")
