"""Inputs of OpenVLA: camera frames -> pixel values, instructions -> prompt token ids.

**Images** (``processing_prismatic.py`` with ``resize-naive``; the eval-time crop of
``experiments/robot/openvla_utils.py``): uint8 frames (B, H, W, 3) are resized to the backbone's
S x S with bicubic interpolation. The default is the official path itself: PIL's
``Image.resize(BICUBIC)`` on the uint8 frame (what torchvision's ``Resize`` does on the PIL image
the official processor receives), so the pixel values are the official ones bit for bit. The
``torch`` backend (``torch.nn.functional.interpolate(bicubic, antialias=True)``, the same kernel in
two separable passes rounded to uint8 levels like Pillow's) runs on the frames' device and stays
within one level of PIL (float against Pillow's fixed-point arithmetic), a few values per frame,
enough to move the logits in the second decimal; optionally center-cropped to 0.9 of the area and resized back to S x S
(TensorFlow's ``crop_and_resize``: bilinear, corner-aligned sampling, then TF's float -> uint8
conversion); scaled to [0, 1] and normalized per tower (DINOv2: ImageNet mean/std, SigLIP: 0.5/0.5).
A fused backbone gets both normalizations stacked: 6 channels.

**Prompts**: ``"In: What action should the robot take to {instruction.lower()}?\\nOut:"``,
tokenized with BOS first; the tokenizer's trailing-space token (Llama's 29871, "▁") is appended
when the prompt does not end with it, as ``predict_action`` does ("to match the inputs seen at
training time", whose prompts end in "Out: "). Its id is derived from the tokenizer, never assumed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.nn import functional as F

from embodied.errors import UserError
from policies.vla.config import VisionTowerConfig

PROMPT_TEMPLATE = "In: What action should the robot take to {instruction}?\nOut:"
#: Fraction of the image area OpenVLA-OFT's (and RLinf's) evaluation center crop keeps.
CROP_AREA = 0.9
#: Resize backends: "pil", the official processor's resize (the default), and "torch" (see above).
IMAGE_BACKENDS = ("pil", "torch")


class ImageProcessor:
    """uint8 frames (B, H, W, 3) -> pixel values (B, 3 * towers, S, S) float32."""

    def __init__(self, towers: Sequence[VisionTowerConfig], center_crop: bool = False, backend: str = "pil") -> None:
        if backend not in IMAGE_BACKENDS:
            raise UserError(f"image backend {backend!r} is not one of {', '.join(IMAGE_BACKENDS)}.")
        self.size = towers[0].image_size
        self.center_crop = center_crop
        self.backend = backend
        self.mean = torch.tensor([t.mean for t in towers], dtype=torch.float32)  # (towers, 3)
        self.std = torch.tensor([t.std for t in towers], dtype=torch.float32)

    def __call__(self, frames: torch.Tensor | np.ndarray) -> torch.Tensor:
        frames = torch.as_tensor(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
            raise ValueError(f"expected uint8 frames (B, H, W, 3), got {frames.dtype} {tuple(frames.shape)}")
        levels = self.resize(frames)  # (B, 3, S, S) float in uint8 levels [0, 255]
        if self.center_crop:
            levels = center_crop(levels)
        unit = levels / 255.0
        mean, std = self.mean.to(unit.device), self.std.to(unit.device)
        stacked = [(unit - m.view(1, 3, 1, 1)) / s.view(1, 3, 1, 1) for m, s in zip(mean, std)]
        return torch.cat(stacked, dim=1)  # (B, 3 * towers, S, S)

    def resize(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> (B, 3, S, S) float holding integer levels in [0, 255]."""
        size = self.size
        if self.backend == "pil":
            from PIL import Image

            resized = [
                np.asarray(Image.fromarray(frame).resize((size, size), Image.Resampling.BICUBIC))
                for frame in frames.cpu().numpy()
            ]
            return torch.from_numpy(np.stack(resized)).to(frames.device).permute(0, 3, 1, 2).float()
        x = frames.permute(0, 3, 1, 2).float()  # (B, 3, H, W)
        # Two separable passes rounded to uint8 levels in between, horizontal first, as Pillow's
        # resampler does (its clipped uint8 intermediate matters on high-frequency content).
        if x.shape[-1] != size:
            x = _bicubic(x, (x.shape[-2], size))
        if x.shape[-2] != size:
            x = _bicubic(x, (size, size))
        return x


