"""OpenVLA (Prismatic) from transformers' native classes: towers + projector + ``LlamaForCausalLM``.

Parameter names equal the official checkpoint's (``vision_backbone.*`` after the timm -> HF
mapping of ``policies.vla.keymap``, ``projector.fc*``, ``language_model.*``).

**Sequence layout.** The projected patches go right after BOS (Prismatic's ``cat([emb[:, :1],
patches, emb[:, 1:]])``). A batch of prompts of different lengths is padded *between* the prefix
and the prompt, so that every prompt ends in the same column and BOS stays in column 0::

    [BOS, patches (image 1, image 2, ...; OFT: + proprio), PAD ... PAD, prompt ..., "▁" | actions ...]

The attention mask hides the pads and ``position_ids = cumsum(mask) - 1`` gives every real token
the position it has without padding (RLinf moves BOS to column 0 for the same reason: no query
row is fully masked), so a padded batch computes what each sample computes alone.

**Decoding.** :meth:`OpenVLA.generate` runs the prefix once with a key/value cache and then one
token per step (C * A action tokens for a chunk of C actions); :meth:`OpenVLA.score` is the
teacher-forced pass over ``[prefix, prompt, tokens[:-1]]`` that computes the same logits at once.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, LlamaForCausalLM, LlamaModel

from policies.vla.actions import ActionTokenizer
from policies.vla.config import VLAConfig
from policies.vla.processor import PromptBatch
from policies.vla.sampling import Sampler, gather
from policies.vla.vision import PrismaticProjector, PrismaticVisionBackbone

#: the name under which LlamaModel.forward takes the KV cache: ``cache`` from transformers 5.24
#: (``past_key_values`` still accepted there with a warning per call, until 5.40), before it
#: ``past_key_values``
CACHE_KWARG = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


@dataclass
class SequenceInputs:
    """One LLM input: embeddings (B, L, H), attention mask (B, L) long, position ids (B, L)."""

    embeds: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor


@dataclass
class Generated:
    """What :meth:`OpenVLA.generate` decoded.

    tokens:        (B, K) long action token ids;
    log_probs:     (B, K) processed log-probability of each token given the ones before;
    prompt_hidden: (B, H) last-layer hidden state of the last prompt token (value head input).
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor
    prompt_hidden: torch.Tensor


