"""The processed action-token distribution that both acting and training score.

Only the ``n_bins`` action ids are candidates (RLinf's ``VLALogitsProcessor`` masks the rest,
SimpleVLA-RL slices them out): the logits of those ids are divided by the temperature, all but
the ``top_k`` largest are set to -inf (0: keep all), and a log-softmax gives the distribution.
``act`` samples from it and ``evaluate`` recomputes it for the same tokens, so PPO/GRPO ratios
compare the same processed distribution (the rollout/training mismatch of TRL #3867, verl #3694).
Computed in float32 whatever the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embodied.errors import UserError


@dataclass(frozen=True)
class Sampler:
    """Temperature and top-k over the action-token logits."""

    temperature: float = 1.0
    top_k: int = 0  # 0 or >= n_bins: no top-k

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise UserError(f"policy.kwargs.temperature={self.temperature!r} must be positive (greedy: act deterministically).")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise UserError(f"policy.kwargs.top_k={self.top_k!r} must be a non-negative integer (0: off).")

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Action-token logits (..., n_bins) -> processed log-probabilities (..., n_bins) float32."""
        scaled = logits.float() / self.temperature
        if 0 < self.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, self.top_k, dim=-1).values[..., -1:]  # (..., 1)
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))  # ties at the k-th value are kept, as HF's TopK
        return torch.log_softmax(scaled, dim=-1)

    @staticmethod
    def choose(log_probs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Bins (...) long: sampled from ``log_probs`` (..., n_bins), or its argmax (greedy)."""
        if deterministic:
            return log_probs.argmax(-1)
        flat = log_probs.reshape(-1, log_probs.shape[-1]).exp()
        return torch.multinomial(flat, 1).reshape(log_probs.shape[:-1])


def gather(log_probs: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """Log-probabilities (..., n_bins) at ``bins`` (...) -> (...)."""
    return log_probs.gather(-1, bins.unsqueeze(-1)).squeeze(-1)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy (...) of processed distributions (..., n_bins); bins cut by top-k contribute 0."""
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)
