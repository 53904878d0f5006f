"""What a checkpoint's ``config.json`` says, parsed into typed specs (OpenVLA's ``OpenVLAConfig``).

The official config names the vision backbone by a Prismatic id (``dinosiglip-vit-so-224px``)
that stands for one or two timm ViTs; :data:`BACKBONES` spells out each tower's dimensions and
its image normalization (timm's pretrained cfgs). ``text_config`` is a ``LlamaConfig`` diff,
copied verbatim (Llama-2's own ``rms_norm_eps`` is 1e-5, the HF export runs with the default
1e-6: the file wins).

A checkpoint whose towers are not of released sizes names an id of the same family
(``dinosiglip-*``, ``siglip-*``, ``dinov2-*``) and the loader reads the sizes from its tensors
(``policies.vla.sizes``); a released id's sizes are checked against them. ``embodied_vision_towers``
(never in official files) may give the towers' fields outright, all of them or, beside the tensors,
some (a head count, which no tensor shape holds); tiny checkpoints (``policies.vla.tiny``) write it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import LlamaConfig

from embodied.errors import UserError, did_you_mean

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)
#: Key under which a tiny checkpoint's config.json lists its towers (never in official files).
TOWERS_KEY = "embodied_vision_towers"
#: Vision tower families: DINOv2 with registers (class + register tokens, layer scale) and SigLIP.
FAMILIES = ("dinov2", "siglip")


@dataclass(frozen=True)
class VisionTowerConfig:
    """One timm ViT of the vision backbone, as it is in the checkpoint.

    ``num_layers`` counts every block stored in the checkpoint; OpenVLA reads the output of the
    second-to-last one, so the model builds ``num_layers - 1`` blocks and the loader drops the last.
    """

    family: str  # "dinov2" or "siglip"
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_size: int
    image_size: int  # pixels per side of the (square) input
    patch_size: int
    num_register_tokens: int = 0  # DINOv2 only
    mean: tuple[float, float, float] = INCEPTION_MEAN
    std: tuple[float, float, float] = INCEPTION_STD
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise UserError(f"vision tower family {self.family!r} is not supported; supported: {', '.join(FAMILIES)}.")
        for name in ("hidden_size", "num_heads", "mlp_size", "image_size", "patch_size"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"vision tower {name}={getattr(self, name)!r} must be a positive integer.")
        if self.num_layers < 2:
            raise UserError(
                f"a vision tower needs at least 2 blocks (OpenVLA reads the second-to-last); got num_layers={self.num_layers}."
            )
        if self.hidden_size % self.num_heads:
            raise UserError(f"vision tower num_heads={self.num_heads} must divide hidden_size={self.hidden_size}.")
        if self.image_size < self.patch_size:
            raise UserError(f"vision tower patch_size={self.patch_size} exceeds image_size={self.image_size}.")
        if self.family == "dinov2" and self.mlp_size % self.hidden_size:
            raise UserError(
                f"a DINOv2 tower's mlp_size={self.mlp_size} must be a multiple of hidden_size={self.hidden_size} "
                "(transformers' Dinov2WithRegistersConfig has an integer mlp_ratio)."
            )
        if self.family == "siglip" and self.num_register_tokens:
            raise UserError("SigLIP towers have no register tokens.")

    @property
    def num_patches(self) -> int:
        """Patches per image: the patch convolution drops trailing pixels (384 / 14 -> 27 x 27)."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches in the tower's output: CLS + registers (DINOv2), none (SigLIP)."""
        return 1 + self.num_register_tokens if self.family == "dinov2" else 0


def _dinov2_large(image_size: int) -> VisionTowerConfig:  # timm vit_large_patch14_reg4_dinov2.lvd142m
    return VisionTowerConfig("dinov2", 1024, 24, 16, 4096, image_size, 14, 4, IMAGENET_MEAN, IMAGENET_STD)


def _siglip_so400m(image_size: int) -> VisionTowerConfig:  # timm vit_so400m_patch14_siglip_{224,384}
    return VisionTowerConfig("siglip", 1152, 27, 16, 4304, image_size, 14, 0, INCEPTION_MEAN, INCEPTION_STD)


