"""Tiny OpenVLA checkpoints of the real architecture, in the official release layout.

:func:`write_tiny_checkpoint` writes random weights as the official files are written: the
vision towers in **timm naming** (fused ``qkv``, ``ls*.scale_factor``, ``pos_embed`` without a
CLS slot, the unused last block, final norms and SigLIP's ``attn_pool``), sharded safetensors
with ``model.safetensors.index.json``, ``config.json``, ``dataset_statistics.json``,
``preprocessor_config.json``, ``tokenizer.json`` and, for OFT, ``action_head--<step>_checkpoint.pt``
/ ``proprio_projector--<step>_checkpoint.pt`` with DDP's ``module.`` prefix. Loading one
therefore runs the real key mapping, not a shortcut.

The tokenizer is a ``tokenizers`` WordLevel model that keeps Llama-2's conventions: ``<unk>``
= 0, BOS ``<s>`` = 1, EOS ``</s>`` = 2, a lone "▁" token that "Out: " ends with (29871 in
Llama-2), the last 256 ids of the V-token text vocabulary are the action tokens (rare strings),
and ``<PAD>`` = V is an added token in the first padding row of the embedding (V + 64 rows).

Sizes (:data:`TINY_DEFAULTS`): 32 x 32 images in 8 x 8 patches (16 patches per tower), towers
of width 64 (DINOv2, 4 registers) and 48 (SigLIP, an MLP of 3 * 48 + 8 like so400m's odd 4304),
3 blocks each (2 used), a 2-layer Llama of width 64 and a text vocabulary of 512.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from embodied.errors import UserError, did_you_mean
from policies.vla.config import IMAGENET_MEAN, IMAGENET_STD, VisionTowerConfig, VLAConfig
from policies.vla.heads import L1RegressionActionHead, ProprioProjector
from policies.vla.loader import (
    TORCH_DTYPES, DictTensors, LoadedVLA, LoadReport, build_model, check_filled, fill, fill_components,
)

#: Sizes of a tiny model (``policy.kwargs.tiny`` overrides any of them).
TINY_DEFAULTS: dict[str, int] = {
    "image_size": 32,  # pixels per side (both towers)
    "patch_size": 8,  # pixels per patch side: (32 / 8)^2 = 16 patches per tower
    "dino_width": 64,  # DINOv2 tower width (0: no DINOv2 tower, a single SigLIP backbone)
    "siglip_width": 48,  # SigLIP tower width
    "vision_depth": 3,  # blocks per tower in the checkpoint (OpenVLA uses all but the last)
    "vision_heads": 2,  # attention heads per tower block (must divide both widths)
    "llm_width": 64,  # Llama hidden size
    "llm_depth": 2,  # Llama layers
    "llm_heads": 4,  # Llama attention heads
    "llm_ffn": 128,  # Llama MLP width
    "vocab_size": 512,  # text vocabulary V (its last 256 ids are the action tokens); embeddings have V + 64 rows
    "seed": 0,  # seed of the random weights
}
PAD_TO_MULTIPLE_OF = 64
DATASET = "tiny"
_SPECIALS = ("<unk>", "<s>", "</s>")
_PUNCTUATION = ("\u2581", ":", "?", "\n", ",", ".", "'", "-", "!", "(", ")")
_WORDS = (
    "In What action should the robot take to Out pick up place put move push pull open close turn on off the a an "
    "and of in into onto inside top bottom left right front back side near next it its red green blue yellow "
    "black white orange purple pink brown gray cube block box bowl plate cup mug bottle can drawer door cabinet "
    "microwave stove sink basket tray lid handle knob button switch spoon fork knife pan pot towel sponge carrot "
    "eggplant banana apple ketchup cream cheese butter milk soup sauce salad dressing alphabet book caddy rack "
    "shelf table counter wine plant object objects target goal peg hole ball stack unstack lift grasp insert "
    "slide rotate flip wipe fold unfold pour stir press reach the task complete do with from then both two one"
).split()


def tiny_spec(overrides: Mapping[str, Any] | None = None) -> dict[str, int]:
    """:data:`TINY_DEFAULTS` with ``overrides``; unknown keys are a UserError with a suggestion."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(TINY_DEFAULTS))
    if unknown:
        hint = did_you_mean(unknown[0], TINY_DEFAULTS)
        raise UserError(
            f"policy.kwargs.tiny has unknown keys {unknown}.{hint} Allowed: {', '.join(TINY_DEFAULTS)}."
        )
    spec = {**TINY_DEFAULTS, **overrides}
    for key, value in spec.items():
        minimum = 0 if key in ("dino_width", "seed") else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise UserError(f"policy.kwargs.tiny.{key}={value!r} must be an integer >= {minimum}.")
    return spec


