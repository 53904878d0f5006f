"""``policy.kwargs`` of the ``causal_lm`` policy, and its registration.

This module imports neither torch's model code nor transformers: ``policies.models`` imports it to
register ``causal_lm`` on every run, and transformers (the ``reasoning`` extra) is loaded only when
the policy is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym

from embodied.config import build_config, to_dict
from embodied.errors import UserError
from policies.base import Policy
from policies.config import PolicyConfig
from policies.registry import POLICIES


@dataclass
class CausalLMOptions:
    """The ``policy.kwargs`` of ``causal_lm``: which model, how it samples, how it trains."""

    model_path: str = ""
    """Local Hugging Face causal-LM directory (config.json, weights, tokenizer files). Required.
    Loaded with local files only; ``policies.lm.tiny.write_tiny_model`` writes a tiny one."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Parameter dtype; ``auto`` takes the checkpoint's. Logprobs are always computed in float32."""
    trust_remote_code: bool = False
    """Allow model code shipped in the directory (needed by some non-transformers architectures)."""
    attn_implementation: str = "sdpa"
    """transformers attention kernel: ``sdpa``, ``eager`` or ``flash_attention_2`` (CUDA)."""
    max_new_tokens: int = 16
    """K: tokens generated per response; responses are padded to K."""
    temperature: float = 1.0
    """Sampling temperature (> 0); training divides the logits by the same value."""
    top_k: int = 0
    """Top-k filtering; 0 is off (transformers would default to 50 if it were left unset)."""
    top_p: float = 1.0
    """Top-p (nucleus) filtering in (0, 1]; 1.0 is off."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """``auto``: chat-message prompts go through the tokenizer's chat template when it has one,
    string prompts are used as they are; ``on``: every prompt (strings as one user message) goes
    through the template, which must exist; ``off``: never (message contents are joined by newlines)."""
    lora_rank: int = 0
    """LoRA rank; 0 trains every parameter, > 0 wraps the model with peft and trains only adapters."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input. Keep 0 for RL: rollout and training must compute the same function."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names that get adapters (peft's ``target_modules``); ``["all-linear"]``: every linear
    layer but the output head."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, for a second forward pass of compute)."""

    def validate(self) -> None:
        """UserError naming the key for a value out of range."""
        if not self.model_path:
            raise UserError(
                "policy.kwargs.model_path is required for policy 'causal_lm': a local Hugging Face model directory "
                "(config.json, weights, tokenizer files). policies.lm.tiny.write_tiny_model writes a tiny one."
            )
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 1, "a positive integer"),
            ("temperature", self.temperature > 0, "> 0 (greedy decoding is act(deterministic=True))"),
            ("top_k", self.top_k >= 0, ">= 0 (0: off)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1] (1.0: off)"),
            ("lora_rank", self.lora_rank >= 0, ">= 0 (0: no LoRA)"),
            ("lora_alpha", self.lora_alpha > 0, "> 0"),
            ("lora_dropout", 0.0 <= self.lora_dropout < 1.0, "in [0, 1)"),
            ("lora_target_modules", bool(self.lora_target_modules), "a non-empty list of module names"),
        ]
        for key, ok, expected in checks:
            if not ok:
                raise UserError(f"policy.kwargs.{key}={getattr(self, key)!r} must be {expected}.")


#: Every ``policy.kwargs`` key of ``causal_lm`` with its default.
CAUSAL_LM_DEFAULTS: dict[str, Any] = to_dict(CausalLMOptions())


def parse_options(kwargs: dict[str, Any]) -> CausalLMOptions:
    """``policy.kwargs`` -> validated options; an unknown key is a UserError with a did-you-mean."""
    options = build_config(CausalLMOptions, dict(kwargs), prefix="policy.kwargs")
    options.validate()
    return options


@POLICIES.register("causal_lm")
def make_causal_lm(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """A local Hugging Face causal LM generating token responses (reasoning GRPO)."""
    del observation_space, action_space  # prompts and responses are token ids of any length
    options = parse_options(cfg.kwargs)
    try:
        from policies.lm.policy import CausalLMPolicy
    except ImportError as err:
        raise UserError(
            f"policy 'causal_lm' needs transformers and peft ({err}); install the reasoning extra: "
            "pip install 'embodied[reasoning]'."
        ) from None
    return CausalLMPolicy(options)
