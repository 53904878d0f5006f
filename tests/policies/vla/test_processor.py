"""Image preprocessing and prompts of OpenVLA, against PIL, hand values and a loop reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from PIL import Image  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

from embodied.errors import UserError  # noqa: E402
from policies.vla.config import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from policies.vla.processor import ImageProcessor, PromptBatch, PromptTokenizer, center_crop  # noqa: E402
from policies.vla.tiny import tiny_config, tiny_tokenizer  # noqa: E402

TOWERS = tiny_config().towers  # DINOv2 + SigLIP at 32 x 32


def frames(batch: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (batch, height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("side", [20, 32, 48, 100])
def test_torch_resize_matches_pil_bicubic(side: int) -> None:
    images = frames(3, side, side)
    torch_levels = ImageProcessor(TOWERS, backend="torch").resize(images)
    pil = np.stack([np.asarray(Image.fromarray(f).resize((32, 32), Image.Resampling.BICUBIC)) for f in images.numpy()])
    pil_levels = torch.from_numpy(pil).permute(0, 3, 1, 2).float()
    assert (torch_levels - pil_levels).abs().max() <= 1.0  # Pillow's fixed-point arithmetic vs float
    torch.testing.assert_close(ImageProcessor(TOWERS, backend="pil").resize(images), pil_levels)


def official_pixels(frame: np.ndarray, size: int) -> torch.Tensor:
    """The official processor's pixel values of one uint8 frame, written out: PIL bicubic resize of
    the uint8 image, ToTensor (/ 255), Normalize per tower, the towers stacked. (6, size, size)"""
    resized = np.asarray(Image.fromarray(frame).resize((size, size), Image.Resampling.BICUBIC))
    unit = torch.from_numpy(resized.copy()).permute(2, 0, 1).float().div(255)
    return torch.cat([(unit - torch.tensor(t.mean).view(3, 1, 1)) / torch.tensor(t.std).view(3, 1, 1) for t in TOWERS])


@pytest.mark.parametrize("height, width", [(48, 64), (64, 48), (100, 37)])
def test_default_preprocessing_is_the_official_pil_path_on_non_square_frames(height: int, width: int) -> None:
    images = frames(2, height, width, seed=3)
    pixels = ImageProcessor(TOWERS)(images)  # the default backend
    expected = torch.stack([official_pixels(f, 32) for f in images.numpy()])
    torch.testing.assert_close(pixels, expected, rtol=0, atol=0)


def test_frames_of_the_model_size_are_not_resampled() -> None:
    images = frames(2, 32, 32)
    for backend in ("torch", "pil"):
        levels = ImageProcessor(TOWERS, backend=backend).resize(images)
        torch.testing.assert_close(levels, images.permute(0, 3, 1, 2).float())


def test_per_tower_normalization_by_hand() -> None:
    image = torch.zeros(1, 32, 32, 3, dtype=torch.uint8)
    image[..., 0], image[..., 1], image[..., 2] = 255, 0, 51  # R = 1.0, G = 0.0, B = 0.2
    pixels = ImageProcessor(TOWERS)(image)
    assert pixels.shape == (1, 6, 32, 32)
    rgb = torch.tensor([1.0, 0.0, 0.2])
    dino = (rgb - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)  # first three channels: DINOv2
    siglip = (rgb - 0.5) / 0.5  # last three: SigLIP
    torch.testing.assert_close(pixels[0, :, 0, 0], torch.cat([dino, siglip]))


def tf_crop_and_resize(image: np.ndarray, area: float) -> np.ndarray:
    """TensorFlow's crop_and_resize of the centered box and its float -> uint8 conversion, by loops.
    image: (S, S) floats in [0, 1]."""
    size = image.shape[0]
    side = math.sqrt(area)
    y1 = (1 - side) / 2
    out = np.zeros_like(image)
    for i in range(size):
        for j in range(size):
            y = y1 * (size - 1) + i * side * (size - 1) / (size - 1)
            x = y1 * (size - 1) + j * side * (size - 1) / (size - 1)
            y0, x0 = int(math.floor(y)), int(math.floor(x))
            y1i, x1i = min(y0 + 1, size - 1), min(x0 + 1, size - 1)
            dy, dx = y - y0, x - x0
            top = image[y0, x0] * (1 - dx) + image[y0, x1i] * dx
            bottom = image[y1i, x0] * (1 - dx) + image[y1i, x1i] * dx
            out[i, j] = top * (1 - dy) + bottom * dy
    return np.floor(np.clip(out, 0, 1) * 255.5)


def test_center_crop_is_tensorflow_crop_and_resize() -> None:
    image = frames(1, 16, 16)[0, :, :, 0].numpy().astype(np.float64) / 255.0
    expected = tf_crop_and_resize(image, 0.9)
    got = center_crop(torch.from_numpy(image * 255.0).float()[None, None], 0.9)[0, 0]
    np.testing.assert_allclose(got.numpy(), expected, atol=1.0)  # float32 vs float64 at a rounding edge
    assert (got.numpy() != expected).mean() < 0.02
    # cropping changes the image; the processor applies it when asked
    images = frames(2, 32, 32)
    assert not torch.equal(ImageProcessor(TOWERS, center_crop=True)(images), ImageProcessor(TOWERS)(images))


def test_processor_rejects_non_uint8_frames() -> None:
    with pytest.raises(ValueError, match="uint8 frames"):
        ImageProcessor(TOWERS)(torch.zeros(1, 32, 32, 3))


# -- prompts -----------------------------------------------------------------------------------------


def test_prompt_tokens_follow_openvla_by_hand() -> None:
    tokenizer = tiny_tokenizer(512)
    prompts = PromptTokenizer(tokenizer, bos_id=1, pad_id=512)
    assert prompts.space_id == tokenizer.token_to_id("\u2581")
    words = ["<s>", "\u2581In", ":", "\u2581What", "\u2581action", "\u2581should", "\u2581the", "\u2581robot", "\u2581take",
             "\u2581to", "\u2581pick", "\u2581up", "\u2581the", "\u2581red", "\u2581cube", "?", "\n", "Out", ":", "\u2581"]
    expected = [tokenizer.token_to_id(w) for w in words]
    assert prompts.token_ids("Pick up the RED cube") == expected  # lowercased, trailing space token appended
    assert prompts.prompt("Pick up") == "In: What action should the robot take to pick up?\nOut:"


def test_prompt_batch_is_left_padded_after_bos() -> None:
    batch = PromptBatch.from_token_lists([[1, 5, 6, 7], [1, 8]], pad_id=99)
    assert batch.bos.tolist() == [[1], [1]]
    assert batch.ids.tolist() == [[5, 6, 7], [99, 99, 8]]
    assert batch.mask.tolist() == [[True, True, True], [False, False, True]]


def test_a_tokenizer_without_the_trailing_space_token_is_refused() -> None:
    words = ["<unk>", "<s>", "In", ":", "What", "action", "should", "the", "robot", "take", "to", "Out", "?"]
    plain = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    plain.pre_tokenizer = pre_tokenizers.Whitespace()  # drops the space: "Out: " == "Out:"
    with pytest.raises(UserError, match="space token"):
        PromptTokenizer(plain, bos_id=1, pad_id=13)
