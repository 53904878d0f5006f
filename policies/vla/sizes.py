"""Model sizes read from a checkpoint's tensor shapes, and the check that config.json agrees.

An official ``config.json`` names the vision backbone by a Prismatic id and gives no tower sizes;
its ``text_config`` is a diff to ``LlamaConfig``'s defaults. The shapes of the stored tensors
(safetensors headers: no tensor data is read) say the rest:

==========================  =================================================================
size                        tensor (timm naming, ``vision_backbone.featurizer.`` etc.)
==========================  =================================================================
family                      ``cls_token`` present: DINOv2 with registers; absent: SigLIP
hidden size, patch size     ``patch_embed.proj.weight`` (D, 3, p, p)
patches per image           ``pos_embed`` (1, N, D): a square grid of sqrt(N) x sqrt(N)
layers                      the ``blocks.<i>.`` indices
MLP size                    ``blocks.0.mlp.fc1.weight`` (M, D)
register tokens             ``reg_token`` (1, R, D)
image size                  config.json's ``image_sizes`` when it fits the grid, else grid x p
Llama sizes                 ``embed_tokens`` (V, H), ``layers.<i>.``, ``gate_proj`` (F, H),
                            ``k_proj`` (KV width, H)
==========================  =================================================================

Head counts are in no shape. Towers: heads of width 64, as in every timm DINOv2 / SigLIP ViT
except SigLIP so400m (width 1152, 16 heads of 72). Llama: heads of width 128 (Llama-2). A width
that is no multiple of these is a UserError asking for the count. A config value always wins over
these rules (``embodied_vision_towers`` entries may give only some fields,
``text_config`` any of its keys).

:func:`check_sizes` compares what config.json asks for (the released sizes of a known backbone id,
``embodied_vision_towers``, ``text_config``) with the tensors and says the first disagreement in
one sentence naming the part and both sizes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from transformers import LlamaConfig

from embodied.errors import UserError
from policies.vla.config import (
    BACKBONES, IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, TOWERS_KEY, VLAConfig,
)

Shapes = Mapping[str, tuple[int, ...]]
TOWER_PREFIXES = ("vision_backbone.featurizer.", "vision_backbone.fused_featurizer.")
LLM_PREFIX = "language_model."
#: Prismatic id prefixes -> tower families, longest first (``dinosiglip-*`` before ``siglip-*``).
FAMILY_PREFIXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dinosiglip", ("dinov2", "siglip")),
    ("dinov2", ("dinov2",)),
    ("siglip", ("siglip",)),
)
FAMILY_NAMES = {"dinov2": "DINOv2", "siglip": "SigLIP"}
#: Head width of timm's DINOv2 and SigLIP ViTs (S/B/L/g), and the one exception by width.
TOWER_HEAD_WIDTH = 64
TOWER_HEADS_BY_WIDTH = {1152: 16}  # SigLIP so400m: 16 heads of 72
#: Llama-2's attention head width (4096 / 32).
LLM_HEAD_WIDTH = 128
#: Tower sizes the tensors determine, with their names in messages (num_patches is derived).
TOWER_FIELDS = (
    ("hidden_size", "hidden size {}"), ("num_layers", "{} layers"), ("mlp_size", "MLP size {}"),
    ("patch_size", "patch size {}"), ("num_patches", "{} patches"), ("num_register_tokens", "{} register tokens"),
)
LLM_FIELDS = (
    ("hidden_size", "hidden size {}"), ("num_hidden_layers", "{} layers"), ("intermediate_size", "MLP size {}"),
    ("vocab_size", "{} embedding rows"), ("kv_width", "key/value width {}"),
)


def backbone_families(backbone_id: str) -> tuple[str, ...] | None:
    """The tower families a Prismatic id stands for (None: a family this package does not build)."""
    for prefix, families in FAMILY_PREFIXES:
        if backbone_id.startswith(prefix):
            return families
    return None


def _layer_count(shapes: Shapes, prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = {int(m.group(1)) for key in shapes if (m := pattern.match(key))}
    return max(indices) + 1 if indices else 0


def measured_tower(shapes: Shapes, prefix: str) -> dict[str, Any] | None:
    """The sizes of the timm tower stored under ``prefix`` (None: the checkpoint has none there)."""
    pos, patch = shapes.get(prefix + "pos_embed"), shapes.get(prefix + "patch_embed.proj.weight")
    if pos is None or patch is None or len(pos) != 3 or len(patch) != 4:
        return None
    fc1 = shapes.get(prefix + "blocks.0.mlp.fc1.weight")
    registers = shapes.get(prefix + "reg_token")
    return {
        "family": "dinov2" if prefix + "cls_token" in shapes else "siglip",
        "hidden_size": int(patch[0]),
        "num_layers": _layer_count(shapes, prefix + "blocks."),
        "mlp_size": int(fc1[0]) if fc1 else None,
        "patch_size": int(patch[-1]),
        "num_patches": int(pos[1]),
        "num_register_tokens": int(registers[1]) if registers else 0,
    }


def measured_llm(shapes: Shapes) -> dict[str, int] | None:
    """The Llama's sizes under ``language_model.`` (None: no embedding table there)."""
    embed = shapes.get(LLM_PREFIX + "model.embed_tokens.weight")
    if embed is None:
        return None
    gate = shapes.get(LLM_PREFIX + "model.layers.0.mlp.gate_proj.weight")
    k_proj = shapes.get(LLM_PREFIX + "model.layers.0.self_attn.k_proj.weight")
    return {
        "vocab_size": int(embed[0]),
        "hidden_size": int(embed[1]),
        "num_hidden_layers": _layer_count(shapes, LLM_PREFIX + "model.layers."),
        "intermediate_size": int(gate[0]) if gate else None,
        "kv_width": int(k_proj[0]) if k_proj else None,
    }


