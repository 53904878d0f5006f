"""π0 and π0.5 under the Policy contract, trained with πRL's Flow-SDE or Flow-Noise.

Shapes: B envs, N = ``num_steps`` flow steps, H = ``chunk_size`` (the model's horizon),
D = ``max_action_dim``, C = ``policy.action_chunk`` <= H executed actions of A env dims,
K = C * A.

* ``act(obs)`` encodes the prefix once (images + prompt: :meth:`Pi0Model.encode_prefix`), then
  runs N stochastic flow steps from Gaussian noise: every step a Gaussian transition
  (:mod:`embodied.rl.flow`). ``actions`` is the whole chain (B, N + 1, H, D) float32 (x_0 the
  noise ... x_N the normalized chunk): what ``evaluate`` rescores. ``env_actions`` are x_N's first
  C steps and A dims unnormalized, (B, C, A) ((B, A) when C = 1). ``logprobs``: per executed
  action entry the sum over the N steps of its transition log-density, (B, K) with an all-True
  ``mask`` (``logprob_level: token``), or summed to (B,) (``action``). ``deterministic`` takes the
  transitions' ODE means (the Euler integration; logprobs are still those of the stochastic
  kernel).
* ``evaluate(obs, chain)`` recomputes the N transitions' means and stds under the current weights
  in ONE expert pass over the N steps (the prefix cache repeated N times) and scores the chain.
* ``values``: a critic on the VLM's prefix features (``value_after_vlm: 1``; ``value_vlm_mode``
  picks the mean / first / last real token) or on the action expert's (the mean over the action
  tokens, averaged over the chain's steps), as RLinf's openpi policy.

Training modes: everything (the prefix's last-layer parts nothing reads stay frozen:
:meth:`Pi0Policy.unused_prefix_parameters`), ``train_expert_only`` (the VLM fixed),
``freeze_vision_encoder``, or LoRA on both Gemmas (``lora_rank``; :mod:`policies.pi0.lora`).
:meth:`Pi0Policy.sft_loss` is the flow-matching loss for supervised fine-tuning.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embodied.errors import UserError
from embodied.rl.flow import flow_timesteps, flow_transition, gaussian_entropy, gaussian_log_prob
from policies.base import INSTRUCTION_KEY, ActionOutput, Evaluation, Policy
from policies.config import PolicyConfig
from policies.models.cnn import camera_keys
from policies.pi0.inputs import Normalizer, TextTokenizer, images_to_model, pad_last, prompt_texts, tokenize
from policies.pi0.loader import LoadedPi0, load_pi0
from policies.pi0.lora import apply_lora, is_gemma_base
from policies.pi0.model import Pi0Model, PrefixCache
from policies.pi0.tiny import tiny_pi0
from policies.vla.heads import ValueHead


class NoiseHead(nn.Module):
    """Flow-Noise's noise network (RLinf ``ExploreNoiseNet``): expert features (B, H, We) -> a
    per-entry std (B, H, D) in [min_std, max_std], the log-variance squashed by tanh."""

    def __init__(self, width: int, action_dim: int, std_range: tuple[float, float]) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, 128), nn.Tanh(), nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, action_dim))
        self.log_var_range = (2 * math.log(std_range[0]), 2 * math.log(std_range[1]))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        low, high = self.log_var_range
        log_var = low + (high - low) * (torch.tanh(self.net(features.float())) + 1) / 2
        return torch.exp(0.5 * log_var)


class Pi0Policy(Policy):
    """π0 / π0.5 as a stochastic flow policy (one class; ``config.pi05`` picks the variant)."""

    loads_path = True

    def __init__(self, cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space,
                 options: dict[str, Any], pi05: bool) -> None:
        super().__init__()
        self.name = "pi05" if pi05 else "pi0"
        self.options = options
        if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
            raise UserError(f"policy {self.name!r} produces continuous action vectors; the env's action space is {action_space}.")
        self.action_dim = int(action_space.shape[0])  # A
        self.action_chunk = cfg.action_chunk  # C
        self.cameras = self._cameras(observation_space, options["cameras"])
        self.state_dim = int(np.prod(observation_space["state"].shape)) if "state" in observation_space.spaces else 0

        loaded = self._load(action_space, pi05)
        self.model: Pi0Model = loaded.model
        self.config = self.model.config
        self.tokenizer: TextTokenizer = loaded.tokenizer
        if self.config.pi05 != pi05:
            raise UserError(f"policy {self.name!r} was given a {'π0.5' if self.config.pi05 else 'π0'} checkpoint; "
                            f"use policy.name={'pi05' if self.config.pi05 else 'pi0'}.")
        if self.action_chunk > self.config.chunk_size or self.action_dim > self.config.max_action_dim:
            raise UserError(f"policy.action_chunk={self.action_chunk} x {self.action_dim} env dims do not fit the model's "
                            f"{self.config.chunk_size} x {self.config.max_action_dim} action chunk.")
        self.action_norm: Normalizer = loaded.action_norm
        self.state_norm: Normalizer | None = loaded.state_norm
        if self.action_norm.dim < self.action_dim:
            raise UserError(f"the action statistics have {self.action_norm.dim} dims, the env {self.action_dim}.")
        self.num_steps = int(options["num_steps"] or self.config.num_inference_steps)  # N
        self.noise_method = options["noise_method"]
        self.noise_level = float(options["noise_level"])
        self.token_level = options["logprob_level"] == "token"
        self.num_tokens = self.action_chunk * self.action_dim  # K
        expert_width = self.config.expert.width
        self.noise_head = (NoiseHead(expert_width, self.config.max_action_dim, tuple(options["noise_logvar_range"]))
                           if self.noise_method == "flow_noise" else None)
        self.value_after_vlm = bool(options["value_after_vlm"] if options["value_after_vlm"] is not None else pi05)
        self.has_critic = bool(options["add_value_head"])
        width = self.config.vlm.width if self.value_after_vlm else expert_width
        self.value_head = ValueHead(width) if self.has_critic else None
        self.lora = bool(options["lora_rank"])
        if self.lora:
            apply_lora(self.model, options["lora_rank"], options["lora_alpha"])
        self._set_trainable()

    # -- construction --------------------------------------------------------------------------------

    def _cameras(self, observation_space: gym.spaces.Dict, chosen: list[str] | None) -> list[str]:
        available = camera_keys(observation_space)
        cameras = list(chosen) if chosen is not None else available
        if not cameras or any(c not in available for c in cameras):
            raise UserError(f"policy {self.name!r} needs image observations ('rgb', 'rgb/<camera>'); policy.kwargs.cameras="
                            f"{chosen!r} and the env gives {list(observation_space.spaces)}. Use env.obs_mode=rgb (or state+rgb).")
        return cameras

    def _load(self, action_space: gym.spaces.Box, pi05: bool) -> LoadedPi0:
        options = self.options
        if options["path"] is not None:
            return load_pi0(options["path"], options["dtype"], options["tokenizer"])
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        low, high = np.where(finite, low, -1.0), np.where(finite, high, 1.0)
        return tiny_pi0(pi05, options["tiny"], action_low=low.tolist(), action_high=high.tolist(),
                        state_dim=self.state_dim, dtype="float32" if options["dtype"] == "config" else options["dtype"])

    def unused_prefix_parameters(self) -> set[str]:
        """The language model's parameters nothing reads unless the critic reads the prefix: the
        expert attends to the prefix's keys and values of each layer, so the last layer's
        queries, output projection, MLP and the final norm only make the prefix's own output."""
        if self.value_after_vlm and self.value_head is not None:
            return set()
        last = f"paligemma.language_model.layers.{self.config.vlm.depth - 1}."
        parts = ("self_attn.q_proj.", "self_attn.o_proj.", "post_attention_layernorm.", "mlp.")
        return {name for name, _ in self.model.named_parameters()
                if name.startswith("paligemma.language_model.norm.") or any(name.startswith(last + p) for p in parts)}

    def _set_trainable(self) -> None:
        """``train_expert_only``: the VLM (tower, projector, language model) stays fixed;
        ``freeze_vision_encoder``: the tower does; with LoRA the Gemmas' base weights and the
        tower do; :meth:`unused_prefix_parameters` never train (no gradient reaches them)."""
        unused = self.unused_prefix_parameters()
        for name, param in self.model.named_parameters():
            frozen = (self.options["train_expert_only"] and name.startswith("paligemma.")) or \
                     ((self.options["freeze_vision_encoder"] or self.lora) and name.startswith("paligemma.vision_tower.")) or \
                     (self.lora and is_gemma_base(name)) or name in unused
            param.requires_grad_(not frozen)

    # -- inputs ---------------------------------------------------------------------------------------

    def _state(self, obs: dict[str, Any], batch: int) -> torch.Tensor:
        """The normalized state (B, Ds) of the model's width (zeros without a 'state' observation)."""
        device = self.model.device
        if not self.state_dim:
            return torch.zeros(batch, self.config.max_state_dim, device=device)
        state = torch.as_tensor(obs["state"]).to(device).float().reshape(batch, -1)
        if self.state_norm is not None:
            state = self.state_norm.normalize(state)
        return pad_last(state, self.config.max_state_dim)

    def _prefix(self, obs: dict[str, Any]) -> tuple[PrefixCache, torch.Tensor]:
        """The encoded prefix and the normalized state (B, Ds) of a batch of observations."""
        device = self.model.device
        images = torch.stack([images_to_model(torch.as_tensor(obs[key]).to(device), self.config.vision.image_size)
                              for key in self.cameras], dim=1)  # (B, I, 3, S, S)
        batch = images.shape[0]
        state = self._state(obs, batch)
        instructions = obs.get(INSTRUCTION_KEY)
        if instructions is None:
            instructions = [self.options["instruction"]] * batch
        elif len(instructions) != batch:
            raise ValueError(f"obs[{INSTRUCTION_KEY!r}] has {len(instructions)} instructions for a batch of {batch}")
        texts = prompt_texts([str(x) for x in instructions], state[:, : self.state_dim] if self.state_dim else state[:, :0], self.config.pi05)
        tokens, token_mask = tokenize(self.tokenizer, texts, self.config.tokenizer_max_length)
        image_mask = torch.ones(batch, len(self.cameras), dtype=torch.bool, device=device)
        return self.model.encode_prefix(images, image_mask, tokens.to(device), token_mask.to(device)), state

    # -- the chain -------------------------------------------------------------------------------------

    def _transition(self, x: torch.Tensor, features: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        velocity = self.model.velocity(features)
        std = self.noise_head(features) if self.noise_head is not None else None
        return flow_transition(x.float(), velocity, step, self.num_steps, self.noise_method, self.noise_level, std)

    def _scored(self, per_entry: torch.Tensor) -> torch.Tensor:
        """(B, N, H, D) per step and entry -> summed over steps on the executed part, (B, K) or (B,)."""
        executed = per_entry[:, :, : self.action_chunk, : self.action_dim].sum(1)  # (B, C, A)
        flat = executed.reshape(executed.shape[0], self.num_tokens)
        return flat if self.token_level else flat.sum(-1)

    def _value(self, cache: PrefixCache, features: torch.Tensor | None) -> torch.Tensor | None:
        """The critic on the prefix's pooled features, or on the expert's (B, N, H, We) features."""
        if self.value_head is None:
            return None
        if self.value_after_vlm:
            mode, pad = self.options["value_vlm_mode"], cache.pad
            hidden = cache.hidden.float()
            if mode == "mean_token":
                pooled = (hidden * pad[..., None]).sum(1) / pad.sum(1, keepdim=True).clamp(min=1)
            else:
                positions = torch.arange(pad.shape[1], device=pad.device).expand_as(pad)
                pick = torch.where(pad, positions, -1).amax(1) if mode == "last_token" else torch.where(pad, positions, pad.shape[1]).amin(1)
                pooled = hidden[torch.arange(hidden.shape[0], device=pad.device), pick]
            return self.value_head(pooled)
        assert features is not None
        return self.value_head(features.float().mean(dim=(1, 2)))

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> ActionOutput:
        cache, state = self._prefix(obs)
        batch = state.shape[0]
        grid = flow_timesteps(self.num_steps, state.device)
        x = torch.randn(batch, self.config.chunk_size, self.config.max_action_dim, device=state.device)
        chain, log_probs, all_features = [x], [], []
        for step in range(self.num_steps):
            features = self.model.expert_features(cache, state, x, grid[step].expand(batch))
            mean, std = self._transition(x, features, step)
            if deterministic:
                x = flow_transition(x, self.model.velocity(features), step, self.num_steps, "ode", 0.0)[0]
            else:
                x = mean + std * torch.randn_like(mean)
            log_probs.append(gaussian_log_prob(x, mean, std))
            chain.append(x)
            all_features.append(features)
        chain_t = torch.stack(chain, dim=1)  # (B, N + 1, H, D)
        log_prob = self._scored(torch.stack(log_probs, dim=1))
        values = self._value(cache, torch.stack(all_features, dim=1))
        env_actions = self.action_norm.unnormalize(x[:, : self.action_chunk, : self.action_dim]).float()
        mask = torch.ones(batch, self.num_tokens, dtype=torch.bool, device=x.device) if self.token_level else None
        return ActionOutput(chain_t, log_prob, values, env_actions[:, 0] if self.action_chunk == 1 else env_actions, mask)

    def _chain(self, actions: torch.Tensor, batch: int) -> torch.Tensor:
        chain = torch.as_tensor(actions).to(self.model.device).float()
        want = (batch, self.num_steps + 1, self.config.chunk_size, self.config.max_action_dim)
        if tuple(chain.shape) != want:
            raise ValueError(f"evaluate() scores the denoising chain act() returned, shape {want}; got {tuple(chain.shape)}")
        return chain

    def evaluate(self, obs: dict[str, Any], actions: torch.Tensor) -> Evaluation:
        cache, state = self._prefix(obs)
        batch, steps = state.shape[0], self.num_steps
        chain = self._chain(actions, batch)
        grid = flow_timesteps(steps, state.device)
        # All N steps in one expert pass: sample b's step k is row b * N + k.
        x = chain[:, :-1].flatten(0, 1)  # (B * N, H, D)
        t = grid[:-1].repeat(batch)
        features = self.model.expert_features(cache.repeat(steps), state.repeat_interleave(steps, 0), x, t)
        features = features.unflatten(0, (batch, steps))  # (B, N, H, We)
        log_probs, entropies = [], []
        for step in range(steps):
            mean, std = self._transition(chain[:, step], features[:, step], step)
            log_probs.append(gaussian_log_prob(chain[:, step + 1], mean, std))
            entropies.append(gaussian_entropy(std))
        return Evaluation(self._scored(torch.stack(log_probs, 1)), self._scored(torch.stack(entropies, 1)),
                          self._value(cache, features))

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        if self.value_head is None:
            raise NotImplementedError(f"policy {self.name!r} was built without a value head (add_value_head: 0)")
        if self.value_after_vlm:
            cache, _ = self._prefix(obs)
            return self._value(cache, None)
        return self.act(obs, deterministic=True).values

    def encode_actions(self, env_actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            f"policy {self.name!r} stores its denoising chain as actions, which demonstrations do not have; "
            "train it on demonstrations with sft_loss (flow matching)."
        )

    # -- supervised fine-tuning ------------------------------------------------------------------------

    def sft_loss(self, obs: dict[str, Any], env_actions: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Flow matching (openpi's training loss): env actions (B, C, A) (or (B, A) for C = 1) in
        the data's units -> the mean squared error between the predicted and the true velocity
        ``noise - actions`` at ``x_t = t noise + (1 - t) actions``, over the C x A executed entries
        (the padding is zeros and not scored). t ~ Beta(1.5, 1) * 0.999 + 0.001 as openpi samples
        it, drawn as U ** (1 / 1.5) (Beta(a, 1)'s inverse CDF) so that ``generator`` (a CPU
        generator) fixes t and the noise: a held-out loss scored again with the same seed sees
        the same draws."""
        cache, state = self._prefix(obs)
        batch, device = state.shape[0], state.device
        actions = torch.as_tensor(env_actions).to(device).float().reshape(batch, self.action_chunk, self.action_dim)
        target = torch.zeros(batch, self.config.chunk_size, self.config.max_action_dim, device=device)  # (B, H, D)
        target[:, : self.action_chunk, : self.action_dim] = self.action_norm.normalize(actions)
        noise = torch.randn(target.shape, generator=generator).to(device)
        t = (torch.rand(batch, generator=generator) ** (1 / 1.5) * 0.999 + 0.001).to(device)  # (B,)
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * target
        velocity = self.model.velocity(self.model.expert_features(cache, state, x_t, t))
        error = F.mse_loss(velocity, noise - target, reduction="none")
        return error[:, : self.action_chunk, : self.action_dim].mean()

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self.named_parameters() if p.requires_grad}
