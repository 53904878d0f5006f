"""Load an OpenVLA / OpenVLA-OFT checkpoint directory in the official release layout.

A directory holds ``config.json`` (``OpenVLAConfig``: ``vision_backbone_id``, ``text_config``,
``norm_stats``, ...), the weights as ``model.safetensors`` or as shards
``model-0000X-of-0000Y.safetensors`` with ``model.safetensors.index.json``, ``tokenizer.json``,
optionally ``dataset_statistics.json`` and ``preprocessor_config.json``, and for OFT the component
files ``action_head--<step>_checkpoint.pt`` / ``proprio_projector--<step>_checkpoint.pt``
(``torch.load(weights_only=True)``, DDP's ``module.`` prefix stripped).

The model is built with its parameters on the meta device (no random init of 7.5B weights) and
every parameter is then filled from the checkpoint, shard by shard through
``safetensors.safe_open`` (one tensor in memory at a time besides the model), cast to the
requested dtype (default: the config's). Sizes config.json leaves out (an official one names the
vision backbone by id and gives no tower sizes) come from the tensors' shapes
(:mod:`policies.vla.sizes`, headers only), and sizes it gives are checked against them first: a
mismatch is one sentence naming the part and both sizes. Key accounting is strict: a checkpoint
key that maps to nothing and is not on the explicit drop list, a parameter no key fills, or a
shape that does not match is a :class:`~embodied.errors.UserError` naming the part and a key;
:class:`LoadReport` accounts for every checkpoint key and every tensor of the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from torch import nn

from embodied.errors import UserError
from policies.vla.config import VisionTowerConfig, VLAConfig, config_path
from policies.vla.keymap import KeyPlan, model_plan
from policies.vla.oft import OpenVLAOFT
from policies.vla.model import OpenVLA
from policies.vla.processor import load_tokenizer
from policies.vla.sizes import LLM_PREFIX, TOWER_PREFIXES, check_sizes

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
ACTION_HEAD_GLOB = "*action_head--*checkpoint.pt"
PROPRIO_GLOB = "*proprio_projector--*checkpoint.pt"
#: OFT component files of variants this package does not build.
UNSUPPORTED_COMPONENTS = {
    "*noisy_action_projector--*checkpoint.pt": "diffusion OFT (noisy action projector)",
    "*vision_backbone--*checkpoint.pt": "FiLM OFT+ (FiLM-wrapped vision backbone)",
}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TensorSource(Protocol):
    """Named tensors, read lazily: the checkpoint's shards or an in-memory dict."""

    def keys(self) -> list[str]: ...

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def items(self, keys: list[str]) -> Iterator[tuple[str, torch.Tensor]]: ...


