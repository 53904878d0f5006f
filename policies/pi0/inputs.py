"""What π0 reads and writes: images, prompts, the state and normalized actions (openpi's transforms).

* Images (B, H, W, 3) uint8 -> (B, 3, S, S) float in [-1, 1], resized with padding to S
  (openpi ``resize_with_pad``: aspect kept, black bars).
* Prompts: ``<bos>`` + the instruction (stripped, ``_`` and newlines as spaces) + ``"\\n"`` (π0),
  or ``"Task: {instruction}, State: {256-bin state};\\nAction: "`` (π0.5), padded on the right to
  ``tokenizer_max_length`` with a mask (truncated beyond it).
* Statistics: π0 normalizes state and actions with mean/std, π0.5 with the 1st/99th percentiles
  (``use_quantile_norm``), both with openpi's 1e-6 in the denominator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from embodied.errors import UserError

#: openpi's denominator guard in both normalizations.
NORM_EPS = 1e-6
#: π0.5's discrete state: 256 bins over [-1, 1].
STATE_BINS = 256


def images_to_model(frames: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, size, size) float32 in [-1, 1], resized with black padding."""
    x = frames.float().permute(0, 3, 1, 2) / 255.0  # (B, 3, H, W) in [0, 1]
    height, width = x.shape[-2:]
    if (height, width) != (size, size):
        scale = min(size / height, size / width)
        new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
        x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True).clamp(0, 1)
        top, left = (size - new_h) // 2, (size - new_w) // 2
        x = F.pad(x, (left, size - new_w - left, top, size - new_h - top), value=0.0)
    return x * 2.0 - 1.0


class TextTokenizer(Protocol):
    bos_id: int

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """The tiny models' tokenizer: ``<bos>`` = 2 (PaliGemma's) and each UTF-8 byte folded into
    ids 3..vocab-1. Deterministic, no files."""

    bos_id = 2

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 4:
            raise ValueError(f"ByteTokenizer needs a vocabulary of at least 4 ids, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [3 + b % (self.vocab_size - 3) for b in text.encode()]


class FileTokenizer:
    """PaliGemma's tokenizer from a ``tokenizer.json`` (``tokenizers``), ``<bos>`` looked up by name."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))
        bos = self.tokenizer.token_to_id("<bos>")
        if bos is None:
            raise UserError(f"{path} has no '<bos>' token: is it PaliGemma's tokenizer?")
        self.bos_id = int(bos)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)


def clean_instruction(text: str) -> str:
    return text.strip().replace("_", " ").replace("\n", " ")


def discretize_state(state: torch.Tensor) -> np.ndarray:
    """Normalized state (B, Ds) -> bin indices (B, Ds) in 0..255 (``np.digitize`` over 256 bins of [-1, 1])."""
    edges = np.linspace(-1, 1, STATE_BINS + 1)[:-1]
    return np.digitize(state.detach().float().cpu().numpy(), bins=edges) - 1


def prompt_texts(instructions: Sequence[str], state: torch.Tensor | None, pi05: bool) -> list[str]:
    """The text each sample's prompt encodes (after ``<bos>``)."""
    cleaned = [clean_instruction(text) for text in instructions]
    if not pi05:
        return [text + "\n" for text in cleaned]
    assert state is not None, "π0.5's prompt carries the state"
    bins = discretize_state(state)
    return [f"Task: {text}, State: {' '.join(str(int(b)) for b in row)};\nAction: " for text, row in zip(cleaned, bins)]


def tokenize(tokenizer: TextTokenizer, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts -> token ids (B, L) long and mask (B, L) bool, ``<bos>`` first, right-padded with 0."""
    ids = torch.zeros(len(texts), max_length, dtype=torch.long)
    mask = torch.zeros(len(texts), max_length, dtype=torch.bool)
    for row, text in enumerate(texts):
        tokens = ([tokenizer.bos_id] + tokenizer.encode(text))[:max_length]
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = True
    return ids, mask


@dataclass
class Normalizer:
    """One key's statistics (D,) and how they apply (``mean_std`` or ``quantile``)."""

    kind: str
    shift: torch.Tensor  # mean or q01
    scale: torch.Tensor  # std or q99 - q01

    @classmethod
    def from_stats(cls, stats: dict[str, Sequence[float]], quantile: bool, where: str) -> Normalizer:
        need = ("q01", "q99") if quantile else ("mean", "std")
        missing = [k for k in need if k not in stats]
        if missing:
            raise UserError(f"{where} lacks {missing} ({'quantile' if quantile else 'mean/std'} normalization); it has {sorted(stats)}.")
        a, b = (torch.as_tensor(np.asarray(stats[k], np.float32)).reshape(-1) for k in need)
        if a.shape != b.shape:
            raise UserError(f"{where}: {need[0]} has {a.numel()} entries and {need[1]} {b.numel()}.")
        return cls("quantile", a, b - a) if quantile else cls("mean_std", a, b)

    @property
    def dim(self) -> int:
        return int(self.shift.numel())

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d) with d <= D in the data's units -> normalized (the first d statistics)."""
        d = x.shape[-1]
        shift, scale = self.shift[:d].to(x.device), self.scale[:d].to(x.device)
        if self.kind == "quantile":
            return (x - shift) / (scale + NORM_EPS) * 2.0 - 1.0
        return (x - shift) / (scale + NORM_EPS)

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        shift, scale = self.shift[:d].to(x.device), self.scale[:d].to(x.device)
        if self.kind == "quantile":
            return (x + 1.0) / 2.0 * (scale + NORM_EPS) + shift
        return x * (scale + NORM_EPS) + shift


def pad_last(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the last axis to ``width`` (openpi ``pad_to_dim``)."""
    if x.shape[-1] > width:
        raise UserError(f"a vector of {x.shape[-1]} entries does not fit the model's {width}.")
    return F.pad(x, (0, width - x.shape[-1]))
