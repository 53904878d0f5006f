"""A causal language model from a local Hugging Face directory as a token-level policy.

Observations are left-padded prompts; actions are response token ids (B, K), K = max_new_tokens:

    obs = {"prompt_ids": (B, P) long, left-padded, "prompt_mask": (B, P) bool}
    act(obs)               -> ActionOutput(actions (B, K), logprobs (B, K), values=None, mask (B, K))
    evaluate(obs, actions) -> Evaluation(logprobs (B, K), entropy (B, K), values=None)

* ``act`` runs ``generate`` (batched, KV cache) with the position ids of the left-padded batch and
  records each sampled token's logprob under the processed distribution (temperature, top-k,
  top-p: :mod:`policies.lm.sampling`). Every generation setting that changes the distribution is
  passed explicitly; the checkpoint's ``generation_config`` contributes only its EOS/BOS/PAD ids
  (a Qwen-Instruct checkpoint's ``repetition_penalty`` or ``top_k=20`` would otherwise sneak in).
* ``evaluate`` scores given responses in ONE teacher-forced pass with the same position ids and
  the same warpers, so on-policy ratios are 1 up to float error.
* ``mask`` is True up to and including the first EOS (any id of the generation config's EOS list),
  found by position. Entries outside the mask (after the EOS; padding to K) have logprob 0 and
  entropy 0, so they never produce NaN or -inf in a loss.

The model runs in eval mode inside ``act`` (no dropout, KV cache on even with gradient
checkpointing) and in the caller's mode in ``evaluate``; a model with dropout layers therefore
needs ``policy.eval()`` for exact ratios.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessorList

from embodied.errors import UserError
from policies.base import ActionOutput, Evaluation, Policy
from policies.lm.options import CausalLMOptions
from policies.lm.sampling import (
    LogprobRecorder,
    SamplingSettings,
    position_ids,
    processed_logprobs,
    response_mask,
    truncated,
)

#: A prompt: plain text, or chat messages ``[{"role": ..., "content": ...}, ...]``.
Prompt = str | Sequence[dict[str, str]]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class CausalLMPolicy(Policy):
    """``AutoModelForCausalLM`` + ``AutoTokenizer`` from ``options.model_path`` (local files only)."""

    has_critic = False
    action_chunk = 1

    def __init__(self, options: CausalLMOptions) -> None:
        super().__init__()
        self.options = options
        path = Path(options.model_path).expanduser()
        if not (path / "config.json").is_file():
            raise UserError(
                f"policy.kwargs.model_path={options.model_path!r} is not a Hugging Face model directory "
                "(no config.json there). Point it at a local directory written by save_pretrained."
            )
        load = {"local_files_only": True, "trust_remote_code": options.trust_remote_code}
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, **load)
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=_DTYPES[options.dtype], attn_implementation=options.attn_implementation, **load
            )
        except (OSError, ValueError) as err:
            raise UserError(f"cannot load the causal LM in {str(path)!r}: {err}") from None

        # The checkpoint's generation config gives the special ids only; sampling is ours.
        self.source_generation_config = copy.deepcopy(model.generation_config)
        self.eos_token_ids = _eos_ids(model.generation_config, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        model.generation_config = GenerationConfig(
            bos_token_id=model.generation_config.bos_token_id,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
        )
        if options.gradient_checkpointing:
            # transformers >= 5.x names it activation checkpointing; the old name warns.
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable({"use_reentrant": False})
        if options.lora_rank > 0:
            model = _with_lora(model, options)
        self.model = model
        self.register_buffer("eos_ids", torch.tensor(self.eos_token_ids, dtype=torch.long), persistent=False)
        self.sampling = SamplingSettings(options.temperature, options.top_k, options.top_p)
        self.max_new_tokens = options.max_new_tokens
        self._warpers = self.sampling.warpers()

    # -- prompts and responses as text --------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.eos_ids.device

    def encode_prompts(self, prompts: Sequence[Prompt]) -> dict[str, torch.Tensor]:
        """Prompts -> ``{"prompt_ids": (B, P) long, "prompt_mask": (B, P) bool}``, left-padded with the
        pad id, on the policy's device. Chat messages go through the chat template (``chat_template``)."""
        if isinstance(prompts, str):
            raise UserError("encode_prompts takes a list of prompts, not one string; wrap it in a list.")
        rows: list[list[int]] = []
        for i, prompt in enumerate(prompts):
            ids = prompt_token_ids(self.tokenizer, prompt, self.options.chat_template, self.options.model_path)
            if not ids:
                raise UserError(f"prompt {i} encodes to no tokens; every prompt needs at least one.")
            rows.append(ids)
        if not rows:
            raise UserError("encode_prompts got no prompts.")
        width = max(len(r) for r in rows)
        prompt_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, ids in enumerate(rows):
            prompt_ids[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            prompt_mask[i, width - len(ids):] = True
        return {"prompt_ids": prompt_ids.to(self.device), "prompt_mask": prompt_mask.to(self.device)}

    def response_mask(self, actions: torch.Tensor) -> torch.Tensor:
        """(B, K) bool: response tokens up to and including the first EOS."""
        return response_mask(actions, self.eos_ids)

    def truncated(self, actions: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the response has no EOS (it was cut at max_new_tokens)."""
        return truncated(actions, self.eos_ids)

    def response_lengths(self, actions: torch.Tensor) -> torch.Tensor:
        """(B,) long: tokens in each response, its EOS included."""
        return self.response_mask(actions).sum(dim=1)

    def decode(self, actions: torch.Tensor, mask: torch.Tensor | None = None) -> list[str]:
        """Response texts: the tokens under ``mask`` (default: up to the first EOS), without the EOS
        and without special tokens."""
        mask = self.response_mask(actions) if mask is None else mask.bool()
        texts = []
        for ids, keep in zip(actions.tolist(), mask.tolist()):
            kept = [t for t, k in zip(ids, keep) if k]
            if kept and kept[-1] in self.eos_token_ids:
                kept = kept[:-1]
            texts.append(self.tokenizer.decode(kept, skip_special_tokens=True))
        return texts

    # -- the Policy contract ------------------------------------------------------------------------

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActionOutput:
        """Sample one response per prompt (greedy when ``deterministic``) with ``generate``.

        Returns actions (B, K) (padded with the pad id after the EOS or the end of generation),
        logprobs (B, K) under the processed distribution (0 outside the mask), mask (B, K).
        """
        prompt_ids, prompt_mask = self._prompts(obs)
        batch, width = prompt_ids.shape
        steps = self.max_new_tokens
        self._check_length(width + steps)
        recorder = LogprobRecorder()
        processors = LogitsProcessorList([*self._warpers, recorder])
        # The warpers above apply the real settings, in act and in evaluate; generate must add none
        # (left unset, top_k would become 50). Greedy decoding adds no warpers of its own.
        neutral = {} if deterministic else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            **self._special_ids(), do_sample=not deterministic, max_new_tokens=steps, use_cache=True, **neutral
        )
        with self._eval_mode():
            sequences = self.model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask.long(),
                position_ids=position_ids(prompt_mask),
                generation_config=config,
                logits_processor=processors,
            )
        generated = sequences[:, width:]  # (B, K'), K' <= K when every row stopped early
        logprobs = recorder.finish(generated)
        actions = torch.full((batch, steps), self.pad_token_id, dtype=torch.long, device=generated.device)
        actions[:, : generated.shape[1]] = generated
        padded_logprobs = torch.zeros(batch, steps, device=generated.device)
        padded_logprobs[:, : generated.shape[1]] = logprobs
        mask = self.response_mask(actions)
        return ActionOutput(actions=actions, logprobs=padded_logprobs * mask, values=None, mask=mask)

    def evaluate(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> Evaluation:
        """Logprobs and entropies (B, K) of ``actions`` under the processed distribution, from one
        teacher-forced forward pass over [prompt ; response]; 0 outside the response mask."""
        prompt_ids, prompt_mask = self._prompts(obs)
        actions = torch.as_tensor(actions, device=prompt_ids.device).long()
        if actions.ndim != 2 or actions.shape[0] != prompt_ids.shape[0]:
            raise ValueError(
                f"evaluate: actions must be (B, K) = ({prompt_ids.shape[0]}, K) response ids, got {tuple(actions.shape)}"
            )
        steps = actions.shape[1]
        self._check_length(prompt_ids.shape[1] + steps)
        input_ids = torch.cat([prompt_ids, actions], dim=1)  # (B, P + K)
        attention = torch.cat([prompt_mask, torch.ones_like(actions, dtype=torch.bool)], dim=1)  # (B, P + K)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention.long(),
            position_ids=position_ids(attention),
            use_cache=False,
            logits_to_keep=steps + 1,
        ).logits[:, :-1]  # (B, K, V): the logits at P - 1 .. P + K - 2 predict the K response tokens
        logprobs, entropy = processed_logprobs(logits, actions, self._warpers)
        mask = self.response_mask(actions)
        zero = torch.zeros((), device=logprobs.device)
        return Evaluation(logprobs=torch.where(mask, logprobs, zero), entropy=torch.where(mask, entropy, zero), values=None)

    # -- weights --------------------------------------------------------------------------------------

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters that train (only the LoRA adapters when ``lora_rank`` > 0) by their names in
        this policy: what a weight sync to the rollout must carry. Detached views of the live
        parameters, like ``state_dict()``: clone them to keep a snapshot."""
        return {name: p.detach() for name, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``trainable_state_dict()``-shaped tensors into the trainable parameters (in place)."""
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise ValueError(
                f"trainable state does not match this policy: missing {missing[:5]} ({len(missing)}), "
                f"unexpected {unexpected[:5]} ({len(unexpected)})"
            )
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(state[name])

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the model (LoRA adapters merged into a copy) and tokenizer as a Hugging Face directory
        that ``policy.kwargs.model_path`` can load, with the checkpoint's own generation config."""
        directory = Path(directory)
        model = self.model
        if self.options.lora_rank > 0:
            model = copy.deepcopy(model).merge_and_unload()
        saved_config = model.generation_config
        model.generation_config = self.source_generation_config
        try:
            model.save_pretrained(directory)
        finally:
            model.generation_config = saved_config
        self.tokenizer.save_pretrained(directory)
        return directory

    # -- helpers --------------------------------------------------------------------------------------

    def _special_ids(self) -> dict[str, Any]:
        return {
            "bos_token_id": self.model.generation_config.bos_token_id,
            "eos_token_id": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
        }

    def _prompts(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Validated (prompt_ids (B, P) long, prompt_mask (B, P) bool) on the policy's device."""
        missing = [k for k in ("prompt_ids", "prompt_mask") if k not in obs]
        if missing:
            raise ValueError(
                f"causal_lm observations need 'prompt_ids' and 'prompt_mask' (encode_prompts makes them); "
                f"missing {missing}, got {sorted(obs)}"
            )
        ids = torch.as_tensor(obs["prompt_ids"], device=self.device).long()
        mask = torch.as_tensor(obs["prompt_mask"], device=self.device).bool()
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise ValueError(
                f"prompt_ids and prompt_mask must both be (B, P); got {tuple(ids.shape)} and {tuple(mask.shape)}"
            )
        if not mask.any(dim=1).all():
            raise ValueError("every prompt needs at least one real token (a prompt_mask row is all False)")
        if (mask[:, 1:].long() < mask[:, :-1].long()).any():
            raise ValueError("prompts must be left-padded: in each prompt_mask row no False may follow a True")
        return ids, mask

    def _check_length(self, total: int) -> None:
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and total > limit:
            raise UserError(
                f"prompt + response = {total} tokens exceeds the model's max_position_embeddings={limit}; "
                "shorten the prompts or lower policy.kwargs.max_new_tokens."
            )

    @contextmanager
    def _eval_mode(self) -> Iterator[None]:
        was_training = self.training
        self.eval()
        try:
            yield
        finally:
            self.train(was_training)


def load_tokenizer(options: CausalLMOptions) -> Any:
    """The tokenizer of ``options.model_path`` alone (no weights loaded): enough to count prompt
    tokens before a run starts."""
    path = Path(options.model_path).expanduser()
    if not (path / "config.json").is_file():
        raise UserError(
            f"policy.kwargs.model_path={options.model_path!r} is not a Hugging Face model directory "
            "(no config.json there). Point it at a local directory written by save_pretrained."
        )
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=options.trust_remote_code)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load the tokenizer in {str(path)!r}: {err}") from None


def render_prompt(tokenizer: Any, prompt: Prompt, chat_template: str, model_path: str = "") -> tuple[str, bool]:
    """The text ``prompt`` becomes under ``chat_template`` (``auto``/``on``/``off``, as the option
    says), and whether it is templated (then the tokenizer adds no special tokens of its own)."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else _messages(prompt)
    if chat_template == "on" or (chat_template == "auto" and has_template and not isinstance(prompt, str)):
        if not has_template:
            raise UserError(
                f"policy.kwargs.chat_template='on' but the tokenizer in {model_path!r} has no chat "
                "template; use 'auto' or 'off', or add a chat_template to its tokenizer_config.json."
            )
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), True
    if isinstance(prompt, str):
        return prompt, False
    return "\n".join(m["content"] for m in messages), False


def prompt_token_ids(tokenizer: Any, prompt: Prompt, chat_template: str, model_path: str = "") -> list[int]:
    """The token ids of one prompt as ``encode_prompts`` feeds it to the model (unpadded)."""
    text, templated = render_prompt(tokenizer, prompt, chat_template, model_path)
    return list(tokenizer(text, add_special_tokens=not templated)["input_ids"])


def _messages(prompt: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    messages = list(prompt)
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or not isinstance(message.get("content"), str):
            raise UserError(
                f"a chat prompt is a list of {{'role': ..., 'content': str}} messages; message {i} is {message!r}."
            )
    if not messages:
        raise UserError("a chat prompt has no messages.")
    return messages


def _eos_ids(generation_config: GenerationConfig, tokenizer: Any) -> list[int]:
    """Every EOS id: the generation config's (an int or a list), else the tokenizer's."""
    eos = generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise UserError("the model has no EOS token id (neither in generation_config.json nor in the tokenizer).")
    ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return list(dict.fromkeys(ids))


def _with_lora(model: torch.nn.Module, options: CausalLMOptions) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = options.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = LoraConfig(
        r=options.lora_rank,
        lora_alpha=options.lora_alpha,
        lora_dropout=options.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise UserError(f"policy.kwargs.lora_target_modules={options.lora_target_modules!r}: {err}") from None
