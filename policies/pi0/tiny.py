"""Tiny π0 / π0.5 models (CPU, seconds) and checkpoints written in the published layouts.

``tiny_pi0`` builds a random model of the real architecture at ``TINY_DEFAULTS`` sizes (a 1-layer
SigLIP on 32 px images, 16 patches; 2-layer Gemmas of width 32 and 16; a 4-step chunk of 8-wide
actions; 3 flow steps) with statistics that map [-1, 1] onto the env's action bounds.
``write_checkpoint`` writes a model as LeRobot exports it (``model.`` keys, the SigLIP tower's
``vision_model.`` level, PaliGemma's tied ``lm_head``, ``config.json``, the normalizer's
safetensors) or as openpi's conversion does (no ``model.``, the older PaliGemma layout, π0's
``time_mlp_*``, ``assets/<id>/norm_stats.json``): the loader's tests read the real key mapping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from policies.pi0.config import GEMMA_VARIANTS, Pi0Config, SiglipSize
from policies.pi0.inputs import ByteTokenizer, Normalizer
from policies.pi0.loader import TORCH_DTYPES, LoadedPi0
from policies.pi0.model import Pi0Model

TINY_DEFAULTS: dict[str, Any] = {
    "vision": {"width": 32, "depth": 1, "mlp_dim": 64, "num_heads": 2, "image_size": 32, "patch_size": 8},
    "vlm": "gemma_tiny",
    "expert": "gemma_tiny_expert",
    "vocab_size": 64,
    "chunk_size": 4,
    "max_action_dim": 8,
    "max_state_dim": 8,
    "num_inference_steps": 3,
    "tokenizer_max_length": 48,
}
#: π0.5's prompt carries the state as text: a longer prompt.
TINY_PI05_MAX_LENGTH = 96


def tiny_config(pi05: bool, overrides: dict[str, Any] | None = None) -> Pi0Config:
    base = dict(TINY_DEFAULTS, tokenizer_max_length=TINY_PI05_MAX_LENGTH if pi05 else TINY_DEFAULTS["tokenizer_max_length"])
    return Pi0Config(pi05=pi05, vision=SiglipSize()).with_overrides({**base, **(overrides or {})})


def tiny_stats(pi05: bool, action_low: list[float], action_high: list[float], state_dim: int) -> dict[str, dict[str, list[float]]]:
    """Statistics under which the normalized [-1, 1] are the action bounds, the state as is."""
    if pi05:
        return {"actions": {"q01": list(action_low), "q99": list(action_high)},
                "state": {"q01": [-1.0] * state_dim, "q99": [1.0] * state_dim}}
    return {"actions": {"mean": [(lo + hi) / 2 for lo, hi in zip(action_low, action_high)],
                        "std": [(hi - lo) / 2 for lo, hi in zip(action_low, action_high)]},
            "state": {"mean": [0.0] * state_dim, "std": [1.0] * state_dim}}


def tiny_pi0(pi05: bool, overrides: dict[str, Any] | None, action_low: list[float], action_high: list[float],
             state_dim: int, dtype: str = "float32") -> LoadedPi0:
    config = tiny_config(pi05, overrides)
    model = Pi0Model(config).to_dtype(TORCH_DTYPES[dtype])
    _randomize_zero_inits(model)
    stats = tiny_stats(pi05, action_low, action_high, state_dim)
    state_norm = Normalizer.from_stats(stats["state"], pi05, "tiny state statistics") if state_dim else None
    return LoadedPi0(model, ByteTokenizer(config.vocab_size), Normalizer.from_stats(stats["actions"], pi05, "tiny action statistics"),
                     state_norm)


def _randomize_zero_inits(model: Pi0Model) -> None:
    """Norm weights and adaRMS ``dense`` start at zero (the identity); small random values make a
    tiny test see every path."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.abs().sum() == 0:
                param.normal_(0.0, 0.05)


def _variant(config: Pi0Config, part: str) -> str:
    size = getattr(config, part)
    return next(name for name, known in GEMMA_VARIANTS.items() if known == size)


def write_checkpoint(path: str | Path, model: Pi0Model, stats: dict[str, dict[str, list[float]]],
                     layout: str = "lerobot") -> Path:
    """``model`` and ``stats`` as a checkpoint directory in ``layout`` (``lerobot`` or ``openpi``)."""
    if layout not in ("lerobot", "openpi"):
        raise ValueError(f"layout must be lerobot or openpi, got {layout!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = model.config
    tensors: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        if name.startswith("paligemma.vision_tower."):
            key = "paligemma_with_expert.paligemma.model.vision_tower.vision_model." + name[len("paligemma.vision_tower."):]
        elif name.startswith("paligemma."):
            key = "paligemma_with_expert.paligemma.model." + name[len("paligemma."):]
        elif name.startswith("gemma_expert."):
            key = "paligemma_with_expert.gemma_expert.model." + name[len("gemma_expert."):]
        else:
            key = name
        tensors[key] = value.detach().clone().contiguous()
    embed = tensors["paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"]
    tensors["paligemma_with_expert.paligemma.lm_head.weight"] = embed.clone()
    tensors["paligemma_with_expert.gemma_expert.lm_head.weight"] = torch.zeros(config.vocab_size, config.expert.width)
    meta: dict[str, Any] = {
        "paligemma_variant": _variant(config, "vlm"), "action_expert_variant": _variant(config, "expert"),
        "vision_num_heads": config.vision.num_heads, "num_inference_steps": config.num_inference_steps,
        "min_period": config.min_period, "max_period": config.max_period,
        "image_resolution": [config.vision.image_size, config.vision.image_size],
    }
    if layout == "lerobot":
        tensors = {"model." + k: v for k, v in tensors.items()}
        meta.update({"type": "pi05" if config.pi05 else "pi0", "chunk_size": config.chunk_size, "n_action_steps": config.chunk_size,
                     "max_state_dim": config.max_state_dim, "max_action_dim": config.max_action_dim,
                     "tokenizer_max_length": config.tokenizer_max_length,
                     "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES" if config.pi05 else "MEAN_STD",
                                               "ACTION": "QUANTILES" if config.pi05 else "MEAN_STD"}})
        normalizer = {f"{feature}.{stat}": torch.tensor(values, dtype=torch.float32)
                      for name, feature in (("state", "observation.state"), ("actions", "action"))
                      for stat, values in stats.get(name, {}).items()}
        save_file(normalizer, str(path / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    else:
        old = {}
        for key, value in tensors.items():
            for new_prefix, old_prefix in (
                ("paligemma_with_expert.paligemma.model.language_model.", "paligemma_with_expert.paligemma.language_model.model."),
                ("paligemma_with_expert.paligemma.model.vision_tower.", "paligemma_with_expert.paligemma.vision_tower."),
                ("paligemma_with_expert.paligemma.model.multi_modal_projector.", "paligemma_with_expert.paligemma.multi_modal_projector."),
            ):
                if key.startswith(new_prefix):
                    key = old_prefix + key[len(new_prefix):]
            if key.startswith("action_time_mlp_"):
                key = key[len("action_"):]
            old[key] = value
        tensors = old
        meta.update({"pi05": config.pi05, "action_horizon": config.chunk_size, "action_dim": config.max_action_dim,
                     "max_token_len": config.tokenizer_max_length, "precision": "float32"})
        assets = path / "assets" / "tiny_robot"
        assets.mkdir(parents=True, exist_ok=True)
        (assets / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}))
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(meta, indent=2))
    return path