#: Prismatic vision backbone ids this package builds (``configuration_prismatic.py``); the CLIP
#: and IN1k variants need towers transformers has no native class of the same semantics for.
BACKBONES: dict[str, tuple[VisionTowerConfig, ...]] = {
    "dinosiglip-vit-so-224px": (_dinov2_large(224), _siglip_so400m(224)),
    "dinosiglip-vit-so-384px": (_dinov2_large(384), _siglip_so400m(384)),
    "siglip-vit-so400m": (_siglip_so400m(224),),
    "siglip-vit-so400m-384px": (_siglip_so400m(384),),
    "dinov2-vit-l": (_dinov2_large(224),),
}
#: Image resize strategies the preprocessing implements.
RESIZE_STRATEGIES = ("resize-naive",)
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class VLAConfig:
    """The parsed ``config.json`` of an OpenVLA checkpoint.

    ``vocab_size`` (the text vocabulary, whose last ``n_action_bins`` ids are the action tokens)
    is ``text_config.vocab_size - pad_to_multiple_of``: 32064 - 64 = 32000 for openvla-7b.
    """

    vision_backbone_id: str
    towers: tuple[VisionTowerConfig, ...]
    text_config: dict[str, Any]
    pad_token_id: int = 32000
    pad_to_multiple_of: int = 64
    n_action_bins: int = 256
    image_resize_strategy: str = "resize-naive"
    llm_backbone_id: str = "llama2-7b-pure"
    dtype: str = "float32"
    norm_stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.towers) not in (1, 2):
            raise UserError(f"Prismatic models have one or two (fused) vision towers, not {len(self.towers)}.")
        sizes = {t.image_size for t in self.towers}
        if len(sizes) != 1:
            raise UserError(f"fused vision towers must share one image size; got {sorted(sizes)}.")
        if self.image_resize_strategy not in RESIZE_STRATEGIES:
            raise UserError(
                f"image_resize_strategy {self.image_resize_strategy!r} is not supported (supported: "
                f"{', '.join(RESIZE_STRATEGIES)}; OpenVLA checkpoints use resize-naive)."
            )
        if self.dtype not in DTYPES:
            raise UserError(f"checkpoint dtype {self.dtype!r} is not supported; supported: {', '.join(DTYPES)}.")
        if self.text_config.get("tie_word_embeddings", False):
            raise UserError("text_config.tie_word_embeddings is set; OpenVLA's Llama-2 keeps separate input and output embeddings.")
        model_type = self.text_config.get("model_type", "llama")
        if model_type != "llama":
            raise UserError(f"text_config.model_type {model_type!r} is not supported; OpenVLA's language model is Llama.")
        if self.n_action_bins < 2 or self.vocab_size < self.n_action_bins:
            raise UserError(
                f"n_action_bins={self.n_action_bins} must be at least 2 and fit in the text vocabulary "
                f"(text_config.vocab_size - pad_to_multiple_of = {self.vocab_size})."
            )
        if not self.vocab_size <= self.pad_token_id < self.llama_config().vocab_size:
            raise UserError(
                f"pad_token_id={self.pad_token_id} must lie in the padding rows [{self.vocab_size}, "
                f"{self.llama_config().vocab_size}) after the text vocabulary (OpenVLA: 32000)."
            )

    # -- derived -------------------------------------------------------------------------------

    @property
    def use_fused_vision_backbone(self) -> bool:
        return len(self.towers) == 2

    @property
    def image_size(self) -> int:
        return self.towers[0].image_size

    @property
    def vision_dim(self) -> int:
        """Width of one patch feature: the towers' widths concatenated (1024 + 1152 = 2176)."""
        return sum(t.hidden_size for t in self.towers)

    @property
    def num_patches(self) -> int:
        """Patches per image (every tower has the same grid)."""
        return self.towers[0].num_patches

    @property
    def vocab_size(self) -> int:
        """The text vocabulary without the padding rows (OpenVLA's ``vocab_size`` for actions)."""
        return int(self.text_config.get("vocab_size", LlamaConfig().vocab_size)) - self.pad_to_multiple_of

    def llama_config(self, attn_implementation: str | None = None) -> LlamaConfig:
        """A fresh ``LlamaConfig`` from ``text_config`` (LlamaConfig defaults for absent keys)."""
        kwargs = {k: v for k, v in self.text_config.items() if k not in ("model_type", "torch_dtype", "dtype")}
        config = LlamaConfig(**kwargs)
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        return config

    # -- (de)serialization --------------------------------------------------------------------

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> VLAConfig:
        backbone = raw.get("vision_backbone_id")
        if not isinstance(backbone, str):
            raise UserError(f"{where} has no 'vision_backbone_id'; is this an OpenVLA checkpoint directory?")
        if TOWERS_KEY in raw:
            towers = tuple(_tower_from_dict(t, where) for t in raw[TOWERS_KEY])
        elif backbone in BACKBONES:
            towers = BACKBONES[backbone]
        else:
            raise UserError(
                f"{where}: vision_backbone_id {backbone!r} is not supported.{did_you_mean(backbone, BACKBONES)} "
                f"Supported: {', '.join(BACKBONES)} (released sizes), or another dinosiglip-*, siglip-* or dinov2-* id "
                "whose sizes the loader reads from the checkpoint's tensors."
            )
        fused = raw.get("use_fused_vision_backbone")
        if fused is not None and bool(fused) != (len(towers) == 2):
            raise UserError(
                f"{where}: use_fused_vision_backbone={fused} disagrees with {backbone!r} ({len(towers)} tower(s))."
            )
        text_config = raw.get("text_config")
        if not isinstance(text_config, dict):
            raise UserError(f"{where} has no 'text_config' (the Llama config of the language model).")
        dtype = raw.get("torch_dtype") or raw.get("dtype") or text_config.get("torch_dtype") or "float32"
        return cls(
            vision_backbone_id=backbone,
            towers=towers,
            text_config=dict(text_config),
            pad_token_id=int(raw.get("pad_token_id", 32000)),
            pad_to_multiple_of=int(raw.get("pad_to_multiple_of", 64)),
            n_action_bins=int(raw.get("n_action_bins", 256)),
            image_resize_strategy=str(raw.get("image_resize_strategy", "resize-naive")),
            llm_backbone_id=str(raw.get("llm_backbone_id", "llama2-7b-pure")),
            dtype=str(dtype).replace("torch.", ""),
            norm_stats=dict(raw.get("norm_stats") or {}),
        )

    @classmethod
    def from_dir(cls, path: str | Path, shapes: Mapping[str, tuple[int, ...]] | None = None) -> VLAConfig:
        """``config.json`` of a checkpoint directory, with ``dataset_statistics.json`` merged into
        ``norm_stats`` when present (OFT checkpoints keep their statistics only there).

        shapes: the checkpoint's tensor shapes; the sizes config.json leaves out are read from them
        (:func:`policies.vla.sizes.with_checkpoint_sizes`).
        """
        from policies.vla.sizes import with_checkpoint_sizes  # sizes reads this module's specs

        path = Path(path)
        config_file = config_path(path)
        raw = json.loads(config_file.read_text())
        config = cls.from_dict(with_checkpoint_sizes(raw, shapes) if shapes else raw, str(config_file))
        stats_file = path / "dataset_statistics.json"
        if stats_file.is_file():
            config.norm_stats = {**config.norm_stats, **json.loads(stats_file.read_text())}
        return config

    def to_dict(self) -> dict[str, Any]:
        """The official config.json keys (plus ``embodied_vision_towers`` for non-standard towers)."""
        out: dict[str, Any] = {
            "model_type": "openvla",
            "architectures": ["OpenVLAForActionPrediction"],
            "vision_backbone_id": self.vision_backbone_id,
            "llm_backbone_id": self.llm_backbone_id,
            "arch_specifier": "no-align+fused-gelu-mlp" if self.use_fused_vision_backbone else "no-align+gelu-mlp",
            "use_fused_vision_backbone": self.use_fused_vision_backbone,
            "image_resize_strategy": self.image_resize_strategy,
            "image_sizes": [t.image_size for t in self.towers],
            "llm_max_length": 2048,
            "pad_token_id": self.pad_token_id,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "n_action_bins": self.n_action_bins,
            "norm_stats": self.norm_stats,
            "text_config": self.text_config,
            "torch_dtype": self.dtype,
        }
        if BACKBONES.get(self.vision_backbone_id) != self.towers:
            out[TOWERS_KEY] = [asdict(t) for t in self.towers]
        return out


def config_path(path: Path) -> Path:
    """``path/config.json``, which must exist."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UserError(f"{path} has no config.json; point policy.kwargs.path at an OpenVLA checkpoint directory.")
    return config_file


def _tower_from_dict(raw: dict[str, Any], where: str) -> VisionTowerConfig:
    known = set(VisionTowerConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"{where}: {TOWERS_KEY} entry has unknown keys {unknown}; allowed: {', '.join(sorted(known))}.")
    values = dict(raw)
    for key in ("mean", "std"):
        if key in values:
            values[key] = tuple(float(v) for v in values[key])
    required = [k for k, f in VisionTowerConfig.__dataclass_fields__.items() if f.default is MISSING and k not in values]
    if required:
        raise UserError(f"{where}: {TOWERS_KEY} entry lacks {required} (only a checkpoint's tensors can fill them in).")
    return VisionTowerConfig(**values)
