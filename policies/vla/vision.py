"""The vision side of Prismatic/OpenVLA: towers, the (fused) backbone and the projector.

Each tower is a native transformers model built with one block fewer than the checkpoint has:
OpenVLA reads the *second-to-last* block's patch features (timm ``get_intermediate_layers``
with ``n={depth - 2}``, no final norm), so the last block and the final norm are dead weight.
The final norm is replaced by an identity and DINOv2's unused mask token is removed, so every
parameter of the module is used (and every one is loaded from the checkpoint).

Fused backbone (``dinosiglip``): pixel values (N, 6, S, S) are split into 3 + 3 channels, DINOv2
gets the first (ImageNet-normalized), SigLIP the second (normalized to [-1, 1]); the patch
features are concatenated on the feature axis: (N, P, 1024 + 1152).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel, SiglipVisionConfig, SiglipVisionModel

from policies.vla.config import VisionTowerConfig


def build_tower(spec: VisionTowerConfig, attn_implementation: str = "sdpa") -> nn.Module:
    """A native transformers ViT with ``spec.num_layers - 1`` blocks and no final norm."""
    common = dict(
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers - 1,
        num_attention_heads=spec.num_heads,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        hidden_act="gelu",  # timm's nn.GELU (erf); SigLIP's HF default gelu_pytorch_tanh differs
        layer_norm_eps=spec.layer_norm_eps,
        attn_implementation=attn_implementation,
    )
    if spec.family == "dinov2":
        config = Dinov2WithRegistersConfig(
            **common, mlp_ratio=spec.mlp_size // spec.hidden_size, num_register_tokens=spec.num_register_tokens, qkv_bias=True,
            layerscale_value=1e-5, drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )
        tower = Dinov2WithRegistersModel(config)
        tower.layernorm = nn.Identity()
        tower.embeddings.register_parameter("mask_token", None)  # only used with bool_masked_pos
        return tower
    config = SiglipVisionConfig(**common, intermediate_size=spec.mlp_size, vision_use_head=False, attention_dropout=0.0)
    tower = SiglipVisionModel(config)
    tower.post_layernorm = nn.Identity()
    return tower


class PrismaticVisionBackbone(nn.Module):
    """One or two towers: pixel values (N, 3 * towers, S, S) -> patch features (N, P, vision_dim).

    Parameter names: ``featurizer.*`` (first tower), ``fused_featurizer.*`` (second), as in the
    official checkpoint's ``vision_backbone.*`` prefixes.
    """

    def __init__(self, towers: tuple[VisionTowerConfig, ...], attn_implementation: str = "sdpa") -> None:
        super().__init__()
        self.specs = towers
        self.featurizer = build_tower(towers[0], attn_implementation)
        self.fused_featurizer = build_tower(towers[1], attn_implementation) if len(towers) == 2 else None

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        towers = [self.featurizer] + ([self.fused_featurizer] if self.fused_featurizer is not None else [])
        inputs = torch.split(pixel_values, 3, dim=1)  # one (N, 3, S, S) per tower
        if len(inputs) != len(towers):
            raise ValueError(f"pixel values have {pixel_values.shape[1]} channels; {len(towers)} tower(s) need {3 * len(towers)}")
        features = []
        for spec, tower, pixels in zip(self.specs, towers, inputs):
            hidden = tower(pixel_values=pixels).last_hidden_state  # (N, prefix + P, D): output of block depth - 2
            features.append(hidden[:, spec.num_prefix_tokens :])  # (N, P, D)
        return torch.cat(features, dim=2)  # (N, P, vision_dim)


class PrismaticProjector(nn.Module):
    """Patch features -> LLM embeddings.

    Fused: ``fc1`` (vision_dim -> 4 * vision_dim), GELU, ``fc2`` (-> llm_dim), GELU, ``fc3``
    (llm_dim -> llm_dim); single tower: ``fc1`` (vision_dim -> llm_dim), GELU, ``fc2``.
    """

    def __init__(self, fused: bool, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
            self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
            self.fc3 = nn.Linear(llm_dim, llm_dim)
        else:
            self.fc1 = nn.Linear(vision_dim, llm_dim)
            self.fc2 = nn.Linear(llm_dim, llm_dim)
            self.fc3 = None
        self.act = nn.GELU()

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = self.fc2(self.act(self.fc1(patches)))  # (..., llm_dim)
        return self.fc3(self.act(x)) if self.fc3 is not None else x
