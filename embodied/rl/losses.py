"""PPO / GRPO loss terms as pure functions.

All per-sample inputs of one function share one shape: ``(N,)`` for a flat minibatch or
``(T, B)`` for a time-major one; the functions reduce with a mean over the valid samples
(``mask`` True, or all samples when ``mask`` is None). Losses are meant to be *minimized*.
Statistics come back as detached 0-d tensors (no host sync per minibatch; call ``float()`` when
logging).
"""

from __future__ import annotations

import torch

from embodied.rl._checks import (
    check_floating,
    check_mask,
    check_shape,
    check_tensor,
    masked_mean,
)

__all__ = [
    "approx_kl",
    "entropy_bonus",
    "ppo_loss",
    "ppo_policy_loss",
    "should_stop_early",
    "value_loss",
]

# exp(20) ~ 5e8: far outside any clip range, still finite in float16/bfloat16/float32. verl and
# RLinf clamp the log-ratio the same way so one stale sample cannot overflow to inf and NaN.
_MAX_ABS_LOG_RATIO = 20.0


def _check_same_shape(
    fn: str, reference: tuple[str, torch.Tensor], *others: tuple[str, torch.Tensor]
) -> None:
    ref_name, ref = reference
    check_tensor(fn, ref_name, ref)
    check_floating(fn, ref_name, ref)
    for name, x in others:
        check_shape(fn, name, x, ref.shape, "", ref_name)
        check_floating(fn, name, x)