def _bicubic(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Antialiased bicubic resize (Pillow's kernel, a = -0.5) rounded to uint8 levels."""
    resized = F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
    return resized.round().clamp(0.0, 255.0)


def center_crop(levels: torch.Tensor, area: float = CROP_AREA) -> torch.Tensor:
    """TensorFlow ``crop_and_resize`` of the centered box covering ``area`` of the image, back to
    the same size, then TF's float -> uint8 conversion (``trunc(v * 255.5)`` of v in [0, 1]).

    levels: (B, C, S, S) float in [0, 255]. Output sample i of a side reads input coordinate
    ``y1 (S - 1) + i (y2 - y1) (S - 1) / (S - 1)`` bilinearly, the corner-aligned convention of
    ``grid_sample(align_corners=True)``.
    """
    side = math.sqrt(area)
    start = (1.0 - side) / 2.0
    size = levels.shape[-1]
    steps = start + torch.arange(size, dtype=torch.float64) * (side / (size - 1))  # in [0, 1] of the image
    coords = (2.0 * steps - 1.0).to(levels.dtype).to(levels.device)  # grid_sample's [-1, 1]
    grid_y, grid_x = torch.meshgrid(coords, coords, indexing="ij")
    grid = torch.stack([grid_x, grid_y], dim=-1).expand(levels.shape[0], size, size, 2)
    cropped = F.grid_sample(levels / 255.0, grid, mode="bilinear", align_corners=True)
    return torch.floor(cropped.clamp(0.0, 1.0) * 255.5).clamp(max=255.0)


@dataclass
class PromptBatch:
    """Tokenized prompts of a batch, aligned on their last token.

    bos:  (B, 1) long, the BOS id of every prompt;
    ids:  (B, L) long, the prompt after BOS, left-padded with the pad id, each ending with the
          trailing-space token;
    mask: (B, L) bool, True on real tokens.
    """

    bos: torch.Tensor
    ids: torch.Tensor
    mask: torch.Tensor

    def to(self, device: torch.device | str) -> PromptBatch:
        return PromptBatch(self.bos.to(device), self.ids.to(device), self.mask.to(device))

    @staticmethod
    def from_token_lists(token_lists: Sequence[Sequence[int]], pad_id: int) -> PromptBatch:
        """From per-prompt id lists that start with BOS."""
        length = max(len(t) - 1 for t in token_lists)
        ids = torch.full((len(token_lists), length), pad_id, dtype=torch.long)
        mask = torch.zeros(len(token_lists), length, dtype=torch.bool)
        for row, tokens in enumerate(token_lists):
            rest = torch.as_tensor(list(tokens[1:]), dtype=torch.long)
            ids[row, length - len(rest) :] = rest
            mask[row, length - len(rest) :] = True
        bos = torch.as_tensor([[t[0]] for t in token_lists], dtype=torch.long)
        return PromptBatch(bos, ids, mask)


class PromptTokenizer:
    """Instructions -> :class:`PromptBatch` with OpenVLA's prompt (encodings are cached)."""

    def __init__(self, tokenizer: Tokenizer, bos_id: int, pad_id: int, template: str = PROMPT_TEMPLATE) -> None:
        self.tokenizer = tokenizer
        self.bos_id = int(bos_id)
        self.pad_id = int(pad_id)
        self.template = template
        self.space_id = self._trailing_space_id()
        self._cache: dict[str, list[int]] = {}

    def prompt(self, instruction: str) -> str:
        return self.template.format(instruction=instruction.lower())

    def token_ids(self, instruction: str) -> list[int]:
        """BOS, the prompt's tokens, the trailing-space token."""
        cached = self._cache.get(instruction)
        if cached is None:
            cached = self._encode(self.prompt(instruction))
            if cached[-1] != self.space_id:
                cached = cached + [self.space_id]
            self._cache[instruction] = cached
        return cached

    def __call__(self, instructions: Sequence[str]) -> PromptBatch:
        return PromptBatch.from_token_lists([self.token_ids(str(text)) for text in instructions], self.pad_id)

    def _encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=True).ids
        return ids if ids and ids[0] == self.bos_id else [self.bos_id] + ids

    def _trailing_space_id(self) -> int:
        """The token a trailing space adds after "Out:" (Llama-2: 29871); it must be one token of its own."""
        prompt = self.prompt("pick up the object")
        plain, spaced = self._encode(prompt), self._encode(prompt + " ")
        if len(spaced) != len(plain) + 1 or spaced[:-1] != plain:
            raise UserError(
                "the tokenizer does not tokenize OpenVLA's prompt ending in 'Out: ' as the prompt ending in 'Out:' plus one "
                "space token (Llama-2's 29871), which is what OpenVLA was trained on (openvla#104); use the checkpoint's own "
                "tokenizer.json."
            )
        space_id = spaced[-1]
        vocab_space = self.tokenizer.token_to_id("\u2581")
        if vocab_space is not None and vocab_space != space_id:
            raise UserError(
                f"the tokenizer ends 'Out: ' with token {space_id}, not with its '\u2581' token {vocab_space}; OpenVLA's "
                "prompts end with the lone '\u2581' token."
            )
        return space_id


def load_tokenizer(path: str | Path) -> Tokenizer:
    """``tokenizer.json`` of a checkpoint directory through the ``tokenizers`` library."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise UserError(f"{path} has no tokenizer.json (the fast tokenizer file of the checkpoint's Llama tokenizer).")
    return Tokenizer.from_file(str(file))