def _tower_heads(hidden_size: int, given: Mapping[str, Any], part: str) -> int:
    if "num_heads" in given:
        return int(given["num_heads"])
    if hidden_size in TOWER_HEADS_BY_WIDTH:
        return TOWER_HEADS_BY_WIDTH[hidden_size]
    if hidden_size % TOWER_HEAD_WIDTH:
        raise UserError(
            f"the checkpoint's {part} has width {hidden_size}, no multiple of timm's head width {TOWER_HEAD_WIDTH}, and "
            f'no tensor holds its head count: give it in config.json, e.g. "{TOWERS_KEY}": [{{"num_heads": N}}, ...].'
        )
    return hidden_size // TOWER_HEAD_WIDTH


def tower_from_shapes(
    measured: Mapping[str, Any], given: Mapping[str, Any], image_size: int | None, part: str = "vision tower"
) -> dict[str, Any]:
    """``VisionTowerConfig`` fields: ``given`` (config.json's) over the measured sizes and the rules."""
    grid = math.isqrt(measured["num_patches"])
    patch = measured["patch_size"]
    family = measured["family"]
    fields: dict[str, Any] = {
        "family": family,
        "hidden_size": measured["hidden_size"],
        "num_layers": measured["num_layers"],
        "num_heads": _tower_heads(measured["hidden_size"], given, part),
        "mlp_size": measured["mlp_size"] or 4 * measured["hidden_size"],
        "image_size": image_size if image_size and image_size // patch == grid else grid * patch,
        "patch_size": patch,
        "num_register_tokens": measured["num_register_tokens"],
        "mean": IMAGENET_MEAN if family == "dinov2" else INCEPTION_MEAN,
        "std": IMAGENET_STD if family == "dinov2" else INCEPTION_STD,
    }
    return {**fields, **given}