def _log_ratio(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return (new_logprobs - old_logprobs).clamp(-_MAX_ABS_LOG_RATIO, _MAX_ABS_LOG_RATIO)


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # (r - 1) - log r >= 0 for every sample; unbiased for KL(old || new) on samples from old.
    return torch.expm1(log_ratio) - log_ratio


def ppo_policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float = 0.2,
    dual_clip: float | None = None,
    clip_ratio_high: float | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate policy loss of PPO (Schulman et al. 2017), with optional dual clip.

    With ``r = exp(new_logprobs - old_logprobs)``, ``eps_low = clip_ratio`` and
    ``eps_high = clip_ratio_high`` (defaults to ``clip_ratio``; a larger value is DAPO's
    "clip-higher"), the per-sample loss is::

        l = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))

    which is ``-A * min(r, 1 + eps_high)`` for ``A > 0`` and ``-A * max(r, 1 - eps_low)`` for
    ``A < 0``. For ``A < 0`` that is unbounded as ``r`` grows, so one sample the new policy made
    far more likely can dominate the batch. Dual clip (Ye et al. 2020, "Mastering Complex Control
    in MOBA Games with Deep RL"; as in verl and RLinf) caps it with ``c = dual_clip > 1``::

        l = min(max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)), -c * A)    if A < 0
        l = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))                 if A >= 0

    i.e. ``-A * min(max(r, 1 - eps_low), c)`` for ``A < 0``: the loss stops growing (and its
    gradient is 0) once ``r > c``. The returned loss is the mean of ``l`` over valid samples.
    The log-ratio is clamped to ``[-20, 20]`` before ``exp`` so extreme samples stay finite.

    Args:
        new_logprobs: log pi_theta(a|s) under the policy being optimized, any shape ``S``
            (e.g. ``(N,)`` or ``(T, B)``); carries the gradient.
        old_logprobs: ``S``, log-probs under the policy that collected the data (no gradient).
        advantages: ``S``, advantage estimates (no gradient).
        clip_ratio: ``eps_low`` in ``(0, 1)``, and ``eps_high`` unless ``clip_ratio_high`` is set.
        dual_clip: ``c > 1`` to enable dual clip, or None.
        clip_ratio_high: ``eps_high > 0`` for an asymmetric clip range, or None.
        mask: optional bool ``S``, True = valid sample. Masked-out entries of
            ``old_logprobs`` and ``advantages`` are never used and may hold NaN.

    Returns:
        ``(loss, stats)``: the scalar loss and detached scalar statistics over valid samples:
        ``clip_fraction`` (share with ``r`` outside ``[1 - eps_low, 1 + eps_high]``),
        ``approx_kl`` (k3 estimator ``(r - 1) - log r``, mean), ``ratio_mean`` and, when dual clip
        is on, ``dual_clip_fraction`` (share of samples where the ``-c * A`` bound is active).

    Raises:
        ValueError: on mismatched shapes, a non-bool mask, or out-of-range clip parameters.
    """
    fn = "ppo_policy_loss"
    _check_same_shape(
        fn,
        ("new_logprobs", new_logprobs),
        ("old_logprobs", old_logprobs),
        ("advantages", advantages),
    )
    if mask is not None:
        mask = check_mask(fn, "mask", mask, new_logprobs.shape, "new_logprobs")
    if not 0.0 < clip_ratio < 1.0:
        raise ValueError(f"{fn}: `clip_ratio` must be in (0, 1), got {clip_ratio}")
    if clip_ratio_high is not None and not clip_ratio_high > 0.0:
        raise ValueError(f"{fn}: `clip_ratio_high` must be > 0, got {clip_ratio_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(
            f"{fn}: `dual_clip` must be > 1 (it caps the loss of negative-advantage samples at "
            f"-dual_clip * A, which must lie above the clipped surrogate), got {dual_clip}"
        )
    eps_low = clip_ratio
    eps_high = clip_ratio if clip_ratio_high is None else clip_ratio_high

    if mask is not None:
        # Padding may hold NaN in the data-side inputs; 0 * NaN would still be NaN in the
        # backward pass through torch.where, so replace it before it meets the gradient path.
        old_logprobs = torch.where(mask, old_logprobs, new_logprobs.detach())
        advantages = torch.where(mask, advantages, torch.zeros_like(advantages))
    log_ratio = _log_ratio(new_logprobs, old_logprobs)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    losses = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
    if dual_clip is not None:
        negative = advantages < 0
        bound = -dual_clip * advantages
        dual_active = negative & (losses > bound)
        losses = torch.where(negative, torch.minimum(losses, bound), losses)
    loss = masked_mean(losses, mask)

    with torch.no_grad():
        outside = ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)).to(ratio.dtype)
        stats = {
            "clip_fraction": masked_mean(outside, mask),
            "approx_kl": masked_mean(_k3(log_ratio), mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
        if dual_clip is not None:
            stats["dual_clip_fraction"] = masked_mean(dual_active.to(ratio.dtype), mask)
    return loss, {key: value.detach() for key, value in stats.items()}


def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor | None,
    returns: torch.Tensor,
    clip: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Squared-error value loss, optionally clipped around the old values (PPO2 style).

    Unclipped: ``0.5 * mean((V - R)^2)``. With ``clip = eps``, the new value is also clipped to
    ``V_clip = V_old + clip(V - V_old, -eps, eps)`` and the pessimistic (larger) error is used::

        0.5 * mean(max((V - R)^2, (V_clip - R)^2))

    so moving the value further than ``eps`` from ``V_old`` earns no reduction in loss.

    Args:
        new_values: any shape ``S``, predictions of the critic being optimized.
        old_values: ``S``, predictions at collection time; required only when ``clip`` is set.
        returns: ``S``, value targets (e.g. GAE returns).
        clip: ``eps > 0`` or None for no clipping.
        mask: optional bool ``S``, True = valid sample. Masked-out entries of ``old_values``
            and ``returns`` are never used and may hold NaN.

    Returns:
        The scalar loss.
    """
    fn = "value_loss"
    _check_same_shape(fn, ("new_values", new_values), ("returns", returns))
    if mask is not None:
        mask = check_mask(fn, "mask", mask, new_values.shape, "new_values")
    if mask is not None:  # keep NaN padding in the targets out of the backward pass
        returns = torch.where(mask, returns, new_values.detach())
    errors = (new_values - returns).square()
    if clip is not None:
        if not clip > 0.0:
            raise ValueError(f"{fn}: `clip` must be > 0 or None, got {clip}")
        if old_values is None:
            raise ValueError(f"{fn}: `old_values` is required when `clip` is set")
        _check_same_shape(fn, ("new_values", new_values), ("old_values", old_values))
        if mask is not None:
            old_values = torch.where(mask, old_values, new_values.detach())
        clipped_values = old_values + (new_values - old_values).clamp(-clip, clip)
        errors = torch.maximum(errors, (clipped_values - returns).square())
    return 0.5 * masked_mean(errors, mask)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean policy entropy over valid samples (to be *subtracted* from the loss, times a coef).

    Args:
        entropy: any shape ``S``, per-sample entropy of the action distribution.
        mask: optional bool ``S``, True = valid sample.
    """
    fn = "entropy_bonus"
    _check_same_shape(fn, ("entropy", entropy))
    if mask is not None:
        mask = check_mask(fn, "mask", mask, entropy.shape, "entropy")
    return masked_mean(entropy, mask)


def approx_kl(
    new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Approximate ``KL(pi_old || pi_new)`` from samples of ``pi_old``: mean of ``(r - 1) - log r``.

    This is Schulman's "k3" estimator (http://joschu.net/blog/kl-approx.html): unbiased and
    non-negative per sample, unlike the naive ``-log r``. ``r = exp(new - old)``, with the
    log-ratio clamped to ``[-20, 20]``.

    Args:
        new_logprobs: any shape ``S``.
        old_logprobs: ``S``.
        mask: optional bool ``S``, True = valid sample.

    Returns:
        A scalar tensor (differentiable w.r.t. ``new_logprobs``; detach it for logging).
    """
    fn = "approx_kl"
    _check_same_shape(fn, ("new_logprobs", new_logprobs), ("old_logprobs", old_logprobs))
    if mask is not None:
        mask = check_mask(fn, "mask", mask, new_logprobs.shape, "new_logprobs")
    return masked_mean(_k3(_log_ratio(new_logprobs, old_logprobs)), mask)


