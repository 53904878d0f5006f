"""Registration of ``openvla`` and ``openvla_oft`` and their ``policy.kwargs``.

This module imports nothing heavy: transformers, peft and the model code load when a policy is
built, so the registry (and ``embodied recipes --all``) works without the ``vla`` extra.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from embodied.errors import UserError, did_you_mean
from policies.base import Policy
from policies.config import PolicyConfig
from policies.registry import POLICIES

#: ``policy.kwargs`` of ``openvla``, with their defaults.
VLA_KWARGS: dict[str, Any] = {
    "path": None,  # checkpoint directory in the official layout (config.json, safetensors, tokenizer.json, ...)
    "tiny": None,  # instead of path: a random tiny model, {} or overrides of policies.vla.tiny.TINY_DEFAULTS
    "unnorm_key": None,  # dataset whose statistics unnormalize actions (None: the checkpoint's only one)
    "instruction": "complete the task",  # instruction for observations that carry none
    "cameras": None,  # image keys in input order (None: "rgb" first, then "rgb/<camera>" sorted)
    "center_crop": 0,  # 1: 0.9-area center crop (checkpoints trained with image augmentation)
    "image_backend": "pil",  # bicubic resize: "pil" (Image.resize on uint8, the official processor's) or "torch"
    "temperature": 1.0,  # action-token sampling temperature (act and evaluate)
    "top_k": 0,  # sample among the k most likely action tokens (0: all 256)
    "logprob_level": "token",  # "token": logprobs (B, C * A) with a mask; "action": summed, (B,)
    "value_head": 1,  # 1: a critic on the last prompt token (PPO); 0: none, values None (GRPO)
    "lora_rank": 0,  # > 0: LoRA adapters on the language model, everything else frozen but the value head
    "lora_alpha": 16.0,  # LoRA scaling numerator (scale = alpha / rank)
    "lora_targets": "all-linear",  # peft target_modules: "all-linear" or a list of module names
    "freeze_vision": 0,  # 1: keep the vision towers fixed in a full fine-tune (lora_rank 0)
    "gradient_checkpointing": 0,  # 1: recompute activations in backward (towers and language model)
    "dtype": "float32",  # weights: float32, bfloat16 (CUDA), float16, or "config" (the checkpoint's)
    "attn_implementation": "sdpa",  # transformers attention: "sdpa" or "eager"
}
#: ``policy.kwargs`` of ``openvla_oft``: those of ``openvla`` and the evaluation head.
OFT_KWARGS: dict[str, Any] = {
    **VLA_KWARGS,
    "eval_head": "discrete",  # deterministic act: "discrete" (greedy tokens) or "l1" (the checkpoint's L1 head)
    "tiny_l1_head": 0,  # tiny models: 1 adds an L1 regression head
    "tiny_proprio": 0,  # tiny models: 1 adds a proprio projector of the observation's state size
}
CHOICES: dict[str, tuple[str, ...]] = {
    "image_backend": ("pil", "torch"),
    "logprob_level": ("token", "action"),
    "dtype": ("float32", "bfloat16", "float16", "config"),
    "attn_implementation": ("sdpa", "eager"),
    "eval_head": ("discrete", "l1"),
}
SWITCHES = ("center_crop", "value_head", "freeze_vision", "gradient_checkpointing", "tiny_l1_head", "tiny_proprio")


def parse_kwargs(kwargs: dict[str, Any], defaults: dict[str, Any], policy: str) -> dict[str, Any]:
    """``kwargs`` checked against ``defaults``: unknown keys and wrong types are UserErrors."""
    for key in kwargs:
        if key not in defaults:
            raise UserError(
                f"policy.kwargs.{key} is not understood by policy {policy!r}.{did_you_mean(key, defaults)} "
                f"Allowed: {', '.join(defaults)}."
            )
    options = {**defaults, **kwargs}
    for key, value in options.items():
        default = defaults[key]
        if key in SWITCHES:
            if isinstance(value, bool) or value not in (0, 1):
                raise UserError(f"policy.kwargs.{key}={value!r} must be 0 or 1 (default {default}).")
        elif key in CHOICES:
            if value not in CHOICES[key]:
                raise UserError(f"policy.kwargs.{key}={value!r} must be one of {', '.join(CHOICES[key])}.")
        elif key in ("top_k", "lora_rank"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"policy.kwargs.{key}={value!r} must be a non-negative integer (default {default}).")
        elif key in ("temperature", "lora_alpha"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UserError(f"policy.kwargs.{key}={value!r} must be a positive number (default {default}).")
            options[key] = float(value)
        elif key in ("path", "unnorm_key"):
            if value is not None and not isinstance(value, str):
                raise UserError(f"policy.kwargs.{key}={value!r} must be a string.")
        elif key == "instruction":
            if not isinstance(value, str) or not value.strip():
                raise UserError(f"policy.kwargs.instruction={value!r} must be a non-empty string.")
        elif key == "cameras":
            if value is not None and (not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value)):
                raise UserError(f"policy.kwargs.cameras={value!r} must be a list of image keys such as ['rgb'].")
        elif key == "lora_targets":
            if not isinstance(value, str) and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
                raise UserError(f"policy.kwargs.lora_targets={value!r} must be 'all-linear' or a list of module names.")
        elif key == "tiny":
            if value is not None and not isinstance(value, dict):
                raise UserError(f"policy.kwargs.tiny={value!r} must be a mapping of tiny-model sizes ({{}} for the defaults).")
    if (options["path"] is None) == (options["tiny"] is None):
        raise UserError(
            f"policy {policy!r} needs exactly one of policy.kwargs.path (or policy.path=DIR: an OpenVLA checkpoint "
            "directory in the official layout) and policy.kwargs.tiny (a random tiny model: {} or sizes such as "
            "{llm_width: 64})."
        )
    return options


def _build(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, oft: bool) -> Policy:
    name = "openvla_oft" if oft else "openvla"
    kwargs = cfg.kwargs_with_path()
    options = parse_kwargs(kwargs, OFT_KWARGS if oft else VLA_KWARGS, name)
    try:
        from policies.vla.policy import OpenVLAOFTPolicy, OpenVLAPolicy
    except ImportError as err:
        raise UserError(f"policy {name!r} needs transformers, tokenizers and peft: pip install 'embodied[vla]' ({err}).") from err
    policy_class = OpenVLAOFTPolicy if oft else OpenVLAPolicy
    return policy_class(cfg, observation_space, action_space, options)


@POLICIES.register("openvla")
def make_openvla(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """OpenVLA (Prismatic DINOv2+SigLIP + Llama-2): C * A action tokens decoded one by one with a KV cache."""
    return _build(cfg, observation_space, action_space, oft=False)


@POLICIES.register("openvla_oft")
def make_openvla_oft(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """OpenVLA-OFT: a whole action chunk in one bidirectional forward pass (discrete head; L1 head for eval)."""
    return _build(cfg, observation_space, action_space, oft=True)
