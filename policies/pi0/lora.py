"""LoRA adapters on π0's two Gemmas (openpi's ``gemma_2b_lora`` / ``gemma_300m_lora`` fine-tunes).

``apply_lora`` injects rank-r adapters in place (peft ``inject_adapter_in_model``: the modules
keep their names, so the shared-attention layer loop calls them unchanged) on every attention
and MLP projection of the language model and the action expert; Gaussian A, zero B (the adapted
model starts equal to the base), no dropout (PPO's ratio needs act and evaluate to be one
function). With adapters the Gemmas' base weights and the vision tower stay fixed; the adapters,
the small projections (action in/out, state, time MLPs) and the heads train.
"""

from __future__ import annotations

from embodied.errors import UserError
from policies.pi0.model import Pi0Model

#: The Gemma projections that get adapters, in both stacks.
GEMMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGETS = r".*(paligemma\.language_model|gemma_expert)\.layers\.\d+\.(self_attn|mlp)\.(" + "|".join(GEMMA_LINEARS) + ")"


def apply_lora(model: Pi0Model, rank: int, alpha: float) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    if has_lora(model):
        raise ValueError("the model already has LoRA adapters")
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=TARGETS, lora_dropout=0.0, bias="none",
                        init_lora_weights="gaussian")
    try:
        inject_adapter_in_model(config, model)
    except ValueError as err:
        raise UserError(f"policy.kwargs.lora_rank={rank}: {err}") from err


def has_lora(model: Pi0Model) -> bool:
    return any("lora_" in name for name, _ in model.named_parameters())


def is_gemma_base(name: str) -> bool:
    """A Gemma base weight (frozen under LoRA): the language model's or the expert's, not an adapter."""
    return name.startswith(("paligemma.language_model.", "gemma_expert.")) and "lora_" not in name