def tiny_config(
    spec: Mapping[str, Any] | None = None, norm_stats: Mapping[str, Any] | None = None, dtype: str = "float32"
) -> VLAConfig:
    """The :class:`VLAConfig` of a tiny model (``spec`` overrides :data:`TINY_DEFAULTS`)."""
    s = tiny_spec(spec)
    towers = []
    if s["dino_width"]:
        towers.append(VisionTowerConfig(
            "dinov2", s["dino_width"], s["vision_depth"], s["vision_heads"], 4 * s["dino_width"],
            s["image_size"], s["patch_size"], 4, IMAGENET_MEAN, IMAGENET_STD,
        ))
    towers.append(VisionTowerConfig(
        "siglip", s["siglip_width"], s["vision_depth"], s["vision_heads"], 3 * s["siglip_width"] + 8,
        s["image_size"], s["patch_size"],
    ))
    vocab = s["vocab_size"]
    if vocab < 256 + len(_SPECIALS) + len(_PUNCTUATION):
        raise UserError(f"policy.kwargs.tiny.vocab_size={vocab} leaves no room for words next to the 256 action tokens.")
    text_config = {
        "model_type": "llama", "vocab_size": vocab + PAD_TO_MULTIPLE_OF, "hidden_size": s["llm_width"],
        "intermediate_size": s["llm_ffn"], "num_hidden_layers": s["llm_depth"], "num_attention_heads": s["llm_heads"],
        "num_key_value_heads": s["llm_heads"], "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
        "pad_token_id": vocab, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    }
    return VLAConfig(
        vision_backbone_id="dinosiglip-vit-so-224px" if len(towers) == 2 else "siglip-vit-so400m",
        towers=tuple(towers), text_config=text_config, pad_token_id=vocab, pad_to_multiple_of=PAD_TO_MULTIPLE_OF,
        dtype=dtype, norm_stats=dict(norm_stats or default_norm_stats()),
    )


def default_norm_stats(action_dim: int = 7, proprio_dim: int = 0) -> dict[str, Any]:
    """Dataset statistics of the tiny dataset: distinct bounds per dimension, the last action
    dimension (the gripper) not normalized, as in OpenVLA's datasets."""
    def stats(dim: int, mask: list[bool]) -> dict[str, Any]:
        q01 = [-0.5 - 0.1 * i for i in range(dim)]
        q99 = [0.5 + 0.2 * i for i in range(dim)]
        return {"q01": q01, "q99": q99, "min": [v - 0.1 for v in q01], "max": [v + 0.1 for v in q99],
                "mean": [0.0] * dim, "std": [0.5] * dim, "mask": mask}

    out: dict[str, Any] = {"action": stats(action_dim, [True] * (action_dim - 1) + [False]),
                           "num_transitions": 1000, "num_trajectories": 10}
    if proprio_dim:
        out["proprio"] = stats(proprio_dim, [True] * proprio_dim)
    return {DATASET: out}


def tiny_tokenizer(vocab_size: int) -> Tokenizer:
    """A WordLevel tokenizer with Llama-2's conventions over a text vocabulary of ``vocab_size``."""
    words = list(dict.fromkeys(["\u2581" + w for w in _WORDS] + ["Out"]))
    regular = list(_SPECIALS) + list(_PUNCTUATION) + words
    free = vocab_size - 256 - len(regular)
    if free < 0:
        regular = regular[: vocab_size - 256]
    else:
        regular += [f"<extra_{i}>" for i in range(free)]
    tokens = regular + [f"<action_{i}>" for i in range(256)]  # the last 256 ids: action tokens
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"\u2581?[^\u2581\s\p{P}]+|\u2581|\p{P}|\s"), behavior="isolated")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.add_special_tokens([AddedToken("<PAD>", special=True)])  # id vocab_size
    return tokenizer


# -- random weights in the official naming ------------------------------------------------------------