def with_checkpoint_sizes(raw: dict[str, Any], shapes: Shapes) -> dict[str, Any]:
    """``raw`` (config.json) with the sizes it leaves out taken from the tensors.

    Towers: a backbone id of released sizes (:data:`BACKBONES`) keeps them (and :func:`check_sizes`
    holds the tensors to them); another id of a known family, or partial ``embodied_vision_towers``
    entries, get the measured sizes. ``text_config``: every absent Llama size is measured.
    """
    out = dict(raw)
    backbone = raw.get("vision_backbone_id")
    measured = [m for m in (measured_tower(shapes, p) for p in TOWER_PREFIXES) if m is not None]
    given = raw.get(TOWERS_KEY)
    if given is None and isinstance(backbone, str) and backbone not in BACKBONES and backbone_families(backbone):
        given = [{} for _ in measured]
    if given is not None and measured and all(isinstance(g, dict) for g in given) and len(given) == len(measured):
        sizes = list(raw.get("image_sizes") or [])
        out[TOWERS_KEY] = [
            tower_from_shapes(m, g, int(sizes[i]) if i < len(sizes) else None, f"{FAMILY_NAMES[m['family']]} tower ({p}*)")
            for i, (m, g, p) in enumerate(zip(measured, given, TOWER_PREFIXES))
        ]
    text = raw.get("text_config")
    llm = measured_llm(shapes)
    if isinstance(text, dict) and llm is not None:
        text = dict(text)
        for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"):
            if llm[key] is not None:
                text.setdefault(key, llm[key])
        if "num_attention_heads" not in text:
            if text["hidden_size"] % LLM_HEAD_WIDTH:
                raise UserError(
                    f"text_config gives no num_attention_heads, and the checkpoint's Llama has hidden size "
                    f"{text['hidden_size']}, no multiple of Llama-2's head width {LLM_HEAD_WIDTH}: give it in text_config."
                )
            text["num_attention_heads"] = text["hidden_size"] // LLM_HEAD_WIDTH
        heads = int(text.get("num_attention_heads", LlamaConfig().num_attention_heads))
        head_width = int(text.get("head_dim") or text["hidden_size"] // heads)
        if "num_key_value_heads" not in text and llm["kv_width"] and llm["kv_width"] % head_width == 0:
            text["num_key_value_heads"] = llm["kv_width"] // head_width
        out["text_config"] = text
    return out


def _sentence(part: str, measured: Mapping[str, Any], asked: Mapping[str, Any], fields: tuple, source: str) -> str:
    names = [(key, text) for i, (key, text) in enumerate(fields) if i < 2 or _differs(measured, asked, key)]
    has = [text.format(measured[key]) for key, text in names]
    wants = [str(asked[key]) for key, _ in names]
    join = lambda items: ", ".join(items[:-1]) + " and " + items[-1]  # noqa: E731
    return f"the checkpoint's {part} has {join(has)}, {source} asks for {join(wants)}"


def _differs(measured: Mapping[str, Any], asked: Mapping[str, Any], key: str) -> bool:
    return measured[key] is not None and measured[key] != asked[key]  # None: no tensor says it


def check_sizes(config: VLAConfig, shapes: Shapes) -> None:
    """A UserError in one sentence when the tensors' sizes are not the ones ``config`` asks for."""
    released = BACKBONES.get(config.vision_backbone_id) == config.towers
    source = f"the config (vision_backbone_id {config.vision_backbone_id!r})" if released else f"config.json's {TOWERS_KEY}"
    advice = "config.json is not the config of these weights"
    measured = [measured_tower(shapes, p) for p in TOWER_PREFIXES]
    stored = sum(m is not None for m in measured)
    if stored and stored != len(config.towers):
        raise UserError(
            f"the checkpoint has {stored} vision tower(s), the config (vision_backbone_id "
            f"{config.vision_backbone_id!r}) asks for {len(config.towers)}: {advice}."
        )
    for prefix, tower, found in zip(TOWER_PREFIXES, config.towers, measured):
        if found is None:
            continue
        part = f"{FAMILY_NAMES[found['family']]} tower ({prefix}*)"
        if found["family"] != tower.family:
            raise UserError(
                f"the checkpoint's {part} is a {FAMILY_NAMES[found['family']]} ViT, {source} asks for "
                f"{FAMILY_NAMES[tower.family]}: {advice}."
            )
        asked = {key: getattr(tower, key) for key, _ in TOWER_FIELDS}
        if any(_differs(found, asked, key) for key, _ in TOWER_FIELDS):
            raise UserError(f"{_sentence(part, found, asked, TOWER_FIELDS, source)}: {advice}.")
    llm = measured_llm(shapes)
    if llm is not None:
        text = config.llama_config()
        head_width = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        asked = {
            "hidden_size": text.hidden_size, "num_hidden_layers": text.num_hidden_layers,
            "intermediate_size": text.intermediate_size, "vocab_size": text.vocab_size,
            "kv_width": text.num_key_value_heads * head_width,
        }
        if any(_differs(llm, asked, key) for key, _ in LLM_FIELDS):
            raise UserError(f"{_sentence(f'Llama ({LLM_PREFIX}*)', llm, asked, LLM_FIELDS, 'text_config')}: {advice}.")
