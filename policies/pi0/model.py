"""π0 / π0.5: PaliGemma (prefix) + a Gemma action expert (suffix), from transformers' own parts.

Shapes: B batch, P prefix tokens (I image slots * 256 patches + L prompt tokens), S suffix
tokens (π0: 1 state token + H action tokens; π0.5: H action tokens), H = ``chunk_size``,
D = ``max_action_dim``, W / We the prefix / expert widths.

* The prefix: ``paligemma.vision_tower`` (``SiglipVisionModel``, no pooling head) and
  ``multi_modal_projector`` per image slot, then the prompt's token embeddings
  (``GemmaTextScaledWordEmbedding``: times sqrt(W), the images are not scaled); all prefix tokens
  attend to each other (bidirectional) except padding.
* Every layer l: the prefix tokens take q/k/v from ``paligemma.language_model.layers[l]``, the
  suffix tokens from ``gemma_expert.layers[l]``; ONE attention over the concatenation, masked as
  π0's blocks (openpi ``make_att_2d_masks``: a token sees every token whose block index, the
  cumulative sum of the block starts, is not larger than its own): prefix [0 ... 0], π0's suffix
  [1 (state), 1, 0 ... 0 (actions)], π0.5's [1, 0 ... 0]. So the prefix never sees the suffix,
  the state sees the prefix and itself, the actions see everything and each other. Each stream's
  attention output goes through its own o_proj and MLP. Positions are the running count of
  real tokens (rotary from the language model).
* The prefix does not depend on the suffix: :meth:`Pi0Model.encode_prefix` runs it once per
  decision and keeps each layer's keys and values (:class:`PrefixCache`);
  :meth:`Pi0Model.velocity` runs the expert's tokens over that cache, once per flow step.
* Time: π0 embeds ``t`` (sine-cosine, periods 4e-3..4) and concatenates it with each action
  token's ``action_in_proj`` before ``action_time_mlp_in -> swish -> action_time_mlp_out``;
  π0.5 maps it through ``time_mlp_in -> swish -> time_mlp_out -> swish`` into the adaRMS
  condition of every expert norm (``dense``: scale, shift and a gate on the residual).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GemmaConfig, PaliGemmaConfig
from transformers.models.gemma.modeling_gemma import GemmaModel, apply_rotary_pos_emb
from transformers.models.paligemma.modeling_paligemma import PaliGemmaModel

from policies.pi0.config import Pi0Config


class AdaRMSNorm(nn.Module):
    """RMS norm whose scale and shift come from a condition (π0.5's time): ``dense`` (cond -> 3W)
    gives scale, shift and a gate for the residual it feeds."""

    def __init__(self, width: int, cond_width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_width, 3 * width)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, S, W), cond (B, Wc) -> (normalized x, gate (B, 1, W))."""
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond.to(self.dense.weight.dtype))[:, None, :].chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def sinusoidal_time_embedding(t: torch.Tensor, width: int, min_period: float, max_period: float) -> torch.Tensor:
    """t (B,) -> (B, width): [sin, cos] of t * 2 pi / period, periods geometric in [min, max]."""
    if width % 2:
        raise ValueError(f"the time embedding width must be even, got {width}")
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (2 * math.pi / period)[None, :] * t.double()[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).float()


def block_mask(pad: torch.Tensor, block_starts: torch.Tensor) -> torch.Tensor:
    """openpi's 2D mask: (B, T) real tokens, (B, T) block starts -> (B, T, T) bool, query i sees
    key j if j is real and j's block index is not after i's. Padded queries see the real keys
    (their outputs are never read) so no softmax row is empty."""
    index = torch.cumsum(block_starts.long(), dim=1)
    return (index[:, None, :] <= index[:, :, None]) & pad[:, None, :]


@dataclass
class PrefixCache:
    """The prefix of a batch, encoded once: each layer's rotated keys and values
    (B, KV, P, hd), which prefix tokens are real (B, P), and the prefix's final hidden state
    (B, P, W) (the VLM features the critic may read)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    pad: torch.Tensor
    hidden: torch.Tensor

    def repeat(self, times: int) -> PrefixCache:
        """Each sample's cache ``times`` times in a row ((B * times, ...): all flow steps at once)."""
        rep = lambda x: x.repeat_interleave(times, dim=0)  # noqa: E731
        return PrefixCache([rep(k) for k in self.keys], [rep(v) for v in self.values], rep(self.pad), rep(self.hidden))


