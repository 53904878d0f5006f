"""PPO / GRPO loss terms as pure functions.

:func:`policy_loss_per_token` returns the per-token loss ``(B, K)`` (or per-action ``(B,)``)
before aggregation, for an algorithm that aggregates with :func:`embodied.rl.agg_loss`
(``loss_agg_mode``) and may split a minibatch into micro-batches. The other functions take
per-sample inputs of one shape, ``(N,)`` for a flat minibatch or ``(T, B)`` for a time-major one,
and reduce with a mean over the valid samples (``mask`` True, or all samples when ``mask`` is
None): that is the ``token-mean`` of one whole minibatch. Losses are meant to be *minimized*.
Statistics come back as detached 0-d tensors (no host sync per minibatch; call ``float()`` when
logging).
"""

from __future__ import annotations

from typing import NamedTuple

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
    "policy_loss_per_token",
    "ppo_policy_loss",
    "should_stop_early",
    "value_errors",
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


def _check_clip(
    fn: str,
    low: tuple[str, float],
    high: tuple[str, float | None],
    dual: tuple[str, float | None],
) -> tuple[float, float]:
    """Validate the clip parameters under the caller's argument names -> ``(eps_low, eps_high)``."""
    (low_name, eps_low), (high_name, eps_high), (dual_name, dual_clip) = low, high, dual
    if not 0.0 < eps_low < 1.0:
        raise ValueError(f"{fn}: `{low_name}` must be in (0, 1), got {eps_low}")
    if eps_high is not None and not eps_high > 0.0:
        raise ValueError(f"{fn}: `{high_name}` must be > 0, got {eps_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(
            f"{fn}: `{dual_name}` must be > 1 (it caps the loss of negative-advantage samples at "
            f"-{dual_name} * A, which must lie above the clipped surrogate), got {dual_clip}"
        )
    return eps_low, eps_low if eps_high is None else eps_high


class _Surrogate(NamedTuple):
    """Per-element pieces of the clipped surrogate; every field has the inputs' shape."""

    losses: torch.Tensor  # l, after dual clip; 0 where masked out
    ratio: torch.Tensor  # r = exp(clamped log-ratio)
    log_ratio: torch.Tensor  # log r, clamped to [-20, 20]
    advantages: torch.Tensor  # A, 0 where masked out
    clipped: torch.Tensor  # bool: the clipped branch is the larger one (r was clipped)
    dual_active: torch.Tensor  # bool: A < 0 and the -c * A cap is active (all False if off)


