"""Registration of ``pi0`` and ``pi05`` and their ``policy.kwargs`` (πRL's option names).

Light: transformers and the model code load when a policy is built.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from embodied.errors import UserError, did_you_mean
from policies.base import Policy
from policies.config import PolicyConfig
from policies.registry import POLICIES

#: ``policy.kwargs`` of ``pi0`` / ``pi05`` with their defaults (names as RLinf's openpi config).
PI0_KWARGS: dict[str, Any] = {
    "path": None,  # checkpoint directory (LeRobot export or openpi's PyTorch conversion; docs/pi0.md)
    "tiny": None,  # instead of path: a random tiny model, {} or overrides of policies.pi0.tiny.TINY_DEFAULTS
    "tokenizer": None,  # PaliGemma's tokenizer.json (default: the checkpoint's; tiny models: bytes)
    "instruction": "complete the task",  # instruction for observations that carry none
    "cameras": None,  # image keys in input order (None: "rgb" first, then "rgb/<camera>" sorted)
    "noise_method": "flow_sde",  # "flow_sde" (ODE -> SDE, noise_level) or "flow_noise" (a learned std)
    "noise_level": 0.5,  # Flow-SDE's a in sigma_t = a * sqrt(t / (1 - t))
    "noise_logvar_range": [0.08, 0.16],  # Flow-Noise's [min_std, max_std]
    "num_steps": None,  # flow steps per chunk (None: the checkpoint's num_inference_steps)
    "logprob_level": "token",  # "token": (B, C * A) per executed entry, summed over steps; "action": (B,)
    "add_value_head": 1,  # 1: a critic (PPO); 0: none, values None (GRPO)
    "value_after_vlm": None,  # 1: critic on the VLM's prefix features; 0: on the action expert's (None: 1 for pi05)
    "value_vlm_mode": "mean_token",  # prefix pooling for value_after_vlm: mean_token, last_token, first_token
    "train_expert_only": 0,  # 1: the VLM (tower, projector, language model) stays fixed
    "freeze_vision_encoder": 0,  # 1: the SigLIP tower stays fixed
    "lora_rank": 0,  # > 0: LoRA adapters on both Gemmas' projections; their base weights and the tower stay fixed
    "lora_alpha": 16.0,  # LoRA scaling numerator (scale = alpha / rank)
    "dtype": "float32",  # float32, bfloat16 (CUDA), float16, or "config" (the checkpoint's)
}
CHOICES = {
    "noise_method": ("flow_sde", "flow_noise"),
    "logprob_level": ("token", "action"),
    "value_vlm_mode": ("mean_token", "last_token", "first_token"),
    "dtype": ("float32", "bfloat16", "float16", "config"),
}
SWITCHES = ("add_value_head", "train_expert_only", "freeze_vision_encoder")


def parse_kwargs(kwargs: dict[str, Any], policy: str) -> dict[str, Any]:
    """``kwargs`` checked against :data:`PI0_KWARGS`: unknown keys and wrong values are UserErrors."""
    for key in kwargs:
        if key not in PI0_KWARGS:
            raise UserError(f"policy.kwargs.{key} is not understood by policy {policy!r}.{did_you_mean(key, PI0_KWARGS)} "
                            f"Allowed: {', '.join(PI0_KWARGS)}.")
    options = {**PI0_KWARGS, **kwargs}
    for key, value in options.items():
        if key in CHOICES and value not in CHOICES[key]:
            raise UserError(f"policy.kwargs.{key}={value!r} must be one of {', '.join(CHOICES[key])}.")
        if key in SWITCHES and (isinstance(value, bool) or value not in (0, 1)):
            raise UserError(f"policy.kwargs.{key}={value!r} must be 0 or 1 (default {PI0_KWARGS[key]}).")
    if options["value_after_vlm"] not in (None, 0, 1) or isinstance(options["value_after_vlm"], bool):
        raise UserError(f"policy.kwargs.value_after_vlm={options['value_after_vlm']!r} must be 0, 1 or null.")
    rank, alpha = options["lora_rank"], options["lora_alpha"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise UserError(f"policy.kwargs.lora_rank={rank!r} must be a non-negative integer (0: no adapters).")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise UserError(f"policy.kwargs.lora_alpha={alpha!r} must be a positive number.")
    options["lora_alpha"] = float(alpha)
    level = options["noise_level"]
    if isinstance(level, bool) or not isinstance(level, (int, float)) or level < 0:
        raise UserError(f"policy.kwargs.noise_level={level!r} must be a number >= 0.")
    steps = options["num_steps"]
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise UserError(f"policy.kwargs.num_steps={steps!r} must be a positive integer or null.")
    std_range = options["noise_logvar_range"]
    if not (isinstance(std_range, (list, tuple)) and len(std_range) == 2 and 0 < std_range[0] <= std_range[1]):
        raise UserError(f"policy.kwargs.noise_logvar_range={std_range!r} must be [min_std, max_std] with 0 < min <= max.")
    if options["tiny"] is not None and not isinstance(options["tiny"], dict):
        raise UserError(f"policy.kwargs.tiny={options['tiny']!r} must be a mapping of tiny-model sizes ({{}} for the defaults).")
    if (options["path"] is None) == (options["tiny"] is None):
        raise UserError(f"policy {policy!r} needs exactly one of policy.kwargs.path (or policy.path=DIR: a LeRobot or openpi "
                        "PyTorch checkpoint) and policy.kwargs.tiny (a random tiny model: {} or sizes).")
    return options


def _build(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, pi05: bool) -> Policy:
    name = "pi05" if pi05 else "pi0"
    kwargs = cfg.kwargs_with_path()
    options = parse_kwargs(kwargs, name)
    try:
        from policies.pi0.policy import Pi0Policy
    except ImportError as err:
        raise UserError(f"policy {name!r} needs transformers and tokenizers: pip install 'embodied[vla]' ({err}).") from err
    return Pi0Policy(cfg, observation_space, action_space, options, pi05=pi05)


@POLICIES.register("pi0")
def make_pi0(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """π0 (PaliGemma + a Gemma action expert, flow matching), RL through its denoising chain (Flow-SDE / Flow-Noise)."""
    return _build(cfg, observation_space, action_space, pi05=False)


@POLICIES.register("pi05")
def make_pi05(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """π0.5 (adaRMS time conditioning, discrete state tokens), RL through its denoising chain (Flow-SDE / Flow-Noise)."""
    return _build(cfg, observation_space, action_space, pi05=True)
