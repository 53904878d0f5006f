"""PPO / GRPO loss terms as pure functions.

:func:`policy_loss_per_token` returns the per-token loss ``(B, K)`` (or per-action ``(B,)``)
before aggregation, for an algorithm that aggregates with :func:`embodied.rl.agg_loss`
(``loss_agg_mode``) and may split a minibatch into micro-batches; :func:`value_errors` the
per-sample value errors of PPO2's clipped value loss. Losses are meant to be *minimized*.
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
    "policy_loss_per_token",
    "should_stop_early",
    "value_errors",
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
    dual_active: torch.Tensor | None  # bool: A < 0 and the -c * A cap is active (None if off)


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
    dual_active = None
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
        ratio, adv, log_ratio = terms.ratio, terms.advantages, terms.log_ratio
        dtype = ratio.dtype
        # One stacked reduction for every statistic: they are computed on every minibatch, where a
        # separate masked mean each would be a dozen small ops more per optimizer step. The
        # clipped branch is the larger one exactly where r left the clip range on the side A
        # points to, so pg_clipfrac = clipfrac_low + clipfrac_high; ppo_kl is -mean(log r).
        low = (adv < 0) & (ratio < 1.0 - eps_low)
        high = (adv > 0) & (ratio > 1.0 + eps_high)
        flags = [low, high] if terms.dual_active is None else [low, high, terms.dual_active]
        columns = torch.cat([torch.stack(flags).to(dtype), torch.stack([log_ratio, _k3(log_ratio), ratio])])
        if mask is None:
            means = columns.reshape(len(columns), -1).mean(-1)
        else:
            picked = torch.where(mask, columns, torch.zeros((), dtype=dtype, device=columns.device))
            means = picked.reshape(len(columns), -1).sum(-1) / mask.sum().clamp(min=1).to(dtype)
        low_mean, high_mean, *rest = means.unbind()
        lower_mean = rest.pop(0) if terms.dual_active is not None else torch.zeros((), dtype=dtype, device=means.device)
        log_ratio_mean, k3_mean, ratio_mean = rest
    return losses, {
        "pg_clipfrac": low_mean + high_mean,
        "clipfrac_low": low_mean,
        "clipfrac_high": high_mean,
        "pg_clipfrac_lower": lower_mean,
        "ppo_kl": -log_ratio_mean,
        "approx_kl": k3_mean,
        "ratio_mean": ratio_mean,
    }


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


