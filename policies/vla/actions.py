"""OpenVLA's action tokens and the BOUNDS_Q99 action normalization.

**Tokens** (``prismatic/vla/action_tokenizer.py``, ``predict_action``). With V the text vocabulary
(``text_config.vocab_size - pad_to_multiple_of``, 32000 for openvla-7b) and 256 bins:

* ``bins = linspace(-1, 1, 256)``, ``centers = (bins[:-1] + bins[1:]) / 2`` (255 centers);
* encode: ``id = V - digitize(clip(a, -1, 1), bins)``, always in ``[V - 256, V)``;
* decode: ``center[clip(V - id - 1, 0, 254)]``: ids ``V - 256`` and ``V - 255`` both give center 254.

A normalized action in [-1, 1] survives encode/decode within half a bin (1 / 255).

**Normalization** (BOUNDS_Q99, per dimension where ``mask`` is True):
``normalize(x) = clip(2 (x - q01) / (q99 - q01 + 1e-8) - 1, -1, 1)``;
``unnormalize(a) = 0.5 (a + 1) (q99 - q01 + eps) + q01``, with eps = 0 in OpenVLA and 1e-8 in
OpenVLA-OFT. Dimensions where ``mask`` is False (the gripper) pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from embodied.errors import UserError, did_you_mean


class ActionTokenizer:
    """Normalized actions in [-1, 1] <-> token ids of the last ``n_bins`` text-vocabulary ids."""

    def __init__(self, vocab_size: int, n_bins: int = 256) -> None:
        if n_bins < 2 or vocab_size < n_bins:
            raise ValueError(f"n_bins={n_bins} must be >= 2 and fit in the vocabulary of {vocab_size}")
        self.vocab_size = int(vocab_size)  # V
        self.n_bins = int(n_bins)
        self.bins = torch.from_numpy(np.linspace(-1.0, 1.0, n_bins))  # numpy's, bit for bit
        self.centers = (self.bins[:-1] + self.bins[1:]) / 2.0  # (n_bins - 1,)

    @property
    def first_id(self) -> int:
        """The smallest action token id (V - n_bins; 31744 for openvla-7b)."""
        return self.vocab_size - self.n_bins

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalized actions (...) float -> token ids (...) long in [V - n_bins, V)."""
        clipped = actions.detach().to(torch.float64).clamp(-1.0, 1.0)
        digitized = torch.bucketize(clipped, self.bins.to(clipped.device), right=True)  # == np.digitize
        return self.vocab_size - digitized

    def decode(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids (...) long -> bin centers (...) float64 (any id is clipped onto a center)."""
        index = (self.vocab_size - token_ids.long() - 1).clamp(0, self.n_bins - 2)
        return self.centers.to(token_ids.device)[index]

    def to_bin(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> positions in the action-token slice of the vocabulary (0 .. n_bins - 1)."""
        return token_ids.long() - self.first_id

    def from_bin(self, bins: torch.Tensor) -> torch.Tensor:
        """Positions in the action-token slice (0 .. n_bins - 1) -> token ids."""
        return bins.long() + self.first_id


class BoundsQ99:
    """BOUNDS_Q99 (un)normalization of one dataset's actions or proprio, per dimension."""

    def __init__(self, q01: Any, q99: Any, mask: Any = None, eps: float = 0.0) -> None:
        self.q01 = torch.as_tensor(np.asarray(q01, dtype=np.float64))
        self.q99 = torch.as_tensor(np.asarray(q99, dtype=np.float64))
        if self.q01.ndim != 1 or self.q01.shape != self.q99.shape:
            raise UserError(f"q01 {tuple(self.q01.shape)} and q99 {tuple(self.q99.shape)} must be vectors of one length.")
        self.mask = (
            torch.ones_like(self.q01, dtype=torch.bool) if mask is None else torch.as_tensor(np.asarray(mask, dtype=bool))
        )
        if self.mask.shape != self.q01.shape:
            raise UserError(f"mask {tuple(self.mask.shape)} must match q01 {tuple(self.q01.shape)}.")
        self.eps = float(eps)

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], eps: float = 0.0, where: str = "statistics") -> BoundsQ99:
        missing = [k for k in ("q01", "q99") if k not in stats]
        if missing:
            raise UserError(f"{where} lack {missing}; BOUNDS_Q99 normalization needs q01 and q99.")
        return cls(stats["q01"], stats["q99"], stats.get("mask"), eps)

    @property
    def dim(self) -> int:
        return int(self.q01.shape[0])

    def unnormalize(self, normalized: torch.Tensor) -> torch.Tensor:
        """(..., D) in [-1, 1] -> (..., D) in dataset units (float64)."""
        q01, q99, mask = (t.to(normalized.device) for t in (self.q01, self.q99, self.mask))
        a = normalized.to(torch.float64)
        return torch.where(mask, 0.5 * (a + 1.0) * (q99 - q01 + self.eps) + q01, a)

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """(..., D) in dataset units -> (..., D) in [-1, 1] (masked dimensions pass through),
        as OpenVLA's training data pipeline does."""
        q01, q99, mask = (t.to(values.device) for t in (self.q01, self.q99, self.mask))
        x = values.to(torch.float64)
        return torch.where(mask, (2.0 * (x - q01) / (q99 - q01 + 1e-8) - 1.0).clamp(-1.0, 1.0), x)

    def normalize_proprio(self, values: torch.Tensor) -> torch.Tensor:
        """OFT's ``normalize_proprio``: like :meth:`normalize`, but every dimension is clipped to
        [-1, 1] (the clip is outside the mask there)."""
        q01, q99, mask = (t.to(values.device) for t in (self.q01, self.q99, self.mask))
        x = values.to(torch.float64)
        return torch.where(mask, 2.0 * (x - q01) / (q99 - q01 + 1e-8) - 1.0, x).clamp(-1.0, 1.0)


def select_stats(norm_stats: Mapping[str, Any], unnorm_key: str | None) -> tuple[str, Mapping[str, Any]]:
    """The dataset statistics ``unnorm_key`` names (the only dataset when None) and its key."""
    if not norm_stats:
        raise UserError(
            "the checkpoint has no dataset statistics (config.json norm_stats or dataset_statistics.json); "
            "OpenVLA unnormalizes actions with them."
        )
    if unnorm_key is None:
        if len(norm_stats) != 1:
            raise UserError(
                f"the checkpoint was trained on {len(norm_stats)} datasets; set policy.kwargs.unnorm_key to the one whose "
                f"action statistics to use: {', '.join(sorted(norm_stats))}."
            )
        unnorm_key = next(iter(norm_stats))
    if unnorm_key not in norm_stats:
        raise UserError(
            f"policy.kwargs.unnorm_key={unnorm_key!r} is not in the checkpoint's statistics."
            f"{did_you_mean(unnorm_key, norm_stats)} Available: {', '.join(sorted(norm_stats))}."
        )
    return unnorm_key, norm_stats[unnorm_key]
