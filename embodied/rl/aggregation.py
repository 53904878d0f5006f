"""Loss aggregation: from per-token losses ``(B, K)`` and a mask to the scalar that is minimized.

The modes and their names are veRL's ``actor.loss_agg_mode`` (``verl/trainer/ppo/core_algos.py``
``agg_loss``); TRL's ``loss_type`` names map onto them through :data:`LOSS_AGG_ALIASES`.

Shapes: ``B`` sequences (samples) of up to ``K`` tokens (response tokens of an LLM, action
tokens of a VLA). A policy that scores one action per sample (an MLP) passes ``(B,)``, which is
read as ``(B, 1)``: every mode then reduces to the mean over the valid samples.

Micro-batching. A minibatch is often split into micro-batches whose losses are backpropagated
one after the other and whose gradients add up. Every mode divides by a count: of tokens
(``token-mean``) or of sequences (the ``seq-mean-*`` modes). By default that count is the
micro-batch's own, which weights micro-batches unequally when they hold different numbers of
tokens. Passing the count of the *whole minibatch* (``num_tokens`` / ``num_seqs``, from
:func:`loss_agg_counts` on the minibatch's mask, or the sum of the micro-batches' counts) makes
the sum of the micro-batch losses exactly the whole-minibatch loss, gradient included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

from embodied.errors import UserError, did_you_mean
from embodied.registry import Registry
from embodied.rl._checks import (
    check_count,
    check_floating,
    check_mask,
    check_tensor,
)

__all__ = [
    "LOSS_AGG_ALIASES",
    "LOSS_AGG_MODES",
    "LossAggAlias",
    "LossAggCounts",
    "LossAggMode",
    "agg_entropy",
    "agg_loss",
    "loss_agg_counts",
    "resolve_loss_agg_mode",
]

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]

Count = int | float | torch.Tensor


class AggInputs(NamedTuple):
    """What an aggregation mode sees, after the checks."""

    values: torch.Tensor  # (B, K), 0 where the mask is False
    mask: torch.Tensor  # (B, K) bool
    num_tokens: Count | None
    num_seqs: Count | None
    loss_scale_factor: Count


AggFn = Callable[[AggInputs], torch.Tensor]
LOSS_AGG_MODES: Registry[AggFn] = Registry("loss aggregation mode")


class LossAggAlias(NamedTuple):
    """What another framework's name for an aggregation means in veRL's terms."""

    mode: LossAggMode
    # True: divide by the count of the whole minibatch (pass ``num_tokens`` / ``num_seqs`` to
    # every micro-batch); False: each micro-batch divides by its own count (pass neither).
    global_denominator: bool


LOSS_AGG_ALIASES: dict[str, LossAggAlias] = {
    # TRL GRPOConfig.loss_type. "dapo" (TRL's default) normalizes by the tokens of the whole
    # accumulated batch; "bnpo" by the tokens of the local batch only.
    "dapo": LossAggAlias("token-mean", global_denominator=True),
    "bnpo": LossAggAlias("token-mean", global_denominator=False),
    # Original GRPO: per-sequence token mean, then mean over sequences.
    "grpo": LossAggAlias("seq-mean-token-mean", global_denominator=True),
    # Dr. GRPO: token sum / (number of sequences * max completion length).
    "dr_grpo": LossAggAlias("seq-mean-token-sum-norm", global_denominator=True),
}


class LossAggCounts(NamedTuple):
    """The denominators of a minibatch: 0-d tensors summed from a mask on the device (no host
    sync), or Python ints where the host knows them (action-level samples, every one valid)."""

    num_tokens: Count  # valid tokens
    num_seqs: Count  # sequences with at least one valid token


def _denominator(given: Count | None, local: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | float:
    """``given`` (the minibatch's count), else ``local`` (this call's), at least 1: a micro-batch
    (or minibatch) made only of padding contributes 0, not NaN. A host number stays one (dividing
    by it is one op, where a tensor count costs three more per call)."""
    if isinstance(given, (int, float)):
        return float(max(given, 1))
    count = local if given is None else torch.as_tensor(given, device=like.device)
    assert count is not None, "a count: given or local"
    return count.to(like.dtype).clamp(min=1)


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(x: AggInputs) -> torch.Tensor:
    """Sum over all valid tokens / number of valid tokens (veRL's default, DAPO)."""
    return x.values.sum() / _denominator(x.num_tokens, x.mask.sum(), x.values)


def _seq_mean(per_seq: torch.Tensor, x: AggInputs) -> torch.Tensor:
    # per_seq: (B,), 0 for sequences without valid tokens; those are not counted either.
    return per_seq.sum() / _denominator(x.num_seqs, x.mask.any(dim=-1).sum(), per_seq)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(x: AggInputs) -> torch.Tensor:
    """Per-sequence token sum, then mean over sequences (long sequences weigh more)."""
    return _seq_mean(x.values.sum(dim=-1), x)


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(x: AggInputs) -> torch.Tensor:
    """Per-sequence token mean, then mean over sequences (the original GRPO)."""
    tokens_per_seq = x.mask.sum(dim=-1).clamp(min=1).to(x.values.dtype)  # (B,)
    return _seq_mean(x.values.sum(dim=-1) / tokens_per_seq, x)


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(x: AggInputs) -> torch.Tensor:
    """Per-sequence token sum / a constant length, then mean over sequences (Dr. GRPO)."""
    return _seq_mean(x.values.sum(dim=-1) / x.loss_scale_factor, x)


def _unknown_mode(fn: str, mode: object) -> UserError:
    known = ", ".join(repr(name) for name in LOSS_AGG_MODES.names())
    hint = ""
    if isinstance(mode, str) and mode in LOSS_AGG_ALIASES:
        alias = LOSS_AGG_ALIASES[mode]
        hint = (
            f" {mode!r} is TRL's loss_type name for {alias.mode!r}; map config names with "
            f"resolve_loss_agg_mode()."
        )
    elif isinstance(mode, str):
        hint = did_you_mean(mode, LOSS_AGG_MODES.names())
    return UserError(f"{fn}: unknown `mode` {mode!r}.{hint} Known modes: {known}.")


def resolve_loss_agg_mode(name: str) -> LossAggAlias:
    """A veRL ``loss_agg_mode`` or a TRL ``loss_type`` name -> ``(mode, global_denominator)``.

    veRL's own names always use the global denominator (veRL passes the minibatch's counts).

    Raises:
        UserError: for an unknown name, with the closest known names.
    """
    if name in LOSS_AGG_ALIASES:
        return LOSS_AGG_ALIASES[name]
    if name in LOSS_AGG_MODES:
        return LossAggAlias(name, global_denominator=True)  # type: ignore[arg-type]
    names = [*LOSS_AGG_MODES.names(), *LOSS_AGG_ALIASES]
    raise UserError(
        f"Unknown loss aggregation {name!r}.{did_you_mean(name, names)} Known: veRL "
        f"loss_agg_mode {', '.join(LOSS_AGG_MODES.names())}; TRL loss_type "
        f"{', '.join(LOSS_AGG_ALIASES)}."
    )


def _aggregate(
    fn: str,
    name: str,
    values: object,
    mask: torch.Tensor | None,
    mode: str,
    num_tokens: Count | None,
    num_seqs: Count | None,
    loss_scale_factor: Count | None,
) -> torch.Tensor:
    values = check_tensor(fn, name, values)
    if values.ndim not in (1, 2):
        raise ValueError(
            f"{fn}: `{name}` must have shape (B, K) (per token) or (B,) (one per sample), "
            f"got {tuple(values.shape)}"
        )
    check_floating(fn, name, values)
    if mask is not None:
        mask = check_mask(fn, "mask", mask, values.shape, name)
    if not isinstance(mode, str) or mode not in LOSS_AGG_MODES:
        raise _unknown_mode(fn, mode)
    check_count(fn, "num_tokens", num_tokens)
    check_count(fn, "num_seqs", num_seqs)
    check_count(fn, "loss_scale_factor", loss_scale_factor, positive=True)

    if mask is None and values.ndim == 1 and mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        # One token per sample, all valid (an action-level policy): every such mode is the sum over
        # the samples divided by their count (the minibatch's, when given).
        given = num_tokens if mode == "token-mean" else num_seqs
        return values.sum() / _denominator(values.shape[0] if given is None else given, None, values)
    if values.ndim == 1:  # one token per sample
        values = values.unsqueeze(-1)
        mask = None if mask is None else mask.unsqueeze(-1)
    if mask is None:
        mask = torch.ones(values.shape, dtype=torch.bool, device=values.device)
    if loss_scale_factor is None:
        loss_scale_factor = values.shape[-1]
    values = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    inputs = AggInputs(values, mask, num_tokens, num_seqs, loss_scale_factor)
    return LOSS_AGG_MODES.get(mode)(inputs)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor | None,
    mode: LossAggMode | str,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    loss_scale_factor: Count | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses into the scalar loss (veRL ``agg_loss``).

    With ``l`` the losses, ``m`` the mask, ``L_b = sum_k m_bk * l_bk`` the token sum of sequence
    ``b``, ``n_b = sum_k m_bk`` its valid tokens and ``S`` the sequences with ``n_b > 0``:

    ==========================  =================================================================
    ``token-mean``              ``sum_b L_b / num_tokens``  (``num_tokens`` default ``sum_b n_b``)
    ``seq-mean-token-sum``      ``sum_b L_b / num_seqs``    (``num_seqs`` default ``|S|``)
    ``seq-mean-token-mean``     ``sum_b (L_b / n_b) / num_seqs``
    ``seq-mean-token-sum-norm`` ``sum_b (L_b / loss_scale_factor) / num_seqs``
                                (``loss_scale_factor`` default ``K``; Dr. GRPO)
    ==========================  =================================================================

    Each mode reads only its own count and ignores the others, so an algorithm can pass both
    ``num_tokens`` and ``num_seqs`` whatever the mode. Sequences without any valid token (padding
    rows) add nothing and are not counted. Denominators are at least 1: an all-padding input
    gives 0, not NaN. Masked-out entries are selected away, so NaN there cannot leak into the
    value (keep them finite if they carry a gradient: the backward pass of ``0 * NaN`` is NaN).

    Args:
        loss_mat: ``(B, K)`` per-token losses, or ``(B,)`` with one per sample.
        mask: bool of the same shape, True = valid token; None = all valid.
        mode: one of :data:`LossAggMode` (TRL names: :func:`resolve_loss_agg_mode`).
        num_tokens: for ``token-mean``: the valid tokens of the whole minibatch when this call
            sees one micro-batch of it (a number or a 0-d tensor); None = this call's own count.
        num_seqs: for the ``seq-mean-*`` modes: likewise, the sequences with at least one valid
            token in the whole minibatch.
        loss_scale_factor: for ``seq-mean-token-sum-norm``: the constant length each sequence's
            token sum is divided by. Default ``K``, the padded length of *this* input; set it to
            the max response length so it stays the same across micro-batches and steps.

    Returns:
        A 0-d tensor that carries the gradient of ``loss_mat``.

    Raises:
        ValueError: on a wrong shape, a non-bool mask or a negative count.
        UserError: on an unknown ``mode`` (with the closest names and the TRL mapping).
    """
    return _aggregate(
        "agg_loss", "loss_mat", loss_mat, mask, mode, num_tokens, num_seqs, loss_scale_factor
    )


def agg_entropy(
    entropy: torch.Tensor,
    mask: torch.Tensor | None,
    mode: LossAggMode | str,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    loss_scale_factor: Count | None = None,
) -> torch.Tensor:
    """Aggregate per-token entropy like the policy loss (for a bonus ``- entropy_coeff * H``).

    The same modes and denominators as :func:`agg_loss`, so that an entropy bonus summed over
    micro-batches equals the whole minibatch's (veRL aggregates entropy with
    ``loss_agg_mode`` too).

    Args:
        entropy: ``(B, K)`` per-token entropy of the action/token distribution, or ``(B,)``.
        mask, mode, num_tokens, num_seqs, loss_scale_factor: see :func:`agg_loss`.
    """
    return _aggregate(
        "agg_entropy", "entropy", entropy, mask, mode, num_tokens, num_seqs, loss_scale_factor
    )


def loss_agg_counts(mask: torch.Tensor) -> LossAggCounts:
    """The denominators :func:`agg_loss` would use for this mask, to pass for its micro-batches.

    Counts add up: the counts of a minibatch are the sums of its micro-batches' counts.

    Args:
        mask: ``(B, K)`` or ``(B,)`` bool, True = valid token.
    """
    fn = "loss_agg_counts"
    mask = check_tensor(fn, "mask", mask)
    if mask.ndim not in (1, 2):
        raise ValueError(f"{fn}: `mask` must have shape (B, K) or (B,), got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{fn}: `mask` must be a bool tensor (True = valid), got {mask.dtype}")
    per_seq = mask if mask.ndim == 1 else mask.any(dim=-1)
    return LossAggCounts(num_tokens=mask.sum(), num_seqs=per_seq.sum())