class SafetensorsCheckpoint:
    """``model.safetensors`` or an index with its shards, read with ``safe_open``."""

    def __init__(self, path: Path) -> None:
        index = path / INDEX_FILE
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            self.files = sorted(set(weight_map.values()))
            missing = [f for f in self.files if not (path / f).is_file()]
            if missing:
                raise UserError(f"{index} names shard(s) {missing} that are not in {path}.")
            self.weight_map = weight_map
        elif (path / SINGLE_FILE).is_file():
            self.files = [SINGLE_FILE]
            with safe_open(str(path / SINGLE_FILE), framework="pt") as handle:
                self.weight_map = {key: SINGLE_FILE for key in handle.keys()}
        else:
            raise UserError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}; it holds {sorted(p.name for p in path.iterdir())}.")
        self.path = path

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, from the shards' headers (no tensor data is read)."""
        out: dict[str, tuple[int, ...]] = {}
        for file in self.files:
            with safe_open(str(self.path / file), framework="pt", device="cpu") as handle:
                out.update({key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()})
        return out

    def items(self, keys: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        by_file: dict[str, list[str]] = {}
        for key in keys:
            by_file.setdefault(self.weight_map[key], []).append(key)
        for file, file_keys in sorted(by_file.items()):
            with safe_open(str(self.path / file), framework="pt", device="cpu") as handle:
                present = set(handle.keys())
                for key in file_keys:
                    if key not in present:
                        raise UserError(f"{INDEX_FILE} places {key!r} in {file}, which does not hold it.")
                    yield key, handle.get_tensor(key)


class DictTensors:
    """An in-memory ``{key: tensor}`` as a :class:`TensorSource`."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(t.shape) for key, t in self.tensors.items()}

    def items(self, keys: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for key in keys:
            yield key, self.tensors[key]


@dataclass
class LoadReport:
    """Where every key went: checkpoint keys loaded or dropped (with why), model parameters and the
    checkpoint key that filled each, and what the model holds that no key fills (with why).

    ``built`` names the DINOv2 position tables' CLS slot (``...position_embeddings[:, 0]``, zeros:
    timm adds no position to CLS), DINOv2's ``mask_token`` (left out: transformers uses it only for
    masked image modelling) and the non-persistent buffers computed at construction (rotary
    frequencies, SigLIP's position ids). ``set(filled) | buffers == model tensors`` holds.
    """

    loaded: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    filled: dict[str, str] = field(default_factory=dict)  # model parameter -> checkpoint key
    built: dict[str, str] = field(default_factory=dict)  # model tensor (or slot) -> how it was made
    components: list[str] = field(default_factory=list)  # OFT component files read


@dataclass
class LoadedVLA:
    """A loaded checkpoint: the model, its config (with norm stats), tokenizer and key report."""

    model: OpenVLA
    config: VLAConfig
    tokenizer: Tokenizer
    report: LoadReport


def resolve_dtype(name: str | None, config: VLAConfig) -> torch.dtype:
    """The torch dtype of a ``dtype`` option; None or ``config``: the checkpoint's ``torch_dtype``."""
    key = config.dtype if name in (None, "config") else name
    if key not in TORCH_DTYPES:
        raise UserError(f"dtype {name!r} is not one of config, {', '.join(TORCH_DTYPES)}.")
    return TORCH_DTYPES[key]


def load_openvla(
    path: str | Path, oft: bool = False, dtype: str | None = None, attn_implementation: str = "sdpa"
) -> LoadedVLA:
    """Load a checkpoint directory as :class:`OpenVLA` (or :class:`OpenVLAOFT` with ``oft``).

    dtype: ``float32``, ``bfloat16``, ``float16`` or None / ``config`` (the config's ``torch_dtype``).
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise UserError(f"OpenVLA checkpoint directory {str(path)!r} does not exist.")
    config_path(path)  # before the weights: a directory without config.json is not a checkpoint
    source = SafetensorsCheckpoint(path)
    config = VLAConfig.from_dir(path, source.shapes())
    config.towers = image_stats(path, config)
    tokenizer = load_tokenizer(path)
    torch_dtype = resolve_dtype(dtype, config)
    components = read_oft_components(path) if oft else {}
    report = LoadReport(components=sorted(components))
    model = build_model(config, oft, attn_implementation, components_dims(components))
    fill(model, source, torch_dtype, report)
    if components:
        fill_components(model, components, torch_dtype)
        report.filled.update({f"{name}.{key}": f"{file}:{key}" for name, (file, state) in components.items() for key in state})
    check_filled(model)
    return LoadedVLA(model, config, tokenizer, report)


def build_model(config: VLAConfig, oft: bool, attn_implementation: str, dims: tuple[int, int] = (0, 0)) -> OpenVLA:
    """The model with its parameters on the meta device (filled by :func:`fill`)."""
    try:
        from accelerate import init_empty_weights
    except ImportError as err:  # accelerate comes with peft (the vla extra)
        raise UserError("loading OpenVLA needs accelerate: pip install 'embodied[vla]'.") from err
    with init_empty_weights(include_buffers=False):
        if oft:
            return OpenVLAOFT(config, attn_implementation, proprio_dim=dims[0], l1_action_dim=dims[1])
        return OpenVLA(config, attn_implementation)


def plan_for(model: OpenVLA) -> KeyPlan:
    """The key plan of ``model``'s checkpoint, checked to fill exactly its parameters (OFT heads aside)."""
    base = ("proprio_projector.", "action_head.")
    projector = list(model.projector.state_dict())
    llm = list(model.llm.state_dict())
    vision = {f"vision_backbone.{k}" for k in model.vision_backbone.state_dict()}
    plan = model_plan(model.config.towers, projector, llm, int(model.llm.config.num_hidden_layers), vision)
    expected = {k for k in model.state_dict() if not k.startswith(base)}
    covered = plan.targets()
    if covered != expected:  # the plan and the module disagree: a bug here, not in the checkpoint
        raise RuntimeError(f"key plan misses {sorted(expected - covered)[:5]} / invents {sorted(covered - expected)[:5]}")
    return plan


def fill(model: OpenVLA, source: TensorSource, dtype: torch.dtype, report: LoadReport | None = None) -> LoadReport:
    """Set every (non-OFT-head) parameter of ``model`` from ``source`` with the official key plan,
    after :func:`~policies.vla.sizes.check_sizes` holds the tensors' sizes to the model's config."""
    report = report if report is not None else LoadReport()
    check_sizes(model.config, source.shapes())
    plan = plan_for(model)
    keys = set(source.keys())
    unexpected = sorted(k for k in keys if k not in plan.rules and k not in plan.dropped)
    if unexpected:
        raise UserError(
            f"the checkpoint has {len(unexpected)} key(s) that map to no parameter of {type(model).__name__} "
            f"({model.config.vision_backbone_id}), {_by_part(unexpected)}: is config.json the one of these weights?"
        )
    missing = sorted(k for k in plan.rules if k not in keys)
    if missing:
        raise UserError(f"the checkpoint lacks {len(missing)} key(s) the model needs, {_by_part(missing)}.")
    for key, tensor in source.items(sorted(plan.rules)):
        for target, transform in plan.rules[key]:
            value = transform(tensor)
            _assign(model, target, value, dtype, f"checkpoint key {key!r}")
            report.filled[target] = key
        report.loaded.append(key)
    report.dropped.update({k: plan.dropped[k] for k in sorted(keys) if k in plan.dropped})
    report.built.update(built_by_construction(model))
    return report


def built_by_construction(model: OpenVLA) -> dict[str, str]:
    """What the model holds that no checkpoint key fills, with how it was made (see :class:`LoadReport`)."""
    out: dict[str, str] = {}
    towers = [model.vision_backbone.featurizer, model.vision_backbone.fused_featurizer]
    for prefix, spec, tower in zip(TOWER_PREFIXES, model.config.towers, towers):
        if spec.family == "dinov2" and tower is not None:
            out[f"{prefix}embeddings.position_embeddings[:, 0]"] = "the CLS slot, zeros (timm adds no position to CLS)"
            out[f"{prefix}embeddings.mask_token"] = "left out: transformers uses it only with bool_masked_pos"
    for name, _ in model.named_buffers():
        out[name] = "a non-persistent buffer computed at construction"
    return out


def read_oft_components(path: Path) -> dict[str, tuple[str, dict[str, torch.Tensor]]]:
    """``{"action_head" | "proprio_projector": (file name, state dict without "module.")}`` of a directory."""
    for pattern, what in UNSUPPORTED_COMPONENTS.items():
        found = sorted(path.glob(pattern))
        if found:
            raise UserError(f"{found[0].name}: {what} checkpoints are not supported (L1-regression and discrete OFT are).")
    components = {}
    for name, pattern in (("action_head", ACTION_HEAD_GLOB), ("proprio_projector", PROPRIO_GLOB)):
        found = sorted(p for p in path.glob(pattern) if not p.name.startswith("noisy_"))
        if len(found) > 1:
            raise UserError(f"{path} holds several {name} files {[p.name for p in found]}; keep the one to use.")
        if found:
            state = torch.load(found[0], map_location="cpu", weights_only=True)
            components[name] = (found[0].name, {re.sub(r"^module\.", "", k): v for k, v in state.items()})
    return components


def components_dims(components: Mapping[str, tuple[str, dict[str, torch.Tensor]]]) -> tuple[int, int]:
    """(proprio dim, L1 head action dim) the component files define; 0 where absent."""
    proprio = action = 0
    if "proprio_projector" in components:
        file, state = components["proprio_projector"]
        proprio = int(_require(state, "fc1.weight", file).shape[1])
    if "action_head" in components:
        file, state = components["action_head"]
        action = int(_require(state, "model.fc2.weight", file).shape[0])
    return proprio, action


def fill_components(
    model: OpenVLA, components: Mapping[str, tuple[str, dict[str, torch.Tensor]]], dtype: torch.dtype
) -> None:
    """Load OFT's proprio projector / L1 head from their (prefix-stripped) state dicts, strictly;
    ``components[name] = (file name for messages, state dict)``."""
    for name, (file, state) in components.items():
        module = getattr(model, name)
        expected = set(module.state_dict())
        unexpected, missing = sorted(set(state) - expected), sorted(expected - set(state))
        if unexpected or missing:
            raise UserError(
                f"{file} does not match OFT's {name}: unexpected keys {_listing(unexpected)}, "
                f"missing keys {_listing(missing)}."
            )
        for key, value in state.items():
            _assign(model, f"{name}.{key}", value, dtype, f"{file} key {key!r}")


def image_stats(path: Path, config: VLAConfig) -> tuple[VisionTowerConfig, ...]:
    """The towers with the image mean/std of ``preprocessor_config.json`` when the directory has
    one (the official processor's values, which equal timm's pretrained configs)."""
    file = path / "preprocessor_config.json"
    if not file.is_file():
        return config.towers
    raw: dict[str, Any] = json.loads(file.read_text())
    means, stds = raw.get("means"), raw.get("stds")
    if means is None or stds is None:
        return config.towers
    if len(means) != len(config.towers) or len(stds) != len(config.towers):
        raise UserError(f"{file} has {len(means)} means for {len(config.towers)} vision tower(s).")
    strategy = raw.get("image_resize_strategy", config.image_resize_strategy)
    if strategy != config.image_resize_strategy:
        raise UserError(f"{file} says image_resize_strategy={strategy!r}, config.json {config.image_resize_strategy!r}.")
    return tuple(
        replace(tower, mean=tuple(float(v) for v in m), std=tuple(float(v) for v in s))
        for tower, m, s in zip(config.towers, means, stds)
    )


def check_filled(model: nn.Module) -> None:
    """Every parameter holds checkpoint data (none is left on the meta device)."""
    empty = [name for name, p in model.named_parameters() if p.is_meta]
    if empty:
        raise RuntimeError(f"parameters left unloaded: {empty[:5]}")


def _assign(model: nn.Module, target: str, value: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    module_name, _, leaf = target.rpartition(".")
    module = model.get_submodule(module_name)
    current = module._parameters.get(leaf)
    if current is None:
        raise RuntimeError(f"{target} is not a parameter")
    if tuple(value.shape) != tuple(current.shape):
        raise UserError(
            f"{what} has shape {tuple(value.shape)}, but {target} needs {tuple(current.shape)}; "
            "the checkpoint does not match config.json."
        )
    data = value.to(dtype) if value.is_floating_point() else value
    module._parameters[leaf] = nn.Parameter(data.contiguous().clone(), requires_grad=current.requires_grad)


def _require(state: Mapping[str, torch.Tensor], key: str, file: str) -> torch.Tensor:
    if key not in state:
        raise UserError(f"{file} has no {key!r}; keys: {_listing(sorted(state))}.")
    return state[key]


#: Parts of a checkpoint by key prefix, as messages name them.
_PARTS = (
    (TOWER_PREFIXES[0], "the first vision tower"), (TOWER_PREFIXES[1], "the second vision tower"),
    ("projector.", "the projector"), (LLM_PREFIX, "the Llama"),
)


def _by_part(keys: list[str]) -> str:
    """'12 in the second vision tower (vision_backbone.fused_featurizer.*) and 1 in the projector, e.g. 'k''."""
    counts: dict[str, int] = {}
    for key in keys:
        part = next((f"{name} ({prefix}*)" for prefix, name in _PARTS if key.startswith(prefix)), "elsewhere")
        counts[part] = counts.get(part, 0) + 1
    parts = [f"{n} in {part}" if part != "elsewhere" else f"{n} elsewhere" for part, n in counts.items()]
    listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return f"{listed}, e.g. {keys[0]!r}"


def _listing(keys: list[str], limit: int = 8) -> str:
    if not keys:
        return "none"
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")