def _clipped_surrogate(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> _Surrogate:
    """The PPO clipped surrogate with optional dual clip, per element (inputs already checked)."""
    if mask is not None:
        # Padding may hold NaN in the data-side inputs; 0 * NaN would still be NaN in the
        # backward pass through torch.where, so replace it before it meets the gradient path.
        old_logprobs = torch.where(mask, old_logprobs, new_logprobs.detach())
        advantages = torch.where(mask, advantages, torch.zeros_like(advantages))
    log_ratio = _log_ratio(new_logprobs, old_logprobs)
    ratio = torch.exp(log_ratio)
    unclipped_losses = -advantages * ratio
    clipped_losses = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    losses = torch.maximum(unclipped_losses, clipped_losses)
    dual_active = torch.zeros_like(losses, dtype=torch.bool)
    if dual_clip is not None:
        negative = advantages < 0
        bound = -dual_clip * advantages
        dual_active = negative & (losses > bound)
        losses = torch.where(negative, torch.minimum(losses, bound), losses)
    return _Surrogate(
        losses=losses,
        ratio=ratio,
        log_ratio=log_ratio,
        advantages=advantages,
        clipped=clipped_losses > unclipped_losses,
        dual_active=dual_active,
    )


def _per_token_input(
    fn: str, name: str, x: object, like: torch.Tensor, like_name: str
) -> torch.Tensor:
    """``x`` has ``like``'s shape, or is ``(B,)`` broadcast over the ``K`` tokens of ``(B, K)``."""
    x = check_tensor(fn, name, x)
    if like.ndim == 2 and tuple(x.shape) == tuple(like.shape[:1]):
        x = x.unsqueeze(-1).expand(like.shape)
    elif tuple(x.shape) != tuple(like.shape):
        wanted = "(B,)" if like.ndim == 1 else "(B, K) or (B,)"
        raise ValueError(
            f"{fn}: `{name}` must have shape {wanted} to match `{like_name}` "
            f"{tuple(like.shape)}, got {tuple(x.shape)}"
        )
    check_floating(fn, name, x)
    return x


def policy_loss_per_token(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped policy loss of PPO / GRPO / DAPO, before aggregation (veRL "vanilla").

    With ``r = exp(clamp(new_logprobs - old_logprobs, -20, 20))``, ``eps_low = clip_ratio_low``,
    ``eps_high = clip_ratio_high`` (default ``eps_low``; DAPO's "clip-higher" uses 0.28) and
    ``c = clip_ratio_c``, each element gets::

        l = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))
        l = min(l, -c * A)            if A < 0 and dual clip is on (Ye et al. 2020)
        l = l * w                     with the importance weights w, if given

    so for ``A > 0`` a ratio inside ``(1 + eps_low, 1 + eps_high]`` is *not* clipped, and for
    ``A < 0`` the loss stops growing (gradient 0) once ``r > c``. Aggregate the result with
    :func:`embodied.rl.agg_loss` (``loss_agg_mode``).

    Works for the three policy kinds: an MLP passes ``(B,)`` action log-probs; a VLA or an LLM
    passes ``(B, K)`` token log-probs with a ``(B, K)`` mask and ``(B,)`` (per-sequence) or
    ``(B, K)`` advantages.

    Args:
        new_logprobs: ``(B, K)`` or ``(B,)``, log-probs under the policy being optimized; carries
            the gradient.
        old_logprobs: same shape, log-probs under the policy that collected the data (or the
            recomputed "old" policy); no gradient.
        advantages: same shape, or ``(B,)`` broadcast over the ``K`` tokens of each sequence.
        mask: optional bool, same shape as ``new_logprobs``; True = valid token. Masked-out
            entries of ``old_logprobs``, ``advantages`` and ``is_weights`` are never used and may
            hold NaN; their loss is 0.
        clip_ratio_low: ``eps_low`` in ``(0, 1)``.
        clip_ratio_high: ``eps_high > 0``, or None for ``eps_low``.
        clip_ratio_c: ``c > 1`` for dual clip, or None (off). veRL's config default is 3.0.
        is_weights: optional importance weights (e.g. :func:`embodied.rl.rollout_is_weights`),
            same shape as ``new_logprobs`` or ``(B,)``; multiplied in, detached.

    Returns:
        ``(loss_mat, stats)``: ``loss_mat`` has the shape of ``new_logprobs``; ``stats`` are
        detached 0-d tensors over the valid elements, named as veRL / TRL log them:
        ``pg_clipfrac`` (share where the clipped branch is the active one, i.e.
        ``clipfrac_low + clipfrac_high``), ``clipfrac_low`` (``A < 0`` and ``r < 1 - eps_low``),
        ``clipfrac_high`` (``A > 0`` and ``r > 1 + eps_high``), ``pg_clipfrac_lower`` (share
        where the dual-clip cap is active; veRL's name, 0 when dual clip is off), ``ppo_kl``
        (mean of ``-log r``, veRL's k1), ``approx_kl`` (mean of k3 ``(r - 1) - log r``, for
        early stopping) and ``ratio_mean``. Weights do not enter the statistics.

    Raises:
        ValueError: on mismatched shapes, a non-bool mask, or out-of-range clip parameters.
    """
    fn = "policy_loss_per_token"
    new_logprobs = check_tensor(fn, "new_logprobs", new_logprobs)
    if new_logprobs.ndim not in (1, 2):
        raise ValueError(
            f"{fn}: `new_logprobs` must have shape (B, K) (per token) or (B,) (per action), "
            f"got {tuple(new_logprobs.shape)}"
        )
    check_floating(fn, "new_logprobs", new_logprobs)
    check_shape(fn, "old_logprobs", old_logprobs, new_logprobs.shape, "", "new_logprobs")
    check_floating(fn, "old_logprobs", old_logprobs)
    advantages = _per_token_input(fn, "advantages", advantages, new_logprobs, "new_logprobs")
    if is_weights is not None:
        is_weights = _per_token_input(fn, "is_weights", is_weights, new_logprobs, "new_logprobs")
    if mask is not None:
        mask = check_mask(fn, "mask", mask, new_logprobs.shape, "new_logprobs")
    eps_low, eps_high = _check_clip(
        fn,
        ("clip_ratio_low", clip_ratio_low),
        ("clip_ratio_high", clip_ratio_high),
        ("clip_ratio_c", clip_ratio_c),
    )

    terms = _clipped_surrogate(
        new_logprobs, old_logprobs, advantages, mask, eps_low, eps_high, clip_ratio_c
    )
    losses = terms.losses
    if is_weights is not None:
        weights = is_weights.detach()
        if mask is not None:
            weights = torch.where(mask, weights, torch.zeros_like(weights))
        losses = losses * weights

    with torch.no_grad():
        ratio, adv = terms.ratio, terms.advantages
        dtype = ratio.dtype
        stats = {
            "pg_clipfrac": masked_mean(terms.clipped.to(dtype), mask),
            "clipfrac_low": masked_mean(((adv < 0) & (ratio < 1.0 - eps_low)).to(dtype), mask),
            "clipfrac_high": masked_mean(((adv > 0) & (ratio > 1.0 + eps_high)).to(dtype), mask),
            "pg_clipfrac_lower": masked_mean(terms.dual_active.to(dtype), mask),
            "ppo_kl": masked_mean(-terms.log_ratio, mask),
            "approx_kl": masked_mean(_k3(terms.log_ratio), mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return losses, {key: value.detach() for key, value in stats.items()}


def ppo_policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float = 0.2,
    dual_clip: float | None = None,
    clip_ratio_high: float | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate policy loss of PPO (Schulman et al. 2017), averaged over valid samples.

    The per-sample loss is the one of :func:`policy_loss_per_token` (``clip_ratio`` is its
    ``clip_ratio_low``, ``dual_clip`` its ``clip_ratio_c``)::

        l = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))
        l = min(l, -dual_clip * A)    if A < 0 and dual clip is on

    i.e. ``-A * min(r, 1 + eps_high)`` for ``A > 0`` and ``-A * min(max(r, 1 - eps_low), c)``
    for ``A < 0``. The returned loss is the mean of ``l`` over valid samples: the ``token-mean``
    aggregation of one whole minibatch. The log-ratio is clamped to ``[-20, 20]``.

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
        ``clip_fraction`` (share with ``r`` outside ``[1 - eps_low, 1 + eps_high]``, whatever
        the sign of ``A``), ``approx_kl`` (k3 estimator ``(r - 1) - log r``, mean),
        ``ratio_mean`` and, when dual clip is on, ``dual_clip_fraction`` (share of samples where
        the ``-c * A`` bound is active).

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
    eps_low, eps_high = _check_clip(
        fn,
        ("clip_ratio", clip_ratio),
        ("clip_ratio_high", clip_ratio_high),
        ("dual_clip", dual_clip),
    )
    terms = _clipped_surrogate(
        new_logprobs, old_logprobs, advantages, mask, eps_low, eps_high, dual_clip
    )
    loss = masked_mean(terms.losses, mask)

    with torch.no_grad():
        ratio = terms.ratio
        outside = ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)).to(ratio.dtype)
        stats = {
            "clip_fraction": masked_mean(outside, mask),
            "approx_kl": masked_mean(_k3(terms.log_ratio), mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
        if dual_clip is not None:
            stats["dual_clip_fraction"] = masked_mean(terms.dual_active.to(ratio.dtype), mask)
    return loss, {key: value.detach() for key, value in stats.items()}


def value_errors(
    new_values: torch.Tensor,
    old_values: torch.Tensor | None,
    returns: torch.Tensor,
    clip: float | None = None,
) -> torch.Tensor:
    """Per-sample squared value errors ``0.5 * (V - R)^2``, optionally clipped around the old values.

    With ``clip = eps`` the new value is also clipped to ``V_clip = V_old + clip(V - V_old, -eps, eps)``
    and the pessimistic (larger) error is used, ``0.5 * max((V - R)^2, (V_clip - R)^2)``, so moving
    the value further than ``eps`` from ``V_old`` earns no reduction in loss (PPO2). Sum the result
    and divide by the minibatch's sample count to get a loss that micro-batching does not change.

    Args:
        new_values: any shape ``S``, predictions of the critic being optimized.
        old_values: ``S``, predictions at collection time; required only when ``clip`` is set.
        returns: ``S``, value targets (e.g. GAE returns).
        clip: ``eps > 0`` or None for no clipping.

    Returns:
        ``S``, differentiable w.r.t. ``new_values``.
    """
    fn = "value_errors"
    _check_same_shape(fn, ("new_values", new_values), ("returns", returns))
    errors = (new_values - returns).square()
    if clip is not None:
        if not clip > 0.0:
            raise ValueError(f"{fn}: `clip` must be > 0 or None, got {clip}")
        if old_values is None:
            raise ValueError(f"{fn}: `old_values` is required when `clip` is set")
        _check_same_shape(fn, ("new_values", new_values), ("old_values", old_values))
        clipped_values = old_values + (new_values - old_values).clamp(-clip, clip)
        errors = torch.maximum(errors, (clipped_values - returns).square())
    return 0.5 * errors


def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor | None,
    returns: torch.Tensor,
    clip: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Squared-error value loss, optionally clipped around the old values (PPO2 style): the mean
    of :func:`value_errors` over the valid samples, ``0.5 * mean(max((V - R)^2, (V_clip - R)^2))``.

    Args:
        new_values, old_values, returns, clip: see :func:`value_errors`.
        mask: optional bool ``S``, True = valid sample. Masked-out entries of ``old_values``
            and ``returns`` are never used and may hold NaN.

    Returns:
        The scalar loss.
    """
    fn = "value_loss"
    _check_same_shape(fn, ("new_values", new_values), ("returns", returns))
    if mask is not None:
        mask = check_mask(fn, "mask", mask, new_values.shape, "new_values")
        # keep NaN padding in the targets out of the backward pass
        returns = torch.where(mask, returns, new_values.detach())
        if old_values is not None:
            old_values = torch.where(mask, old_values, new_values.detach())
    return masked_mean(value_errors(new_values, old_values, returns, clip), mask)


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