class Pi0Model(nn.Module):
    """The networks of π0 (``config.pi05`` False) or π0.5 and their two passes."""

    def __init__(self, config: Pi0Config) -> None:
        super().__init__()
        self.config = config
        vlm, expert, vision = config.vlm, config.expert, config.vision
        gemma = dict(num_hidden_layers=vlm.depth, num_attention_heads=vlm.num_heads, num_key_value_heads=vlm.num_kv_heads,
                     head_dim=vlm.head_dim, hidden_act="gelu_pytorch_tanh", rms_norm_eps=config.rms_norm_eps)
        paligemma = PaliGemmaConfig(
            vision_config=dict(hidden_size=vision.width, intermediate_size=vision.mlp_dim, num_hidden_layers=vision.depth,
                               num_attention_heads=vision.num_heads, image_size=vision.image_size, patch_size=vision.patch_size,
                               layer_norm_eps=config.layer_norm_eps, vision_use_head=False, hidden_act="gelu_pytorch_tanh"),
            text_config=dict(gemma, hidden_size=vlm.width, intermediate_size=vlm.mlp_dim, vocab_size=config.vocab_size),
            projection_dim=vlm.width, image_token_index=config.vocab_size, vocab_size=config.vocab_size,
        )
        self.paligemma = PaliGemmaModel(paligemma)
        expert_config = GemmaConfig(**gemma, hidden_size=expert.width, intermediate_size=expert.mlp_dim, vocab_size=1,
                                    pad_token_id=None, bos_token_id=None, eos_token_id=None)
        self.gemma_expert = GemmaModel(expert_config)
        self.gemma_expert.embed_tokens = None  # the expert reads embeddings, never token ids
        if config.pi05:
            for layer in self.gemma_expert.layers:
                layer.input_layernorm = AdaRMSNorm(expert.width, expert.width, config.rms_norm_eps)
                layer.post_attention_layernorm = AdaRMSNorm(expert.width, expert.width, config.rms_norm_eps)
            self.gemma_expert.norm = AdaRMSNorm(expert.width, expert.width, config.rms_norm_eps)
            self.time_mlp_in = nn.Linear(expert.width, expert.width)
            self.time_mlp_out = nn.Linear(expert.width, expert.width)
        else:
            self.state_proj = nn.Linear(config.max_state_dim, expert.width)
            self.action_time_mlp_in = nn.Linear(2 * expert.width, expert.width)
            self.action_time_mlp_out = nn.Linear(expert.width, expert.width)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert.width)
        self.action_out_proj = nn.Linear(expert.width, config.max_action_dim)

    def to_dtype(self, dtype: torch.dtype) -> Pi0Model:
        """Cast the parameters to ``dtype``; the buffers computed at construction (rotary
        frequencies, the embedding scale) keep their float32 values (bfloat16 would round the
        rotary frequencies)."""
        kept = {name: buffer.clone() for name, buffer in self.named_buffers() if buffer.is_floating_point()}
        self.to(dtype)
        for name, value in kept.items():
            module_name, _, buffer_name = name.rpartition(".")
            self.get_submodule(module_name)._buffers[buffer_name] = value
        return self

    @property
    def device(self) -> torch.device:
        return self.action_in_proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.action_in_proj.weight.dtype

    # -- the shared-attention layer ------------------------------------------------------------------

    def _layer(self, index: int, streams: list[tuple[torch.Tensor, nn.Module, torch.Tensor | None]],
               mask: torch.Tensor, position_ids: torch.Tensor,
               past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """One layer over the concatenation of ``streams`` ((hidden (B, T_i, W_i), its Gemma, its
        adaRMS condition or None)) after the cached keys/values ``past``; ``mask`` (B, sum T_i,
        P_past + sum T_i). Returns each stream's output and this layer's keys and values (of the
        streams, rotated)."""
        queries, keys, values, gates, inputs = [], [], [], [], []
        for hidden, gemma, cond in streams:
            layer = gemma.layers[index]
            attn = layer.self_attn
            normed, gate = _norm(layer.input_layernorm, hidden, cond)
            shape = (*hidden.shape[:-1], -1, attn.head_dim)
            queries.append(attn.q_proj(normed).view(shape).transpose(1, 2))  # (B, heads, T_i, hd)
            keys.append(attn.k_proj(normed).view(shape).transpose(1, 2))
            values.append(attn.v_proj(normed).view(shape).transpose(1, 2))
            gates.append(gate)
            inputs.append(hidden)
        q, k, v = torch.cat(queries, 2), torch.cat(keys, 2), torch.cat(values, 2)
        cos, sin = self.paligemma.language_model.rotary_emb(v, position_ids)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        all_k, all_v = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        first = streams[0][1].layers[index].self_attn
        attended = F.scaled_dot_product_attention(
            q, all_k.to(q.dtype), all_v.to(q.dtype), attn_mask=mask[:, None], scale=first.scaling,
            enable_gqa=q.shape[1] != all_k.shape[1],
        ).transpose(1, 2)  # (B, T, heads, hd)
        attended = attended.reshape(*attended.shape[:2], -1)
        outputs, start = [], 0
        for (hidden, gemma, cond), gate in zip(streams, gates):
            layer = gemma.layers[index]
            end = start + hidden.shape[1]
            out = layer.self_attn.o_proj(attended[:, start:end].to(layer.self_attn.o_proj.weight.dtype))
            hidden = _residual(hidden, out, gate)
            normed, gate2 = _norm(layer.post_attention_layernorm, hidden, cond)
            outputs.append(_residual(hidden, layer.mlp(normed), gate2))
            start = end
        return outputs, k, v

    # -- the prefix ----------------------------------------------------------------------------------

    def embed_prefix(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                     token_masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images (B, I, 3, S, S) in [-1, 1], image_masks (B, I) bool, tokens/token_masks (B, L)
        -> embeddings (B, P, W), real-token mask (B, P)."""
        batch, slots = images.shape[:2]
        pixels = images.flatten(0, 1).to(self.paligemma.vision_tower.embeddings.patch_embedding.weight.dtype)
        features = self.paligemma.get_image_features(pixels).pooler_output  # (B * I, 256, W)
        features = features.reshape(batch, slots * features.shape[1], -1)
        per_image = features.shape[1] // slots
        image_pad = image_masks[:, :, None].expand(batch, slots, per_image).reshape(batch, -1)
        text = self.paligemma.language_model.embed_tokens(tokens)  # times sqrt(W)
        return torch.cat([features.to(text.dtype), text], dim=1), torch.cat([image_pad, token_masks.bool()], dim=1)

    def encode_prefix(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                      token_masks: torch.Tensor) -> PrefixCache:
        """The prefix through the language model (bidirectional), keeping every layer's keys/values."""
        hidden, pad = self.embed_prefix(images, image_masks, tokens, token_masks)
        mask = block_mask(pad, torch.zeros_like(pad))
        position_ids = torch.cumsum(pad.long(), dim=1) - 1
        keys, values = [], []
        lm = self.paligemma.language_model
        for index in range(self.config.vlm.depth):
            (hidden,), k, v = self._layer(index, [(hidden, lm, None)], mask, position_ids)
            keys.append(k)
            values.append(v)
        return PrefixCache(keys, values, pad, lm.norm(hidden))

    # -- the suffix ----------------------------------------------------------------------------------

    def embed_suffix(self, state: torch.Tensor, noisy_actions: torch.Tensor,
                     t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """state (B, Ds) normalized and padded, noisy actions (B, H, D), t (B,) -> suffix
        embeddings (B, S, We), block starts (B, S), adaRMS condition (B, We) or None."""
        config = self.config
        width = config.expert.width
        time = sinusoidal_time_embedding(t, width, config.min_period, config.max_period).to(self.dtype)
        actions = self.action_in_proj(noisy_actions.to(self.dtype))  # (B, H, We)
        batch, horizon = actions.shape[:2]
        starts = torch.zeros(batch, horizon, dtype=torch.bool, device=actions.device)
        starts[:, 0] = True
        if config.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
            return actions, starts, cond
        fused = torch.cat([actions, time[:, None, :].expand_as(actions)], dim=-1)
        actions = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(fused)))
        state_token = self.state_proj(state.to(self.dtype))[:, None, :]
        ones = torch.ones(batch, 1, dtype=torch.bool, device=actions.device)
        return torch.cat([state_token, actions], 1), torch.cat([ones, starts], 1), None

    def expert_features(self, cache: PrefixCache, state: torch.Tensor, noisy_actions: torch.Tensor,
                        t: torch.Tensor) -> torch.Tensor:
        """The expert's final hidden states of the H action tokens (B, H, We) at time t (B,)."""
        suffix, starts, cond = self.embed_suffix(state, noisy_actions, t)
        batch, length = suffix.shape[:2]
        suffix_pad = torch.ones(batch, length, dtype=torch.bool, device=suffix.device)
        mask = torch.cat([cache.pad[:, None, :].expand(batch, length, -1), block_mask(suffix_pad, starts)], dim=2)
        position_ids = cache.pad.long().sum(1, keepdim=True) + torch.arange(length, device=suffix.device)[None, :]
        hidden = suffix
        for index in range(self.config.expert.depth):
            (hidden,), _, _ = self._layer(index, [(hidden, self.gemma_expert, cond)], mask, position_ids,
                                          past=(cache.keys[index], cache.values[index]))
        hidden, _ = _norm(self.gemma_expert.norm, hidden, cond)
        return hidden[:, -self.config.chunk_size:]

    def velocity(self, features: torch.Tensor) -> torch.Tensor:
        """Expert features (B, H, We) -> the velocity (B, H, D) in float32."""
        return self.action_out_proj(features).float()


def _norm(norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(norm, AdaRMSNorm):
        assert cond is not None, "π0.5's adaRMS norms need the time condition"
        return norm(x, cond)
    return norm(x), None


def _residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + y if gate is None else x + y * gate