def should_stop_early(approx_kl: torch.Tensor | float, target_kl: float | None) -> bool:
    """Whether to stop the PPO epochs early: ``approx_kl > target_kl``; never if target is None.

    Args:
        approx_kl: the measured KL (a scalar tensor or float), e.g. ``stats["approx_kl"]``.
        target_kl: the threshold (> 0), or None to disable early stopping.
    """
    if target_kl is None:
        return False
    if not target_kl > 0.0:
        raise ValueError(f"should_stop_early: `target_kl` must be > 0 or None, got {target_kl}")
    if isinstance(approx_kl, torch.Tensor):
        approx_kl = approx_kl.detach()
    return float(approx_kl) > target_kl


def ppo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    new_values: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    clip_ratio: float = 0.2,
    clip_ratio_high: float | None = None,
    dual_clip: float | None = None,
    value_clip: float | None = None,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The full PPO objective: ``policy + vf_coef * value - ent_coef * entropy``.

    The terms are :func:`ppo_policy_loss`, :func:`value_loss` and :func:`entropy_bonus`, all
    averaged over the same valid samples. Critic-free training (GRPO) leaves ``new_values`` and
    ``returns`` as None: the value term is then absent. Likewise ``entropy=None`` drops the
    entropy term (``ent_coef`` must then be 0).

    Args:
        new_logprobs, old_logprobs, advantages: any shape ``S``, see :func:`ppo_policy_loss`.
        new_values, old_values, returns: ``S`` or None, see :func:`value_loss`.
        entropy: ``S`` or None, per-sample entropy.
        clip_ratio, clip_ratio_high, dual_clip: policy clipping, see :func:`ppo_policy_loss`.
        value_clip: clip range for the value loss, or None.
        vf_coef: weight of the value loss.
        ent_coef: weight of the entropy bonus (subtracted).
        mask: optional bool ``S``, True = valid sample.

    Returns:
        ``(loss, stats)``: the scalar total loss and a flat dict of detached scalars:
        ``losses/policy``, ``losses/value`` (if values given), ``losses/entropy`` (the mean
        entropy, if given), ``losses/approx_kl``, ``losses/clip_fraction``, ``losses/ratio_mean``,
        ``losses/dual_clip_fraction`` (if dual clip is on) and ``losses/total``.
    """
    fn = "ppo_loss"
    if (new_values is None) != (returns is None):
        raise ValueError(f"{fn}: pass both `new_values` and `returns` for a value loss, or neither")
    if entropy is None and ent_coef != 0.0:
        raise ValueError(f"{fn}: `ent_coef` is {ent_coef} but no `entropy` was given")

    policy, policy_stats = ppo_policy_loss(
        new_logprobs,
        old_logprobs,
        advantages,
        clip_ratio=clip_ratio,
        dual_clip=dual_clip,
        clip_ratio_high=clip_ratio_high,
        mask=mask,
    )
    total = policy
    stats = {"losses/policy": policy.detach()}
    if new_values is not None and returns is not None:
        value = value_loss(new_values, old_values, returns, clip=value_clip, mask=mask)
        total = total + vf_coef * value
        stats["losses/value"] = value.detach()
    if entropy is not None:
        mean_entropy = entropy_bonus(entropy, mask=mask)
        total = total - ent_coef * mean_entropy
        stats["losses/entropy"] = mean_entropy.detach()
    stats.update({f"losses/{key}": value for key, value in policy_stats.items()})
    stats["losses/total"] = total.detach()
    return total, stats
