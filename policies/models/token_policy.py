"""A small VLA-shaped actor-critic: continuous actions as discrete tokens, decoded autoregressively.

The model has the cost structure of RL on a vision-language-action model (OpenVLA and kin):

* **Observation tokens.** Each camera key is cut into patches by a strided convolution
  (``patch_size`` x ``patch_size`` kernel and stride, ``d_model`` channels, as a ViT's patch
  embedding) plus learned position embeddings: a 128x128 frame with 16-pixel patches gives
  8 x 8 = 64 tokens. A ``"state"`` vector becomes one token (a linear map); without a camera it
  becomes ``state_tokens`` tokens (one linear map to ``state_tokens * d_model``, split).
* **Action tokens.** :class:`ActionTokenizer` cuts each action dimension's ``[low, high]`` into
  ``num_bins`` uniform bins; a token de-tokenizes to its bin center (OpenVLA's scheme).
* **Decoder.** A pre-LayerNorm causal transformer over ``[obs tokens ; BOS ; action tokens]``
  predicts the next action token's logits over the bins; a chunk of C actions of A dims is
  T = C * A tokens, dimension-major within each step. The critic is an MLP on the decoder's
  outputs at the observation positions, mean-pooled; under the causal mask they do not depend on
  the action tokens, so acting, evaluating and ``value`` agree.

``act`` decodes the T tokens one by one. By default each of the T decoder passes re-runs the
whole prefix (no KV cache, like Hugging Face ``generate(use_cache=False)``; the patch embedding
runs once); with ``policy.kwargs.kv_cache=1`` the prefix ``[obs ; BOS]`` is run once, keeping each
layer's keys and values, and every next token costs one position through the layers (as
``generate`` does by default and as VLA rollout servers do). Both compute the same function with
the same parameters. ``evaluate`` scores given actions with ONE teacher-forced pass over the same
sequence. This asymmetry (T passes to collect, one to train) is the point of the model; the
logprobs of the paths agree to float tolerance. Dropout is off: PPO's ratio needs both paths to
be the same function.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from embodied.errors import UserError
from policies.base import ActionOutput, Evaluation, Policy
from policies.config import PolicyConfig
from policies.models.cnn import _image_shape, _module_name, camera_keys
from policies.models.mlp import RunningNorm, _init, mlp
from policies.registry import POLICIES

#: ``policy.kwargs`` the token policy understands, with their defaults.
TOKEN_KWARGS: dict[str, Any] = {
    "d_model": 128,  # width of every token
    "n_layers": 2,  # decoder blocks
    "n_heads": 4,  # attention heads per block (must divide d_model)
    "ffn": 512,  # hidden width of each block's feed-forward layer
    "num_bins": 256,  # tokens per action dimension (OpenVLA: 256)
    "patch_size": 16,  # pixels per patch side of the image tokenizer
    "state_tokens": 4,  # tokens the state is split into when there is no camera
    "kv_cache": 0,  # 1: decode with a key/value cache (one position per token after the prefix)
}
#: kwargs that are switches (0 or 1) rather than sizes.
_SWITCHES = ("kv_cache",)


class ActionTokenizer(nn.Module):
    """Uniform per-dimension binning of Box actions (OpenVLA's ActionTokenizer, bin centers).

    Dimension ``i`` is cut into ``num_bins`` bins of width ``(high[i] - low[i]) / num_bins``;
    token ``k`` decodes to the center ``low + (k + 0.5) * width``. Actions outside ``[low, high]``
    are clipped to the first/last bin. Bounds are buffers, so they follow ``.to(device)``.
    """

    def __init__(self, low: np.ndarray | torch.Tensor, high: np.ndarray | torch.Tensor, num_bins: int = 256) -> None:
        super().__init__()
        low_t = torch.as_tensor(np.asarray(low, dtype=np.float64)).reshape(-1)
        high_t = torch.as_tensor(np.asarray(high, dtype=np.float64)).reshape(-1)
        if low_t.shape != high_t.shape:
            raise UserError(f"action bounds disagree in shape: low {tuple(low_t.shape)}, high {tuple(high_t.shape)}.")
        if not (torch.isfinite(low_t).all() and torch.isfinite(high_t).all()) or not (high_t > low_t).all():
            raise UserError(
                "policy 'token_transformer' bins each action dimension, so it needs finite bounds with "
                f"low < high; the action space has low={low_t.tolist()}, high={high_t.tolist()}."
            )
        if int(num_bins) < 2:
            raise UserError(f"policy.kwargs.num_bins={num_bins!r} must be at least 2.")
        self.num_bins = int(num_bins)
        self.register_buffer("low", low_t.float())
        self.register_buffer("high", high_t.float())
        self.register_buffer("bin_width", ((high_t - low_t) / self.num_bins).float())

    @property
    def action_dim(self) -> int:
        return int(self.low.shape[0])

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions (..., A) float -> tokens (..., A) long in [0, num_bins)."""
        position = (actions.float() - self.low) / self.bin_width  # (..., A) in bin units
        return position.floor().clamp(0, self.num_bins - 1).long()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens (..., A) long -> bin centers (..., A) float."""
        return self.low + (tokens.float() + 0.5) * self.bin_width


class PatchEmbedding(nn.Module):
    """uint8 frames (B, H, W, 3) -> patch tokens (B, N, d_model) with learned position embeddings."""

    def __init__(self, image_shape: tuple[int, int, int], patch_size: int, d_model: int) -> None:
        super().__init__()
        height, width, channels = image_shape
        if height < patch_size or width < patch_size:
            raise UserError(
                f"policy 'token_transformer' cuts frames into {patch_size}x{patch_size} patches; the env gives "
                f"{height}x{width}. Lower policy.kwargs.patch_size or raise env.image_size."
            )
        self.grid = (height // patch_size, width // patch_size)  # trailing pixels are dropped
        self.conv = _init(nn.Conv2d(channels, d_model, patch_size, patch_size), 1.0)
        self.position = nn.Parameter(0.02 * torch.randn(self.grid[0] * self.grid[1], d_model))

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames.permute(0, 3, 1, 2).float() / 255.0 - 0.5  # (B, C, H, W) in [-0.5, 0.5]
        x = self.conv(x)  # (B, d_model, H/p, W/p)
        return x.flatten(2).transpose(1, 2) + self.position  # (B, N, d_model)


class TokenActionPolicy(Policy):
    """Patch/state tokens -> causal transformer -> action tokens (A per step, C steps), plus a critic."""

    def __init__(self, cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> None:
        super().__init__()
        options = _options(cfg.kwargs)
        d_model = options["d_model"]
        if not isinstance(action_space, gym.spaces.Box):
            raise UserError(f"policy 'token_transformer' supports Box action spaces, not {action_space}.")
        self.action_shape = tuple(action_space.shape)
        self.tokenizer = ActionTokenizer(action_space.low, action_space.high, options["num_bins"])
        self.act_dim = self.tokenizer.action_dim
        self.action_chunk = cfg.action_chunk  # C actions per observation
        self.num_action_tokens = self.action_chunk * self.act_dim  # T

        self.cameras = camera_keys(observation_space)
        self.has_state = "state" in observation_space.spaces
        if not self.cameras and not self.has_state:
            raise UserError(
                "policy 'token_transformer' needs a 'state' or an image ('rgb', 'rgb/<camera>') observation; "
                f"the env gives {list(observation_space.spaces)}."
            )
        # ModuleDict names may not contain '.'; see cnn._module_name.
        self.patch_embeddings = nn.ModuleDict({
            _module_name(key): PatchEmbedding(_image_shape(observation_space[key], key, "token_transformer"), options["patch_size"], d_model)
            for key in self.cameras
        })
        self.state_dim = int(np.prod(observation_space["state"].shape)) if self.has_state else 0
        self.num_state_tokens = (1 if self.cameras else options["state_tokens"]) if self.has_state else 0
        self.normalizer = RunningNorm(self.state_dim) if self.has_state and cfg.normalize_obs else None
        self.state_embedding = None
        if self.has_state:
            self.state_embedding = _init(nn.Linear(self.state_dim, self.num_state_tokens * d_model), 1.0)
        self.num_obs_tokens = sum(p.num_tokens for p in self.patch_embeddings.values()) + self.num_state_tokens

        # Input positions after the observation: BOS, then the first T - 1 action tokens.
        self.bos = nn.Parameter(0.02 * torch.randn(d_model))
        self.token_embedding = nn.Embedding(self.tokenizer.num_bins, d_model)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        self.action_position = nn.Parameter(0.02 * torch.randn(self.num_action_tokens, d_model))
        block = nn.TransformerEncoderLayer(
            d_model, options["n_heads"], options["ffn"], dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True,
        )
        self.decoder = nn.TransformerEncoder(
            block, options["n_layers"], norm=nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        self.kv_cache = bool(options["kv_cache"])
        self.action_head = _init(nn.Linear(d_model, self.tokenizer.num_bins), 0.01)  # near-uniform at init
        self.critic = mlp(d_model, list(cfg.hidden_sizes), 1, cfg.activation, out_gain=1.0)

    # -- observation -------------------------------------------------------------------------------

    def _obs_tokens(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        device = self.bos.device
        parts = [
            self.patch_embeddings[_module_name(key)](torch.as_tensor(obs[key], device=device)) for key in self.cameras
        ]
        if self.state_embedding is not None:
            state = self._state(obs, device)
            if self.normalizer is not None:
                state = self.normalizer(state)
            parts.append(self.state_embedding(state).reshape(state.shape[0], self.num_state_tokens, -1))
        return torch.cat(parts, dim=1)  # (B, N, d_model)

    def _state(self, obs: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        state = torch.as_tensor(obs["state"], device=device)
        return state.reshape(state.shape[0], -1).float()  # (B, D)

    # -- decoder -----------------------------------------------------------------------------------

    def _sequence(self, obs_tokens: torch.Tensor, action_tokens: torch.Tensor) -> torch.Tensor:
        """The decoder's input [obs ; BOS ; action_tokens] (B, N + 1 + t, d_model)."""
        bos = (self.bos + self.action_position[:1]).expand(action_tokens.shape[0], 1, -1)  # (B, 1, d_model)
        return torch.cat([obs_tokens, bos, self._action_inputs(action_tokens, position=1)], dim=1)

    def _action_inputs(self, action_tokens: torch.Tensor, position: int) -> torch.Tensor:
        """Inputs of action tokens that follow BOS at ``position`` (1 = the first token) (B, t, d_model)."""
        steps = action_tokens.shape[1]
        return self.token_embedding(action_tokens) + self.action_position[position : position + steps]

    def _decode(self, obs_tokens: torch.Tensor, action_tokens: torch.Tensor) -> torch.Tensor:
        """One causal pass over [obs ; BOS ; action_tokens] -> outputs (B, N + 1 + t, d_model).

        obs_tokens: (B, N, d_model); action_tokens: (B, t) long with t < T.
        """
        sequence = self._sequence(obs_tokens, action_tokens)  # (B, L, d_model)
        length = sequence.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=sequence.device, dtype=sequence.dtype)
        return self.decoder(sequence, mask=mask, is_causal=True)

    def _teacher_forced(self, obs_tokens: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over [obs ; BOS ; tokens]: logits (B, t + 1, num_bins) and all outputs (B, N + 1 + t, d_model)."""
        outputs = self._decode(obs_tokens, tokens)
        return self.action_head(outputs[:, self.num_obs_tokens :]), outputs

    def _value(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.critic(outputs[:, : self.num_obs_tokens].mean(1)).squeeze(-1)  # (B,)

    def _to_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens (B, T) -> bin centers (B, *action_shape), or (B, C, A) for chunks."""
        centers = self.tokenizer.decode(tokens.reshape(tokens.shape[0], self.action_chunk, self.act_dim))
        if self.action_chunk == 1:
            return centers.reshape(tokens.shape[0], *self.action_shape)
        return centers  # (B, C, A)

    def token_logits(self, obs: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced next-token logits, in one decoder pass.

        ``tokens`` (B, t) long, 0 <= t < T: the first t action tokens (``tokenizer.encode`` of the
        actions, dimension-major within each chunk step). Returns logits (B, t + 1, num_bins) whose
        position i scores token i given the observation and ``tokens[:, :i]``: ``evaluate`` scores
        these with the full prefix (t = T - 1), and greedy ``act`` takes their argmax token by token.
        """
        if tokens.ndim != 2 or tokens.shape[1] >= self.num_action_tokens:
            raise ValueError(
                f"token_logits: tokens must be (B, t) with t < {self.num_action_tokens} action tokens, got {tuple(tokens.shape)}"
            )
        logits, _ = self._teacher_forced(self._obs_tokens(obs), tokens)
        return logits

    # -- the Policy contract -----------------------------------------------------------------------

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActionOutput:
        """Autoregressive decoding of T = C * A tokens: T decoder passes over the whole prefix, or
        with ``kv_cache`` one pass over ``[obs ; BOS]`` and then one position per token."""
        obs_tokens = self._obs_tokens(obs)  # (B, N, d_model), computed once
        batch = obs_tokens.shape[0]
        tokens = torch.zeros(batch, 0, dtype=torch.long, device=obs_tokens.device)  # (B, t)
        logprobs = torch.zeros(batch, device=obs_tokens.device)
        values = None
        cache = _KVCache(self.decoder) if self.kv_cache else None
        for step in range(self.num_action_tokens):
            if cache is None:
                last = self._decode(obs_tokens, tokens)  # (B, N + 1 + t, d_model)
            elif step == 0:
                last = cache.extend(self._sequence(obs_tokens, tokens))  # prefill [obs ; BOS]
            else:  # only the newest token goes through the layers
                last = cache.extend(self._action_inputs(tokens[:, -1:], position=step))
            if values is None:
                values = self._value(last)
            log_probs = F.log_softmax(self.action_head(last[:, -1]), dim=-1)  # (B, num_bins)
            if deterministic:
                next_token = log_probs.argmax(-1, keepdim=True)  # (B, 1)
            else:
                next_token = torch.multinomial(log_probs.exp(), 1)  # (B, 1)
            logprobs = logprobs + log_probs.gather(-1, next_token).squeeze(-1)
            tokens = torch.cat([tokens, next_token], dim=1)
        return ActionOutput(self._to_actions(tokens), logprobs, values)

    def evaluate(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> Evaluation:
        """One teacher-forced causal pass: summed token logprobs and entropies (B,), values (B,)."""
        obs_tokens = self._obs_tokens(obs)  # (B, N, d_model)
        batch = obs_tokens.shape[0]
        actions = torch.as_tensor(actions, device=obs_tokens.device).reshape(batch, self.action_chunk, self.act_dim)
        tokens = self.tokenizer.encode(actions).reshape(batch, self.num_action_tokens)  # (B, T)
        logits, outputs = self._teacher_forced(obs_tokens, tokens[:, :-1])  # (B, T, num_bins): position t predicts token t
        log_probs = F.log_softmax(logits, dim=-1)
        token_logprobs = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
        entropy = -(log_probs.exp() * log_probs).sum(-1)  # (B, T)
        return Evaluation(token_logprobs.sum(-1), entropy.sum(-1), self._value(outputs))

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """One decoder pass over [obs ; BOS]; the causal mask keeps BOS out of the observation outputs."""
        obs_tokens = self._obs_tokens(obs)
        no_tokens = torch.zeros(obs_tokens.shape[0], 0, dtype=torch.long, device=obs_tokens.device)
        return self._value(self._decode(obs_tokens, no_tokens))

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if self.normalizer is not None:
            self.normalizer.update(self._state(obs, self.normalizer.mean.device))


class _KVCache:
    """Incremental decoding through a pre-LayerNorm ``nn.TransformerEncoder`` with the encoder's
    own parameters: each layer keeps the keys and values of every position seen so far, and a
    call runs only the new positions (causal among themselves, attending to all cached ones)."""

    def __init__(self, encoder: nn.TransformerEncoder) -> None:
        self.encoder = encoder
        self.keys: list[torch.Tensor | None] = [None] * len(encoder.layers)
        self.values: list[torch.Tensor | None] = [None] * len(encoder.layers)

    def extend(self, x: torch.Tensor) -> torch.Tensor:
        """New positions' inputs (B, n, d_model) -> their outputs after the final norm (B, n, d_model)."""
        for i, layer in enumerate(self.encoder.layers):
            x = x + self._attend(i, layer, layer.norm1(x))
            x = x + layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
        return self.encoder.norm(x) if self.encoder.norm is not None else x

    def _attend(self, i: int, layer: nn.TransformerEncoderLayer, h: torch.Tensor) -> torch.Tensor:
        attn = layer.self_attn
        batch, new, d_model = h.shape
        heads = attn.num_heads
        q, k, v = F.linear(h, attn.in_proj_weight, attn.in_proj_bias).split(d_model, dim=-1)
        q, k, v = (t.reshape(batch, new, heads, d_model // heads).transpose(1, 2) for t in (q, k, v))  # (B, H, n, dh)
        cached_k, cached_v = self.keys[i], self.values[i]
        if cached_k is not None:
            k, v = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)
        self.keys[i], self.values[i] = k, v
        # Position j of the new ones sees every cached position and the new ones up to j.
        seen = k.shape[2] - new
        mask = torch.ones(new, k.shape[2], dtype=torch.bool, device=h.device).tril(diagonal=seen)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, n, dh)
        return attn.out_proj(out.transpose(1, 2).reshape(batch, new, d_model))


def _options(kwargs: dict[str, Any]) -> dict[str, int]:
    unknown = sorted(set(kwargs) - set(TOKEN_KWARGS))
    if unknown:
        allowed = ", ".join(TOKEN_KWARGS)
        raise UserError(
            f"policy.kwargs {unknown} are not understood by policy 'token_transformer'; allowed: {allowed}."
        )
    options: dict[str, int] = {}
    for key, default in TOKEN_KWARGS.items():
        value = kwargs.get(key, default)
        if key in _SWITCHES:
            if value not in (0, 1):  # True/False compare equal to 1/0
                raise UserError(f"policy.kwargs.{key}={value!r} must be 0 or 1 (default {default}).")
            options[key] = int(value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise UserError(f"policy.kwargs.{key}={value!r} must be a positive integer (default {default}).")
        options[key] = int(value)
    if options["d_model"] % options["n_heads"]:
        raise UserError(
            f"policy.kwargs.n_heads={options['n_heads']} must divide policy.kwargs.d_model={options['d_model']}."
        )
    return options


@POLICIES.register("token_transformer")
def make_token_transformer(
    cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space
) -> Policy:
    """VLA-shaped causal transformer: patch tokens in, binned action tokens out (autoregressive)."""
    return TokenActionPolicy(cfg, observation_space, action_space)
