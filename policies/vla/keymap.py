"""Checkpoint key -> parameter plan: which official (timm-named) tensor fills which parameter.

Official OpenVLA checkpoints keep the vision towers in timm naming (``vision_backbone.featurizer.*``
DINOv2, ``vision_backbone.fused_featurizer.*`` SigLIP, layer scale ``gamma`` renamed to
``scale_factor``). The mapping onto transformers 5 modules (verified to 0.0 difference):

================================  ==========================================================
timm                              transformers
================================  ==========================================================
``cls_token`` / ``reg_token``     ``embeddings.cls_token`` / ``embeddings.register_tokens``
``pos_embed`` (1, N, D)           DINOv2: ``embeddings.position_embeddings`` (1, N + 1, D) with
                                  a zero CLS slot (timm adds none to CLS and registers);
                                  SigLIP: ``embeddings.position_embedding.weight`` (N, D)
``patch_embed.proj``              ``embeddings.patch_embeddings.projection`` / ``embeddings.patch_embedding``
``blocks.i.attn.qkv`` (3D, D)     ``{q,k,v}_proj`` (q, k, v in that order along dim 0); DINOv2 in
                                  transformers 5.17 and before: ``attention.attention.{query,key,value}``
``blocks.i.attn.proj``            ``attention.o_proj`` / ``self_attn.out_proj``; DINOv2 in
                                  transformers 5.17 and before: ``attention.output.dense``
``blocks.i.ls{1,2}.scale_factor``  ``layer_scale{1,2}.lambda1`` (DINOv2)
``blocks.i.norm{1,2}``, ``mlp``    ``norm{1,2}`` / ``layer_norm{1,2}``, ``mlp``
================================  ==========================================================

Dropped on purpose (each one listed by name, so a strict check still catches a miss): the last
block of each tower and its final ``norm`` (OpenVLA reads the second-to-last block), and
SigLIP's attention-pooling head ``attn_pool.*``. Everything else must map 1:1 onto a parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from policies.vla.config import VisionTowerConfig

Transform = Callable[[torch.Tensor], torch.Tensor]

_ATTN_POOL_KEYS = (
    "latent", "q.weight", "q.bias", "kv.weight", "kv.bias", "proj.weight", "proj.bias",
    "norm.weight", "norm.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
)
_BLOCK_KEYS = (
    "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
    "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
)


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _chunk(index: int) -> Transform:
    return lambda t: t.chunk(3, dim=0)[index]


def _dino_positions(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.new_zeros(t.shape[0], 1, t.shape[2]), t], dim=1)  # (1, N + 1, D)


@dataclass
class KeyPlan:
    """``rules[source] = [(parameter, transform), ...]``; ``dropped[source] = reason``."""

    rules: dict[str, list[tuple[str, Transform]]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)

    def map(self, source: str, target: str, transform: Transform = _identity) -> None:
        self.rules.setdefault(source, []).append((target, transform))

    def drop(self, source: str, reason: str) -> None:
        self.dropped[source] = reason

    def identity(self, prefix: str, names: list[str]) -> None:
        for name in names:
            self.map(prefix + name, prefix + name)

    def targets(self) -> set[str]:
        return {target for pairs in self.rules.values() for target, _ in pairs}


#: DINOv2's attention projections as transformers names them: (q, k, v, output) under ``attention.``
#: (transformers 5.24; the rename came after 5.17), and the ``Dinov2SelfAttention`` +
#: ``Dinov2SelfOutput`` layout of 5.17 and earlier releases.
_DINO_ATTENTION = (("q_proj", "k_proj", "v_proj", "o_proj"), ("attention.query", "attention.key", "attention.value", "output.dense"))


def dino_attention_names(module_keys: Collection[str], target: str) -> tuple[str, str, str, str]:
    """The names under ``{target}attention.`` of DINOv2 block ``target``'s q, k, v and output
    projections in the module whose state-dict keys are ``module_keys`` (the installed
    transformers' layout); the newer layout when ``module_keys`` holds neither."""
    for names in _DINO_ATTENTION:
        if f"{target}attention.{names[0]}.weight" in module_keys:
            return names
    return _DINO_ATTENTION[0]


def add_tower(plan: KeyPlan, prefix: str, spec: VisionTowerConfig, module_keys: Collection[str] = ()) -> None:
    """Rules for one timm tower stored under ``prefix`` onto the native module at the same prefix
    (``module_keys``: the module's state-dict keys, to follow the installed transformers' names)."""
    dino = spec.family == "dinov2"
    last = spec.num_layers - 1
    if dino:
        plan.map(prefix + "cls_token", prefix + "embeddings.cls_token")
        if spec.num_register_tokens:
            plan.map(prefix + "reg_token", prefix + "embeddings.register_tokens")
        plan.map(prefix + "pos_embed", prefix + "embeddings.position_embeddings", _dino_positions)
        plan.map(prefix + "patch_embed.proj.weight", prefix + "embeddings.patch_embeddings.projection.weight")
        plan.map(prefix + "patch_embed.proj.bias", prefix + "embeddings.patch_embeddings.projection.bias")
    else:
        plan.map(prefix + "pos_embed", prefix + "embeddings.position_embedding.weight", lambda t: t[0])
        plan.map(prefix + "patch_embed.proj.weight", prefix + "embeddings.patch_embedding.weight")
        plan.map(prefix + "patch_embed.proj.bias", prefix + "embeddings.patch_embedding.bias")
        for key in _ATTN_POOL_KEYS:
            plan.drop(prefix + "attn_pool." + key, "SigLIP's attention-pooling head (OpenVLA uses patch features)")
    for key in ("norm.weight", "norm.bias"):
        plan.drop(prefix + key, "the tower's final norm (OpenVLA reads the second-to-last block, un-normed)")

    block_keys = _BLOCK_KEYS + (("ls1.scale_factor", "ls2.scale_factor") if dino else ())
    for i in range(spec.num_layers):
        source = f"{prefix}blocks.{i}."
        if i == last:
            for key in block_keys:
                plan.drop(source + key, "the tower's last block (OpenVLA reads the second-to-last block)")
            continue
        if dino:
            target = f"{prefix}encoder.layer.{i}."
            q, k, v, out = dino_attention_names(module_keys, target)
            names = {"norm1": "norm1", "norm2": "norm2", "q": f"attention.{q}", "k": f"attention.{k}",
                     "v": f"attention.{v}", "proj": f"attention.{out}", "mlp": "mlp"}
            plan.map(source + "ls1.scale_factor", target + "layer_scale1.lambda1")
            plan.map(source + "ls2.scale_factor", target + "layer_scale2.lambda1")
        else:
            target = f"{prefix}encoder.layers.{i}."
            names = {"norm1": "layer_norm1", "norm2": "layer_norm2", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
                     "v": "self_attn.v_proj", "proj": "self_attn.out_proj", "mlp": "mlp"}
        for param in ("weight", "bias"):
            plan.map(f"{source}norm1.{param}", f"{target}{names['norm1']}.{param}")
            plan.map(f"{source}norm2.{param}", f"{target}{names['norm2']}.{param}")
            plan.map(f"{source}attn.proj.{param}", f"{target}{names['proj']}.{param}")
            plan.map(f"{source}mlp.fc1.{param}", f"{target}mlp.fc1.{param}")
            plan.map(f"{source}mlp.fc2.{param}", f"{target}mlp.fc2.{param}")
            for index, letter in enumerate("qkv"):
                plan.map(f"{source}attn.qkv.{param}", f"{target}{names[letter]}.{param}", _chunk(index))


def model_plan(towers: tuple[VisionTowerConfig, ...], projector_keys: list[str], llm_keys: list[str], llm_layers: int,
               vision_keys: Collection[str] = ()) -> KeyPlan:
    """The plan of a whole OpenVLA checkpoint (``model*.safetensors``).

    projector_keys / llm_keys: the module's own state-dict names under ``projector.`` and
    ``language_model.`` (the checkpoint uses the same names); vision_keys: its names under
    ``vision_backbone.`` (full keys), which say how the installed transformers names the towers.
    """
    plan = KeyPlan()
    add_tower(plan, "vision_backbone.featurizer.", towers[0], vision_keys)
    if len(towers) == 2:
        add_tower(plan, "vision_backbone.fused_featurizer.", towers[1], vision_keys)
    plan.identity("projector.", projector_keys)
    plan.identity("language_model.", llm_keys)
    for i in range(llm_layers):  # only written by transformers versions that kept it persistent
        plan.drop(f"language_model.model.layers.{i}.self_attn.rotary_emb.inv_freq", "rotary frequencies (recomputed)")
    return plan
