"""LoRA adapters on OpenVLA's language model through peft.

``apply_lora`` wraps ``model.language_model`` with ``get_peft_model`` (``all-linear`` by default:
every Linear of the Llama except ``lm_head``), Gaussian init of A and zero B (the adapted model
starts equal to the base), no dropout (PPO's ratio needs act and evaluate to be one function).
peft freezes the base weights; the caller decides what else trains. ``merge_lora`` folds the
adapters into the base weights (``merge_and_unload``): the same function up to float rounding
("algebraically equal, not bitwise").
"""

from __future__ import annotations

import warnings

from embodied.errors import UserError
from policies.vla.model import OpenVLA


def apply_lora(model: OpenVLA, rank: int, alpha: float, targets: str | list[str]) -> None:
    """Wrap the language model with rank-``rank`` adapters on ``targets`` (a peft target spec)."""
    from peft import LoraConfig, get_peft_model

    if has_lora(model):
        raise ValueError("the language model already has LoRA adapters")
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none", init_lora_weights="gaussian"
    )
    try:
        with warnings.catch_warnings():  # peft probes transformers' deprecated ``is_gradient_checkpointing``
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model.language_model = get_peft_model(model.language_model, config)
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        raise UserError(f"policy.kwargs.lora_targets={targets!r}: {err}") from err


def has_lora(model: OpenVLA) -> bool:
    return hasattr(model.language_model, "merge_and_unload")


def merge_lora(model: OpenVLA) -> None:
    """Fold the adapters into the base weights and remove them."""
    if not has_lora(model):
        raise ValueError("the language model has no LoRA adapters to merge")
    model.language_model = model.language_model.merge_and_unload()
