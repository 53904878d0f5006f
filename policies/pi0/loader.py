"""Load a π0 / π0.5 checkpoint directory in the published PyTorch layouts.

Supported layouts (one ``model.safetensors`` and a ``config.json``):

* **LeRobot** (``lerobot/pi0``, ``lerobot/pi05_base`` exports): keys ``model.paligemma_with_expert.
  paligemma.model.{vision_tower.vision_model.*, multi_modal_projector.linear.*, language_model.*}``,
  ``model.paligemma_with_expert.gemma_expert.model.*`` (π0.5: ``*_layernorm.dense.*`` adaRMS
  norms), ``model.{action_in_proj, action_out_proj, state_proj, action_time_mlp_in/out |
  time_mlp_in/out}``; config.json is ``PI0Config``/``PI05Config`` (``type``, ``chunk_size``,
  ``max_state_dim``, ``max_action_dim``, ``num_inference_steps``, ``paligemma_variant``,
  ``action_expert_variant``, ``tokenizer_max_length``, ``normalization_mapping``, ...).
  Statistics: ``policy_preprocessor_step_*_normalizer_processor.safetensors``
  (``observation.state.mean``, ``action.q01``, ...).
* **openpi's PyTorch conversion**: the same keys without ``model.``, or the older transformers
  layout (``paligemma.language_model.model.*``, ``paligemma.vision_tower.*``,
  ``paligemma.multi_modal_projector.*``), and ``time_mlp_*`` for π0's action-time MLP (LeRobot's
  own fix-up); config.json with ``action_horizon`` / ``action_dim`` / ``pi05`` / ``max_token_len``;
  statistics in ``assets/<asset_id>/norm_stats.json`` (``{"norm_stats": {"state": {...},
  "actions": {...}}}``).

The model is built without random initialization (transformers' ``no_init_weights``), cast to
the requested dtype, then filled. Sizes come from the tensors (widths, depths, MLP widths, image and patch size, chunk and action
widths), head widths from the named Gemma variant (checked against the tensors: a mismatch is one
sentence naming the part and both sizes). Every key is accounted for (:class:`LoadReport`):
loaded into a parameter, or dropped for a stated reason (PaliGemma's ``lm_head``, tied to the
token embedding; the expert's unused ``lm_head`` / ``embed_tokens``), and every model tensor no
key fills is a buffer computed at construction. An unknown key or a missing parameter is a
:class:`~embodied.errors.UserError` naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from embodied.errors import UserError
from policies.pi0.config import GemmaSize, Pi0Config, SiglipSize, gemma_variant
from policies.pi0.inputs import ByteTokenizer, FileTokenizer, Normalizer, TextTokenizer
from policies.pi0.model import Pi0Model

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
LEROBOT_STATS_GLOB = "policy_preprocessor_step_*_normalizer_processor.safetensors"
OPENPI_STATS = "norm_stats.json"
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Older transformers' PaliGemma layout -> the current one (openpi's conversion, old exports).
OLD_LAYOUT = (
    ("paligemma_with_expert.paligemma.language_model.model.", "paligemma_with_expert.paligemma.model.language_model."),
    ("paligemma_with_expert.paligemma.language_model.lm_head.", "paligemma_with_expert.paligemma.lm_head."),
    ("paligemma_with_expert.paligemma.vision_tower.", "paligemma_with_expert.paligemma.model.vision_tower."),
    ("paligemma_with_expert.paligemma.multi_modal_projector.", "paligemma_with_expert.paligemma.model.multi_modal_projector."),
)
#: Checkpoint keys that fill nothing, and why.
DROPPED = {
    "paligemma_with_expert.paligemma.lm_head.weight": "PaliGemma's output head, tied to the token embedding; π0 decodes no text",
    "paligemma_with_expert.gemma_expert.lm_head.weight": "the action expert's output head; the expert decodes no tokens",
    "paligemma_with_expert.gemma_expert.model.embed_tokens.weight": "the action expert's token embedding; it reads embeddings",
}


@dataclass
class LoadReport:
    """Where every key went: ``filled`` model parameter -> checkpoint key, ``dropped`` checkpoint
    key -> why, ``built`` model buffers made at construction -> why."""

    filled: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    built: dict[str, str] = field(default_factory=dict)


@dataclass
class LoadedPi0:
    model: Pi0Model
    tokenizer: TextTokenizer
    action_norm: Normalizer
    state_norm: Normalizer | None
    report: LoadReport | None = None


def canonical_key(key: str) -> str:
    """A checkpoint key in the current transformers layout, without LeRobot's ``model.``."""
    key = key[len("model."):] if key.startswith("model.") else key
    for old, new in OLD_LAYOUT:
        if key.startswith(old):
            key = new + key[len(old):]
    return key


