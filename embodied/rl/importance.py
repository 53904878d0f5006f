"""Truncated importance sampling for the mismatch between the rollout and the trainer.

The rollout engine (HF ``generate``, vLLM, a VLA's sampling loop, a stale policy with
``algo.staleness=1``) samples from ``pi_rollout``, while PPO's ratio is taken against the
trainer's own log-probs ``pi_old`` of the same tokens. The two differ (kernels, precision,
sampling processors, one step of staleness), so the policy-gradient samples are off-policy by
``pi_old / pi_rollout``. Truncated importance sampling (TIS) reweights each token, or each
sequence, by that ratio, capped so that one rare token cannot dominate the batch:

* veRL: ``algorithm.rollout_correction.rollout_is: token | sequence`` with
  ``rollout_is_threshold`` (truncation);
* TRL: ``vllm_importance_sampling_mode``: ``token_truncate``, ``token_mask``,
  ``sequence_truncate``, ``sequence_mask`` with ``vllm_importance_sampling_clip_max`` /
  ``_clip_min`` (see :data:`TRL_IS_MODES`).

Multiply the weights into the per-token policy loss
(:func:`embodied.rl.policy_loss_per_token` ``is_weights=``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from embodied.errors import UserError, did_you_mean
from embodied.rl._checks import (
    check_floating,
    check_mask,
    check_shape,
    check_tensor,
    masked_mean,
    masked_sum,
)

__all__ = ["ISLevel", "ISMode", "ISModeAlias", "TRL_IS_MODES", "rollout_is_weights"]

ISLevel = Literal["token", "sequence"]
ISMode = Literal["truncate", "mask"]
_LEVELS: tuple[str, ...] = ("token", "sequence")
_MODES: tuple[str, ...] = ("truncate", "mask")

# exp(20) ~ 5e8 is finite in every float dtype; a sequence's summed log-ratio can be far larger.
_MAX_ABS_LOG_WEIGHT = 20.0


class ISModeAlias(NamedTuple):
    level: ISLevel
    mode: ISMode


TRL_IS_MODES: dict[str, ISModeAlias] = {
    "token_truncate": ISModeAlias("token", "truncate"),
    "token_mask": ISModeAlias("token", "mask"),
    "sequence_truncate": ISModeAlias("sequence", "truncate"),
    "sequence_mask": ISModeAlias("sequence", "mask"),
}


def _check_choice(fn: str, name: str, value: object, choices: tuple[str, ...]) -> None:
    if isinstance(value, str) and value in choices:
        return
    hint = ""
    if isinstance(value, str) and value in TRL_IS_MODES:
        alias = TRL_IS_MODES[value]
        hint = (
            f" {value!r} is TRL's vllm_importance_sampling_mode for level={alias.level!r}, "
            f"mode={alias.mode!r} (see TRL_IS_MODES)."
        )
    elif isinstance(value, str):
        hint = did_you_mean(value, choices)
    raise UserError(f"{fn}: unknown `{name}` {value!r}.{hint} Known: {', '.join(choices)}.")


def rollout_is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    level: ISLevel | str = "token",
    threshold: float = 2.0,
    mode: ISMode | str = "truncate",
    threshold_low: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights ``pi_old / pi_rollout``, truncated or masked at a threshold; detached.

    ``level="token"``: ``w_t = exp(old_t - rollout_t)`` per token. ``level="sequence"``: one
    weight per sequence, ``w = exp(sum_t mask_t * (old_t - rollout_t))``, given to each of its
    tokens. The log-weight is clamped to ``[-20, 20]`` before ``exp`` (a sequence sum can
    overflow otherwise). Then, with ``threshold_low`` optional (no lower bound when None):

    * ``mode="truncate"`` (TIS): ``w = clip(w, threshold_low, threshold)``;
    * ``mode="mask"``: ``w = 0`` where ``w > threshold`` or ``w < threshold_low``: the token (or
      the whole sequence) is dropped from the gradient, the other weights are kept as they are.

    Args:
        old_logprobs: ``(B, K)`` token (or ``(B,)`` action) log-probs recomputed by the trainer.
        rollout_logprobs: same shape, the log-probs the rollout engine reported when sampling.
        mask: optional bool, same shape; True = valid token. Padding gets weight 0 and is
            ignored by the sums and statistics (it may hold NaN).
        level: ``token`` or ``sequence`` (veRL ``rollout_is``). For ``(B,)`` inputs both are the
            same (one token per sample).
        threshold: upper bound (> 0), veRL ``rollout_is_threshold`` / TRL ``..._clip_max``.
        mode: ``truncate`` or ``mask``.
        threshold_low: optional lower bound in ``(0, threshold)``, TRL ``..._clip_min``.

    Returns:
        ``(weights, stats)``: ``weights`` has the shape of ``old_logprobs`` and no gradient;
        ``stats`` (detached 0-d tensors, over valid tokens for ``token``, over sequences with a
        valid token for ``sequence``): ``ratio_mean`` (mean ``exp(old - rollout)`` before
        correction), ``weight_mean`` (after), ``frac_truncated`` or ``frac_masked`` (share of
        weights outside the bounds), and ``logprob_abs_diff`` (mean ``|old - rollout|`` over
        valid tokens: the trainer/rollout mismatch to watch).

    Raises:
        ValueError: on mismatched shapes, a non-bool mask, or out-of-range thresholds.
        UserError: on an unknown ``level`` or ``mode`` (TRL's combined names are pointed to
            :data:`TRL_IS_MODES`).
    """
    fn = "rollout_is_weights"
    old_logprobs = check_tensor(fn, "old_logprobs", old_logprobs)
    if old_logprobs.ndim not in (1, 2):
        raise ValueError(
            f"{fn}: `old_logprobs` must have shape (B, K) (per token) or (B,) (per action), "
            f"got {tuple(old_logprobs.shape)}"
        )
    check_floating(fn, "old_logprobs", old_logprobs)
    check_shape(fn, "rollout_logprobs", rollout_logprobs, old_logprobs.shape, "", "old_logprobs")
    check_floating(fn, "rollout_logprobs", rollout_logprobs)
    if mask is not None:
        mask = check_mask(fn, "mask", mask, old_logprobs.shape, "old_logprobs")
    _check_choice(fn, "level", level, _LEVELS)
    _check_choice(fn, "mode", mode, _MODES)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold <= 0:
        raise ValueError(f"{fn}: `threshold` must be a number > 0, got {threshold!r}")
    if threshold_low is not None and not 0 < threshold_low < threshold:
        raise ValueError(
            f"{fn}: `threshold_low` must be in (0, threshold = {threshold}), got {threshold_low}"
        )

    with torch.no_grad():
        log_ratio = old_logprobs.detach() - rollout_logprobs.detach()  # (B, K) or (B,)
        diff_abs = masked_mean(log_ratio.abs(), mask)
        # The unit the weights are defined on: tokens, or sequences (B,) for sequence level.
        if level == "sequence" and log_ratio.ndim == 2:
            log_weight = masked_sum(log_ratio, mask, dim=-1)  # (B,)
            unit_mask = None if mask is None else mask.any(dim=-1)  # (B,)
        else:
            log_weight = log_ratio
            unit_mask = mask
        if unit_mask is not None:
            log_weight = torch.where(unit_mask, log_weight, torch.zeros_like(log_weight))
        ratio = torch.exp(log_weight.clamp(-_MAX_ABS_LOG_WEIGHT, _MAX_ABS_LOG_WEIGHT))
        outside = ratio > threshold
        if threshold_low is not None:
            outside = outside | (ratio < threshold_low)
        if mode == "truncate":
            weights = ratio.clamp(min=threshold_low, max=threshold)
        else:
            weights = torch.where(outside, torch.zeros_like(ratio), ratio)
        dtype = ratio.dtype
        stats = {
            "ratio_mean": masked_mean(ratio, unit_mask),
            "weight_mean": masked_mean(weights, unit_mask),
            f"frac_{'truncated' if mode == 'truncate' else 'masked'}": masked_mean(
                outside.to(dtype), unit_mask
            ),
            "logprob_abs_diff": diff_abs,
        }
        if weights.shape != old_logprobs.shape:  # one weight per sequence, to each token
            weights = weights.unsqueeze(-1).expand(old_logprobs.shape).contiguous()
        if mask is not None:
            weights = torch.where(mask, weights, torch.zeros_like(weights))
    return weights, stats
