"""KL penalty to a reference policy, per token, with veRL's estimator names.

For GRPO's ``use_kl_loss`` (veRL ``actor.kl_loss_type``) and the in-reward KL
(``algorithm.kl_penalty``). With ``x = logprobs - ref_logprobs`` (log pi_theta - log pi_ref) on
tokens sampled from pi_theta, the estimators of ``KL(pi_theta || pi_ref)`` are (Schulman,
"Approximating KL divergence", http://joschu.net/blog/kl-approx.html):

=======================  =======================================================================
``k1`` / ``kl``          ``x`` (unbiased, high variance, can be negative)
``abs``                  ``|x|``
``k2`` / ``mse``         ``x^2 / 2`` (biased, low variance; its gradient is the KL's gradient)
``k3`` / ``low_var_kl``  ``exp(-x) + x - 1``, with ``-x`` clamped to ``[-20, 20]`` and the
                         result to ``[-10, 10]`` (unbiased, non-negative; veRL's default)
=======================  =======================================================================

A trailing ``+`` (``k3+``, ``low_var_kl+``, ``k1+``, ...) keeps the value of the estimator but
takes the gradient of ``k2`` (a straight-through estimator, as veRL): k1 and k3 estimate the
KL's value without bias, but their gradients are not unbiased estimates of the KL's gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from embodied.errors import UserError, did_you_mean
from embodied.registry import Registry
from embodied.rl._checks import check_floating, check_mask, check_shape, check_tensor

__all__ = ["KL_ESTIMATORS", "kl_penalty"]

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logp, ref) -> per element
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")

# Clamps of veRL's low_var_kl, for numerical stability far from the reference.
_MAX_ABS_LOG_RATIO = 20.0
_MAX_ABS_K3 = 10.0
_STRAIGHT_THROUGH = "+"


def _k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1: ``logprobs - ref_logprobs``."""
    return logprobs - ref_logprobs


def _abs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """abs: ``|logprobs - ref_logprobs|``."""
    return (logprobs - ref_logprobs).abs()


def _k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2: ``(logprobs - ref_logprobs)^2 / 2``."""
    return 0.5 * (logprobs - ref_logprobs).square()


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 (low_var_kl): ``exp(ref - logp) - (ref - logp) - 1``, clamped as veRL."""
    log_ratio = (ref_logprobs - logprobs).clamp(-_MAX_ABS_LOG_RATIO, _MAX_ABS_LOG_RATIO)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-_MAX_ABS_K3, _MAX_ABS_K3)


for _names, _estimator in (
    (("k1", "kl"), _k1),
    (("abs",), _abs),
    (("k2", "mse"), _k2),
    (("k3", "low_var_kl"), _k3),
):
    for _name in _names:
        KL_ESTIMATORS.add(_name, _estimator)


def _estimator(fn: str, kind: object) -> tuple[KLEstimator, bool]:
    """``kind`` -> (estimator, straight_through), or a UserError naming the known kinds."""
    if isinstance(kind, str):
        base = kind.removesuffix(_STRAIGHT_THROUGH)
        if base in KL_ESTIMATORS:
            return KL_ESTIMATORS.get(base), kind.endswith(_STRAIGHT_THROUGH)
    known = KL_ESTIMATORS.names()
    hint = ""
    if kind == "full":
        hint = " 'full' (the exact KL over the vocabulary) needs full distributions, not log-probs."
    elif isinstance(kind, str):
        hint = did_you_mean(kind, known + [name + _STRAIGHT_THROUGH for name in known])
    raise UserError(
        f"{fn}: unknown `kind` {kind!r}.{hint} Known kinds: {', '.join(known)} (each also with "
        f"a trailing '+' for the k2 straight-through gradient)."
    )


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: str,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL penalty of the current policy to a reference policy (veRL ``kl_penalty``).

    Aggregate the result like the policy loss (:func:`embodied.rl.agg_loss`) and add
    ``kl_loss_coef`` times it to the loss, or subtract it from token rewards.

    Args:
        logprobs: any shape ``S`` (``(B, K)`` tokens or ``(B,)`` actions), log-probs of the
            sampled tokens under the policy being optimized; carries the gradient.
        ref_logprobs: ``S``, the same tokens' log-probs under the frozen reference policy.
        kind: ``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl``, optionally with a
            trailing ``+`` (value of the estimator, gradient of ``k2``).
        mask: optional bool ``S``, True = valid token. Where False, ``ref_logprobs`` is never
            read (it may hold NaN) and the penalty is 0, with gradient 0.

    Returns:
        ``S``, the per-token penalty; differentiable w.r.t. ``logprobs``.

    Raises:
        ValueError: on mismatched shapes or a non-bool mask.
        UserError: on an unknown ``kind``.
    """
    fn = "kl_penalty"
    logprobs = check_tensor(fn, "logprobs", logprobs)
    check_floating(fn, "logprobs", logprobs)
    check_shape(fn, "ref_logprobs", ref_logprobs, logprobs.shape, "", "logprobs")
    check_floating(fn, "ref_logprobs", ref_logprobs)
    estimator, straight_through = _estimator(fn, kind)
    if mask is not None:
        mask = check_mask(fn, "mask", mask, logprobs.shape, "logprobs")
        # Keep NaN padding out of the backward pass (0 * NaN is NaN even through torch.where).
        ref_logprobs = torch.where(mask, ref_logprobs, logprobs.detach())

    value = estimator(logprobs, ref_logprobs)
    if mask is not None:
        value = torch.where(mask, value, torch.zeros_like(value))
    if not straight_through or estimator is _k2:
        return value
    surrogate = _k2(logprobs, ref_logprobs)
    return surrogate - surrogate.detach() + value.detach()