def model_key(key: str, pi05: bool) -> str | None:
    """The model tensor a canonical checkpoint key fills (None: dropped or unknown)."""
    if key in DROPPED:
        return None
    for prefix, target in (("paligemma_with_expert.paligemma.model.", "paligemma."),
                           ("paligemma_with_expert.gemma_expert.model.", "gemma_expert.")):
        if key.startswith(prefix):
            key = target + key[len(prefix):]
            return key.replace("paligemma.vision_tower.vision_model.", "paligemma.vision_tower.")
    if not pi05 and key.startswith("time_mlp_"):
        return "action_" + key
    return key


def _sizes(shapes: dict[str, tuple[int, ...]], meta: dict[str, Any], pi05: bool) -> Pi0Config:
    """The model config from the tensors' shapes, head widths from the named variants."""
    def depth(prefix: str) -> int:
        found = {int(m.group(1)) for k in shapes if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
        return max(found) + 1 if found else 0

    def gemma(prefix: str, variant: str, part: str) -> GemmaSize:
        named = gemma_variant(variant)
        q = shapes[f"{prefix}layers.0.self_attn.q_proj.weight"]
        k = shapes[f"{prefix}layers.0.self_attn.k_proj.weight"]
        mlp = shapes[f"{prefix}layers.0.mlp.gate_proj.weight"]
        got = GemmaSize(width=q[1], depth=depth(prefix + "layers."), mlp_dim=mlp[0], num_heads=q[0] // named.head_dim,
                        num_kv_heads=k[0] // named.head_dim, head_dim=named.head_dim)
        if got != named:
            raise UserError(f"the checkpoint's {part} has {got}, its config.json names {variant!r} with {named}.")
        return got

    tower = "paligemma.vision_tower."
    patch = shapes[tower + "embeddings.patch_embedding.weight"]
    positions = shapes[tower + "embeddings.position_embedding.weight"][0]
    side = int(round(positions ** 0.5))
    vision = SiglipSize(width=patch[0], depth=depth(tower + "encoder.layers."),
                        mlp_dim=shapes[tower + "encoder.layers.0.mlp.fc1.weight"][0],
                        num_heads=int(meta.get("vision_num_heads", 16)), image_size=side * patch[2], patch_size=patch[2])
    resolution = meta.get("image_resolution")
    if resolution and int(resolution[0]) != vision.image_size:
        raise UserError(f"config.json's image_resolution {resolution} and the vision tower's {vision.image_size} px differ.")
    vlm = gemma("paligemma.language_model.", meta.get("paligemma_variant", "gemma_2b"), "PaliGemma language model")
    expert = gemma("gemma_expert.", meta.get("action_expert_variant", "gemma_300m"), "action expert")
    action_in = shapes["action_in_proj.weight"]
    chunk = meta.get("chunk_size", meta.get("action_horizon", 50))
    max_len = meta.get("tokenizer_max_length", meta.get("max_token_len", 200 if pi05 else 48))
    state_dim = shapes["state_proj.weight"][1] if "state_proj.weight" in shapes else meta.get("max_state_dim", action_in[1])
    return Pi0Config(
        pi05=pi05, vision=vision, vlm=vlm, expert=expert, vocab_size=shapes["paligemma.language_model.embed_tokens.weight"][0],
        chunk_size=int(chunk), max_action_dim=action_in[1], max_state_dim=int(state_dim),
        num_inference_steps=int(meta.get("num_inference_steps", meta.get("num_steps", 10))),
        min_period=float(meta.get("min_period", 4e-3)), max_period=float(meta.get("max_period", 4.0)),
        tokenizer_max_length=int(max_len),
    )


def _is_pi05(meta: dict[str, Any], keys: list[str]) -> bool:
    adarms = any(k.endswith("input_layernorm.dense.weight") and "gemma_expert" in k for k in keys)
    named = meta.get("type", "pi05" if meta.get("pi05") else None)
    if named is not None and (named == "pi05") != adarms:
        raise UserError(f"config.json says {named!r} but the action expert's norms are {'adaRMS (π0.5)' if adarms else 'plain (π0)'}.")
    return adarms


def read_stats(path: Path) -> dict[str, dict[str, list[float]]]:
    """``{"state": {...}, "actions": {...}}`` from LeRobot's normalizer file or openpi's norm_stats.json."""
    lerobot = sorted(path.glob(LEROBOT_STATS_GLOB))
    if lerobot:
        tensors = load_file(str(lerobot[0]))
        out: dict[str, dict[str, list[float]]] = {}
        for key, value in tensors.items():
            feature, _, stat = key.rpartition(".")
            name = {"observation.state": "state", "action": "actions"}.get(feature)
            if name is not None:
                out.setdefault(name, {})[stat] = value.float().reshape(-1).tolist()
        return out
    found = sorted(path.rglob(OPENPI_STATS))
    if len(found) > 1:
        raise UserError(f"{path} holds several {OPENPI_STATS} files ({[str(p.relative_to(path)) for p in found]}); keep the one to use.")
    if not found:
        raise UserError(f"{path} has no normalization statistics ({LEROBOT_STATS_GLOB} or assets/<id>/{OPENPI_STATS}).")
    data = json.loads(found[0].read_text())
    return data.get("norm_stats", data)


def _quantile(meta: dict[str, Any], pi05: bool) -> bool:
    mapping = meta.get("normalization_mapping") or {}
    kind = mapping.get("ACTION")
    return kind in ("QUANTILES", "QUANTILE10") if kind is not None else pi05


def load_pi0(path: str | Path, dtype: str = "float32", tokenizer: str | None = None) -> LoadedPi0:
    """The model, tokenizer and statistics of a checkpoint directory (see the module docstring)."""
    path = Path(path).expanduser()
    if not (path / WEIGHTS).is_file() or not (path / CONFIG).is_file():
        raise UserError(f"{path} is not a π0 checkpoint: it needs {WEIGHTS} and {CONFIG}.")
    meta = json.loads((path / CONFIG).read_text())
    with safe_open(str(path / WEIGHTS), framework="pt") as handle:
        raw_keys = list(handle.keys())
        raw_shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in raw_keys}
    pi05 = _is_pi05(meta, [canonical_key(k) for k in raw_keys])
    report = LoadReport()
    targets: dict[str, str] = {}
    for raw in raw_keys:
        canonical = canonical_key(raw)
        target = model_key(canonical, pi05)
        if target is None:
            report.dropped[raw] = DROPPED[canonical]
        elif target.startswith("paligemma.vision_tower.head."):
            report.dropped[raw] = "SigLIP's pooling head; PaliGemma reads the patch features"
        else:
            if target in targets:
                raise UserError(f"{path / WEIGHTS}: {raw!r} and {targets[target]!r} both fill {target}.")
            targets[target] = raw
    shapes = {t: raw_shapes[r] for t, r in targets.items()}
    embed = "paligemma.language_model.embed_tokens.weight"
    tied = next((r for r in raw_keys if canonical_key(r) == "paligemma_with_expert.paligemma.lm_head.weight"), None)
    if embed not in targets and tied is not None:  # LeRobot's fix-up: the embedding is the tied lm_head
        targets[embed], shapes[embed] = tied, raw_shapes[tied]
        report.dropped.pop(tied, None)
    try:
        config = _sizes(shapes, meta, pi05)
    except KeyError as err:
        raise UserError(f"{path / WEIGHTS} lacks {err.args[0]!r}, which every π0 checkpoint has.") from err
    from transformers.initialization import no_init_weights

    with no_init_weights():  # every parameter is filled from the checkpoint below: no random init of 3B weights
        model = Pi0Model(config)
    model.to_dtype(TORCH_DTYPES[dtype] if dtype != "config" else _config_dtype(meta))
    state = model.state_dict()
    unknown = sorted(set(targets) - set(state))
    if unknown:
        raise UserError(f"{path / WEIGHTS}: key {targets[unknown[0]]!r} fits no tensor of a {'π0.5' if pi05 else 'π0'} model "
                        f"({len(unknown)} such keys).")
    missing = sorted(set(state) - set(targets))
    if missing:
        raise UserError(f"{path / WEIGHTS} has no tensor for {missing[0]} ({len(missing)} missing).")
    tensors = load_file(str(path / WEIGHTS))
    for target, raw in targets.items():
        if tuple(tensors[raw].shape) != tuple(state[target].shape):
            raise UserError(f"{raw!r} has shape {tuple(tensors[raw].shape)}, the model's {target} {tuple(state[target].shape)}.")
    model.load_state_dict({t: tensors[r] for t, r in targets.items()}, strict=True)
    report.filled = dict(targets)
    report.built = {name: "computed at construction (non-persistent)" for name, _ in model.named_buffers()
                    if name not in state}
    stats = read_stats(path)
    quantile = _quantile(meta, pi05)
    if "actions" not in stats:
        raise UserError(f"the statistics of {path} have no 'actions' entry; they have {sorted(stats)}.")
    action_norm = Normalizer.from_stats(stats["actions"], quantile, f"{path} action statistics")
    state_norm = Normalizer.from_stats(stats["state"], quantile, f"{path} state statistics") if "state" in stats else None
    return LoadedPi0(model, _tokenizer(path, tokenizer, config), action_norm, state_norm, report)


def _config_dtype(meta: dict[str, Any]) -> torch.dtype:
    name = meta.get("dtype", meta.get("precision", "float32"))
    return TORCH_DTYPES.get(name, torch.float32)


def _tokenizer(path: Path, tokenizer: str | None, config: Pi0Config) -> TextTokenizer:
    """``tokenizer`` (a tokenizer.json), the checkpoint's tokenizer.json, or for tiny vocabularies
    (< 1024 ids, the tests' checkpoints) the byte tokenizer."""
    file = Path(tokenizer).expanduser() if tokenizer else path / "tokenizer.json"
    if file.is_file():
        return FileTokenizer(file)
    if config.vocab_size < 1024:
        return ByteTokenizer(config.vocab_size)
    raise UserError(f"no tokenizer for {path}: give PaliGemma's tokenizer.json as policy.kwargs.tokenizer "
                    "(LeRobot's exports use google/paligemma-3b-pt-224's).")