def tiny_tensors(config: VLAConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 weights of ``config`` under the official checkpoint keys (timm-named towers)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    prefixes = ["vision_backbone.featurizer.", "vision_backbone.fused_featurizer."]
    for prefix, tower in zip(prefixes, config.towers):
        out.update(_timm_tower(prefix, tower, gen))
    vision, llm = config.vision_dim, config.llama_config()
    hidden = llm.hidden_size
    dims = [(vision, 4 * vision), (4 * vision, hidden), (hidden, hidden)] if config.use_fused_vision_backbone else [
        (vision, hidden), (hidden, hidden)]
    for i, (fan_in, fan_out) in enumerate(dims, start=1):
        out[f"projector.fc{i}.weight"] = _linear(fan_out, fan_in, gen)
        out[f"projector.fc{i}.bias"] = _normal((fan_out,), 0.02, gen)
    out.update(_llama(llm, gen))
    return out


def tiny_oft_components(
    hidden_size: int, action_dim: int, proprio_dim: int, seed: int = 0
) -> dict[str, dict[str, torch.Tensor]]:
    """State dicts of OFT's L1 action head and proprio projector (without ``module.``)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        out = {"action_head": L1RegressionActionHead(hidden_size, hidden_size, action_dim).state_dict()}
        if proprio_dim:
            out["proprio_projector"] = ProprioProjector(hidden_size, proprio_dim).state_dict()
        for state in out.values():  # LayerNorms away from their identity init, so that they matter
            for key, value in state.items():
                if "layer_norm" in key or ".ffn.0." in key:
                    value.add_(0.1 * torch.randn_like(value))
    return out


def _normal(shape: tuple[int, ...] | torch.Size, std: float, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=gen) * std


def _linear(fan_out: int, fan_in: int, gen: torch.Generator) -> torch.Tensor:
    return _normal((fan_out, fan_in), 1.0 / math.sqrt(fan_in), gen)


def _timm_tower(prefix: str, spec: VisionTowerConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    d, p, mlp = spec.hidden_size, spec.patch_size, spec.mlp_size
    t: dict[str, torch.Tensor] = {
        "patch_embed.proj.weight": _normal((d, 3, p, p), 1.0 / math.sqrt(3 * p * p), gen),
        "patch_embed.proj.bias": _normal((d,), 0.02, gen),
        "pos_embed": _normal((1, spec.num_patches, d), 0.5, gen),
        "norm.weight": 1.0 + _normal((d,), 0.1, gen),
        "norm.bias": _normal((d,), 0.02, gen),
    }
    if spec.family == "dinov2":
        t["cls_token"] = _normal((1, 1, d), 0.5, gen)
        t["reg_token"] = _normal((1, spec.num_register_tokens, d), 0.5, gen)
    else:  # the MAP head OpenVLA never runs
        t.update({
            "attn_pool.latent": _normal((1, 1, d), 0.5, gen), "attn_pool.q.weight": _linear(d, d, gen),
            "attn_pool.q.bias": _normal((d,), 0.02, gen), "attn_pool.kv.weight": _linear(2 * d, d, gen),
            "attn_pool.kv.bias": _normal((2 * d,), 0.02, gen), "attn_pool.proj.weight": _linear(d, d, gen),
            "attn_pool.proj.bias": _normal((d,), 0.02, gen), "attn_pool.norm.weight": 1.0 + _normal((d,), 0.1, gen),
            "attn_pool.norm.bias": _normal((d,), 0.02, gen), "attn_pool.mlp.fc1.weight": _linear(mlp, d, gen),
            "attn_pool.mlp.fc1.bias": _normal((mlp,), 0.02, gen), "attn_pool.mlp.fc2.weight": _linear(d, mlp, gen),
            "attn_pool.mlp.fc2.bias": _normal((d,), 0.02, gen),
        })
    for i in range(spec.num_layers):
        b = f"blocks.{i}."
        t.update({
            b + "norm1.weight": 1.0 + _normal((d,), 0.1, gen), b + "norm1.bias": _normal((d,), 0.02, gen),
            b + "attn.qkv.weight": _linear(3 * d, d, gen), b + "attn.qkv.bias": _normal((3 * d,), 0.02, gen),
            b + "attn.proj.weight": _linear(d, d, gen), b + "attn.proj.bias": _normal((d,), 0.02, gen),
            b + "norm2.weight": 1.0 + _normal((d,), 0.1, gen), b + "norm2.bias": _normal((d,), 0.02, gen),
            b + "mlp.fc1.weight": _linear(mlp, d, gen), b + "mlp.fc1.bias": _normal((mlp,), 0.02, gen),
            b + "mlp.fc2.weight": _linear(d, mlp, gen), b + "mlp.fc2.bias": _normal((d,), 0.02, gen),
        })
        if spec.family == "dinov2":  # layer scale far from its 1e-5 init, so that a wrong mapping shows
            t[b + "ls1.scale_factor"] = 0.2 + 0.8 * torch.rand(d, generator=gen)
            t[b + "ls2.scale_factor"] = 0.2 + 0.8 * torch.rand(d, generator=gen)
    return {prefix + k: v for k, v in t.items()}


def _llama(llm: Any, gen: torch.Generator) -> dict[str, torch.Tensor]:
    from accelerate import init_empty_weights
    from transformers import LlamaForCausalLM

    with init_empty_weights():
        shapes = {k: v.shape for k, v in LlamaForCausalLM(llm).state_dict().items()}
    out = {}
    for key, shape in shapes.items():
        if key.endswith("norm.weight") or key.endswith("layernorm.weight"):
            value = 1.0 + _normal(shape, 0.1, gen)
        elif key.endswith("embed_tokens.weight"):
            value = _normal(shape, 1.0, gen)
        else:
            value = _linear(shape[0], shape[1], gen)
        out["language_model." + key] = value
    return out


def load_tiny(
    spec: Mapping[str, Any] | None = None,
    norm_stats: Mapping[str, Any] | None = None,
    oft: bool = False,
    proprio_dim: int = 0,
    l1_action_dim: int = 0,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
) -> LoadedVLA:
    """A random tiny model built in memory and filled through the official key mapping, exactly as
    :func:`write_tiny_checkpoint` + :func:`~policies.vla.loader.load_openvla` would give it."""
    s = tiny_spec(spec)
    config = tiny_config(s, norm_stats, dtype)
    model = build_model(config, oft, attn_implementation, (proprio_dim, l1_action_dim))
    fill(model, DictTensors(tiny_tensors(config, s["seed"])), TORCH_DTYPES[dtype])
    if proprio_dim or l1_action_dim:
        parts = tiny_oft_components(model.hidden_size, max(l1_action_dim, 1), proprio_dim, s["seed"])
        components = {k: (f"tiny {k}", v) for k, v in parts.items() if k != "action_head" or l1_action_dim}
        fill_components(model, components, TORCH_DTYPES[dtype])
    check_filled(model)
    return LoadedVLA(model, config, tiny_tokenizer(config.vocab_size), LoadReport())


# -- the official layout on disk ------------------------------------------------------------------------


def write_tiny_checkpoint(
    path: str | Path,
    spec: Mapping[str, Any] | None = None,
    action_dim: int = 7,
    proprio_dim: int = 0,
    l1_head: bool = False,
    num_shards: int = 2,
    dtype: str = "float32",
    step: int = 1000,
) -> Path:
    """Write a random tiny OpenVLA (with ``l1_head`` / ``proprio_dim``: OpenVLA-OFT) checkpoint
    directory in the official layout; returns its path. ``dtype`` is the stored weights' dtype."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    s = tiny_spec(spec)
    config = tiny_config(s, default_norm_stats(action_dim, proprio_dim), dtype)
    tensors = tiny_tensors(config, s["seed"])
    _write_shards(path, tensors, num_shards, getattr(torch, dtype))
    (path / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    (path / "dataset_statistics.json").write_text(json.dumps(config.norm_stats, indent=2))
    (path / "preprocessor_config.json").write_text(json.dumps(_preprocessor_config(config), indent=2))
    tiny_tokenizer(config.vocab_size).save(str(path / "tokenizer.json"))
    if l1_head or proprio_dim:
        components = tiny_oft_components(config.llama_config().hidden_size, action_dim, proprio_dim, s["seed"])
        if not l1_head:
            components.pop("action_head")
        for name, state in components.items():
            torch.save({f"module.{k}": v for k, v in state.items()}, path / f"{name}--{step}_checkpoint.pt")
    return path


def _write_shards(path: Path, tensors: dict[str, torch.Tensor], num_shards: int, dtype: torch.dtype) -> None:
    keys = sorted(tensors)
    num_shards = max(1, min(num_shards, len(keys)))
    if num_shards == 1:
        save_file({k: tensors[k].to(dtype).contiguous() for k in keys}, str(path / "model.safetensors"), {"format": "pt"})
        return
    weight_map, total = {}, 0
    per_shard = math.ceil(len(keys) / num_shards)
    for index in range(num_shards):
        name = f"model-{index + 1:05d}-of-{num_shards:05d}.safetensors"
        shard = {k: tensors[k].to(dtype).contiguous() for k in keys[index * per_shard : (index + 1) * per_shard]}
        save_file(shard, str(path / name), {"format": "pt"})
        weight_map.update({k: name for k in shard})
        total += sum(v.numel() * v.element_size() for v in shard.values())
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=2))


def _preprocessor_config(config: VLAConfig) -> dict[str, Any]:
    return {
        "image_processor_type": "PrismaticImageProcessor",
        "use_fused_vision_backbone": config.use_fused_vision_backbone,
        "image_resize_strategy": config.image_resize_strategy,
        "input_sizes": [[3, t.image_size, t.image_size] for t in config.towers],
        "interpolations": ["bicubic"] * len(config.towers),
        "means": [list(t.mean) for t in config.towers],
        "stds": [list(t.std) for t in config.towers],
    }
