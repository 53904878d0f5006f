"""The sampling distribution of a causal-LM policy, shared by rollout and training.

PPO/GRPO's ratio compares the logprob a token had when it was sampled with its logprob under the
current parameters. Both must come from the **same processed distribution**: logits divided by the
temperature, then top-k, then top-p filtering (transformers' order), then a softmax. A rollout that
samples from the processed distribution while training scores the raw one gives a biased gradient
(trl PR #3029, ms-swift PR #8442). So one :class:`SamplingSettings` builds one list of transformers'
own logits warpers, which ``generate`` applies while sampling and :func:`processed_logprobs`
applies when training recomputes. ``top_k`` is 0 (off) unless set: transformers would otherwise
fill in ``top_k=50``.

Other helpers here: response masks found by the POSITION of the first EOS (any of several EOS ids),
never by comparing with the pad id (pad == eos would mask the EOS), and position ids for
left-padded batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True)
class SamplingSettings:
    """How responses are sampled (and therefore how their logprobs are computed)."""

    temperature: float = 1.0
    """Logits are divided by this before the softmax (> 0)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p; 1.0 keeps all."""

    def warpers(self) -> LogitsProcessorList:
        """transformers' warpers for these settings, in ``generate``'s order (empty for 1.0/0/1.0)."""
        warpers = LogitsProcessorList()
        if self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            warpers.append(TopKLogitsWarper(top_k=self.top_k))
        if self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=self.top_p))
        return warpers


def process_logits(logits: torch.Tensor, warpers: LogitsProcessorList) -> torch.Tensor:
    """Raw logits (..., V) -> processed logits (..., V) in float32 (filtered entries are -inf)."""
    flat = logits.reshape(-1, logits.shape[-1]).float()  # (N, V)
    if len(warpers):
        # The warpers used here ignore the token history; they take it for the interface.
        no_history = torch.zeros(flat.shape[0], 0, dtype=torch.long, device=flat.device)
        flat = warpers(no_history, flat)
    return flat.reshape(logits.shape)


def processed_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, warpers: LogitsProcessorList, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of ``tokens`` (B, K) and entropies (B, K) under the processed distribution.

    logits: (B, K, V) raw next-token logits; tokens: (B, K) long. The entropy of a distribution
    whose filtered entries have probability 0 counts only the kept ones (0 * log 0 = 0).
    """
    log_probs = torch.log_softmax(process_logits(logits, warpers), dim=-1)  # (B, K, V)
    chosen = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, K)
    if not with_entropy:
        return chosen, None
    finite = torch.isfinite(log_probs)
    entropy = -(log_probs.exp() * torch.where(finite, log_probs, 0.0)).sum(-1)  # (B, K)
    return chosen, entropy


class LogprobRecorder(LogitsProcessor):
    """The last logits processor of a ``generate`` call: records the logprob of every sampled token
    under the processed distribution, holding one step's (B, V) log-softmax at a time.

    ``generate`` calls processors with the tokens so far, *before* it samples the next one; so
    step t's log-softmax is read at step t + 1, where the token it produced is the last input, and
    the final step's in :meth:`finish` from the returned sequences. Scores pass through unchanged.
    Memory is O(B * V), where ``output_scores=True`` would keep O(B * K * V).
    """

    def __init__(self) -> None:
        self._pending: torch.Tensor | None = None  # (B, V) log-softmax of the latest step
        self._logprobs: list[torch.Tensor] = []  # K entries of (B,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._take(input_ids[:, -1])
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        assert self._pending is not None
        self._logprobs.append(self._pending.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
        self._pending = None

    def finish(self, response_ids: torch.Tensor) -> torch.Tensor:
        """Logprobs (B, K') of the K' generated tokens ``response_ids`` (B, K')."""
        if self._pending is not None:
            self._take(response_ids[:, -1])
        if len(self._logprobs) != response_ids.shape[1]:
            raise RuntimeError(
                f"recorded {len(self._logprobs)} sampling steps for {response_ids.shape[1]} generated tokens"
            )
        if not self._logprobs:
            return torch.zeros(response_ids.shape[0], 0, device=response_ids.device)
        return torch.stack(self._logprobs, dim=1)


def response_mask(response_ids: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """(B, K) bool: True up to and including the first EOS of each row (all True without one).

    ``eos_ids`` (E,) lists every end-of-sequence id. Found by position: the pad id is never
    looked at, so a pad id equal to an EOS id cannot hide the EOS.
    """
    is_eos = torch.isin(response_ids, eos_ids.to(response_ids.device))  # (B, K)
    eos_before = is_eos.long().cumsum(dim=1) - is_eos.long()  # EOS strictly before each position
    return eos_before == 0


def truncated(response_ids: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the response has no EOS in its K tokens (it hit ``max_new_tokens``)."""
    return ~torch.isin(response_ids, eos_ids.to(response_ids.device)).any(dim=1)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions of a left-padded batch: 0 at each row's first real token, counting real
    tokens; padding gets 0 (as ``generate`` computes them)."""
    positions = attention_mask.long().cumsum(dim=1) - 1
    return positions.clamp(min=0)