class OpenVLA(nn.Module):
    """The Prismatic VLM with OpenVLA's action tokens."""

    def __init__(self, config: VLAConfig, attn_implementation: str = "sdpa") -> None:
        super().__init__()
        self.config = config
        llama_config = config.llama_config(attn_implementation)
        self.vision_backbone = PrismaticVisionBackbone(config.towers, attn_implementation)
        self.projector = PrismaticProjector(config.use_fused_vision_backbone, config.vision_dim, llama_config.hidden_size)
        self.language_model: nn.Module = LlamaForCausalLM(llama_config)
        self.action_tokenizer = ActionTokenizer(config.vocab_size, config.n_action_bins)

    # -- parts -------------------------------------------------------------------------------------

    @property
    def llm(self) -> LlamaForCausalLM:
        """The Llama model, also when peft has wrapped ``language_model`` with LoRA adapters."""
        model = self.language_model
        get_base = getattr(model, "get_base_model", None)
        return get_base() if get_base is not None else model

    @property
    def hidden_size(self) -> int:
        return int(self.llm.config.hidden_size)

    @property
    def dtype(self) -> torch.dtype:
        return self.projector.fc1.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.projector.fc1.weight.device

    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Pixel values (B, N, 3 * towers, S, S) of N images -> patch embeddings (B, N * P, H)."""
        batch, images = pixel_values.shape[:2]
        features = self.vision_backbone(pixel_values.flatten(0, 1).to(self.dtype))  # (B * N, P, vision_dim)
        embeddings = self.projector(features)  # (B * N, P, H)
        return embeddings.reshape(batch, images * embeddings.shape[1], embeddings.shape[2])

    def prefix(self, pixel_values: torch.Tensor, proprio: torch.Tensor | None = None) -> torch.Tensor:
        """What goes between BOS and the prompt: the patch embeddings of every image (B, N * P, H).
        (OpenVLA has no proprio input; OpenVLA-OFT appends its proprio token.)"""
        return self.embed_images(pixel_values)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, L) -> input embeddings (B, L, H)."""
        return self.llm.get_input_embeddings()(ids)

    # -- sequences ----------------------------------------------------------------------------------

    def sequence(self, prefix: torch.Tensor, prompt: PromptBatch, suffix: torch.Tensor | None = None) -> SequenceInputs:
        """``[BOS, prefix, PAD..., prompt, suffix]`` with its mask and positions.

        prefix: (B, P, H) patch (and proprio) embeddings; suffix: (B, K, H) or None.
        """
        batch = prefix.shape[0]
        parts = [self.embed_tokens(prompt.bos), prefix, self.embed_tokens(prompt.ids)]
        masks = [torch.ones(batch, 1 + prefix.shape[1], dtype=torch.long, device=prefix.device), prompt.mask.long()]
        if suffix is not None:
            parts.append(suffix.to(prefix.dtype))
            masks.append(torch.ones(batch, suffix.shape[1], dtype=torch.long, device=prefix.device))
        mask = torch.cat(masks, dim=1)  # (B, L)
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # pads repeat their neighbour's position; they are masked
        return SequenceInputs(torch.cat(parts, dim=1), mask, positions)

    def decode(
        self, inputs: SequenceInputs, cache: DynamicCache | None = None, bidirectional: bool = False
    ) -> torch.Tensor:
        """Last-layer hidden states (B, L, H) after the final norm; extends ``cache`` when given.

        ``bidirectional`` runs every layer without the causal mask (``is_causal=False`` per call,
        OpenVLA-OFT's parallel decoding).
        """
        kwargs = {"is_causal": False} if bidirectional else {}
        out = self.llm.model(
            inputs_embeds=inputs.embeds, attention_mask=inputs.mask, position_ids=inputs.positions,
            use_cache=cache is not None, **{CACHE_KWARG: cache}, **kwargs,
        )
        return out.last_hidden_state

    def action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., H) -> logits (..., n_bins) float32 of the action ids [V - n_bins, V)."""
        first = self.action_tokenizer.first_id
        return self.llm.lm_head(hidden)[..., first : self.action_tokenizer.vocab_size].float()

    def forward(self, pixel_values: torch.Tensor, prompt: PromptBatch, suffix_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary (B, L, vocab) of ``[BOS, patches, PAD..., prompt, suffix_ids]``."""
        suffix = self.embed_tokens(suffix_ids) if suffix_ids is not None else None
        hidden = self.decode(self.sequence(self.embed_images(pixel_values), prompt, suffix))
        return self.llm.lm_head(hidden)

    # -- autoregressive actions (OpenVLA) -----------------------------------------------------------

    def generate(
        self, prefix: torch.Tensor, prompt: PromptBatch, num_tokens: int, sampler: Sampler, deterministic: bool
    ) -> Generated:
        """Decode ``num_tokens`` action tokens one by one with a key/value cache.

        Runs in eval mode: transformers drops the cache of a training-mode model with activation
        checkpointing, and nothing here differs between the modes otherwise (no dropout).
        """
        was_training = self.training
        self.eval()
        try:
            return self._generate(prefix, prompt, num_tokens, sampler, deterministic)
        finally:
            self.train(was_training)

    def _generate(
        self, prefix: torch.Tensor, prompt: PromptBatch, num_tokens: int, sampler: Sampler, deterministic: bool
    ) -> Generated:
        inputs = self.sequence(prefix, prompt)
        cache = DynamicCache(config=self.llm.config)
        hidden = self.decode(inputs, cache)  # (B, L, H)
        prompt_hidden = hidden[:, -1]
        mask, position = inputs.mask, inputs.positions[:, -1:]
        tokens, log_probs = [], []
        for step in range(num_tokens):
            step_log_probs = sampler.log_probs(self.action_logits(hidden[:, -1]))  # (B, n_bins)
            bins = sampler.choose(step_log_probs, deterministic)  # (B,)
            tokens.append(self.action_tokenizer.from_bin(bins))
            log_probs.append(gather(step_log_probs, bins))
            if step + 1 < num_tokens:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                position = position + 1
                step_inputs = SequenceInputs(self.embed_tokens(tokens[-1][:, None]), mask, position)
                hidden = self.decode(step_inputs, cache)  # (B, 1, H)
        return Generated(torch.stack(tokens, dim=1), torch.stack(log_probs, dim=1), prompt_hidden)

    def score(self, prefix: torch.Tensor, prompt: PromptBatch, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One teacher-forced pass: action logits (B, K, n_bins) of the K given tokens (position t
        predicts token t from the prompt and tokens < t) and the last prompt token's hidden (B, H)."""
        num_tokens = tokens.shape[1]
        inputs = self.sequence(prefix, prompt, self.embed_tokens(tokens[:, :-1]))
        hidden = self.decode(inputs)  # (B, L + K - 1, H)
        action_hidden = hidden[:, -num_tokens:]  # the last prompt token and the first K - 1 tokens
        return self.action_logits(action_hidden), action_hidden[:, 0]

    def prompt_hidden(self, prefix: torch.Tensor, prompt: PromptBatch) -> torch.Tensor:
        """The last prompt token's hidden state (B, H): one pass over the prompt (the critic's input)."""
        return self.decode(self.sequence(prefix, prompt))[:, -1]
