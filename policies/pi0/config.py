"""Sizes and options of a π0 / π0.5 model (openpi's ``Pi0Config``, LeRobot's ``PI0Config``/``PI05Config``).

The model is PaliGemma (a SigLIP vision tower, a linear projector, a Gemma language model: the
prefix) and an action expert, a second, smaller Gemma whose layers attend jointly with the
prefix's, layer by layer (their head count and head width must agree). ``pi05`` switches the
three π0.5 differences on in the same model: the time enters the expert through adaRMS norms
(``time_mlp_in/out``) instead of an action+time MLP (``action_time_mlp_in/out``), there is no
state token (``state_proj``): the state goes into the prompt as 256-bin discrete tokens, and
statistics are quantiles (q01/q99) rather than mean/std.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from embodied.errors import UserError


@dataclass(frozen=True)
class GemmaSize:
    """One Gemma stack: width (hidden size), depth (layers), MLP width, heads, KV heads, head width."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


#: openpi's ``gemma.get_config`` variants (LeRobot's ``paligemma_variant`` / ``action_expert_variant``).
GEMMA_VARIANTS: dict[str, GemmaSize] = {
    "gemma_2b": GemmaSize(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    # The tiny models' (CPU tests): the same layout, a few thousand parameters.
    "gemma_tiny": GemmaSize(width=32, depth=2, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16),
    "gemma_tiny_expert": GemmaSize(width=16, depth=2, mlp_dim=32, num_heads=2, num_kv_heads=1, head_dim=16),
}


@dataclass(frozen=True)
class SiglipSize:
    """The vision tower: So400m/14 at 224 px in the release (``intermediate_size`` 4304)."""

    width: int = 1152
    depth: int = 27
    mlp_dim: int = 4304
    num_heads: int = 16
    image_size: int = 224
    patch_size: int = 14


@dataclass(frozen=True)
class Pi0Config:
    """Everything that fixes the model's tensors and its flow schedule."""

    pi05: bool = False
    vision: SiglipSize = field(default_factory=SiglipSize)
    vlm: GemmaSize = GEMMA_VARIANTS["gemma_2b"]
    expert: GemmaSize = GEMMA_VARIANTS["gemma_300m"]
    vocab_size: int = 257152
    """PaliGemma's vocabulary (the image token is id 257152, past the end: never embedded)."""
    chunk_size: int = 50
    """H, the action horizon the expert denoises (``chunk_size`` / openpi ``action_horizon``)."""
    max_action_dim: int = 32
    """D, the padded action width (env actions are the first A dims)."""
    max_state_dim: int = 32
    num_inference_steps: int = 10
    """N Euler steps per chunk (openpi ``num_steps``)."""
    min_period: float = 4e-3
    max_period: float = 4.0
    """Periods of the sine-cosine time embedding."""
    tokenizer_max_length: int = 48
    """Prompt tokens (48 for π0, 200 for π0.5), padded on the right."""
    rms_norm_eps: float = 1e-6
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if (self.vlm.num_heads, self.vlm.head_dim) != (self.expert.num_heads, self.expert.head_dim) or \
                self.vlm.num_kv_heads != self.expert.num_kv_heads or self.vlm.depth != self.expert.depth:
            raise UserError(
                f"π0's prefix and action expert share attention layer by layer: they need the same depth, heads, KV heads "
                f"and head width; got {self.vlm} and {self.expert}."
            )

    @property
    def num_image_tokens(self) -> int:
        return (self.vision.image_size // self.vision.patch_size) ** 2

    def with_overrides(self, overrides: dict[str, Any]) -> Pi0Config:
        """A copy with top-level fields replaced and ``vision``/``vlm``/``expert`` given as mappings."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise UserError(f"π0 config keys {unknown} are not understood; allowed: {', '.join(sorted(names))}.")
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            current = getattr(self, key)
            if isinstance(current, (GemmaSize, SiglipSize)):
                if isinstance(value, str) and isinstance(current, GemmaSize):
                    value = gemma_variant(value)
                elif isinstance(value, dict):
                    allowed = {f.name for f in fields(current)}
                    bad = sorted(set(value) - allowed)
                    if bad:
                        raise UserError(f"π0 config {key}.{bad[0]} is not understood; allowed: {', '.join(sorted(allowed))}.")
                    value = replace(current, **value)
            changes[key] = value
        return replace(self, **changes)


def gemma_variant(name: str) -> GemmaSize:
    if name.endswith("_lora"):  # openpi's LoRA variants have the base variant's sizes
        name = name[: -len("_lora")]
    if name not in GEMMA_VARIANTS:
        raise UserError(f"Gemma variant {name!r} is not known; known: {', '.join(GEMMA_VARIANTS)}.")
    return GEMMA_VARIANTS[name]

