"""OpenVLA and OpenVLA-OFT under the Policy contract (``policies.base``).

Shapes: B envs, N cameras, C = ``policy.action_chunk`` actions of A dimensions per observation,
K = C * A action tokens.

* ``act(obs)`` -> ``actions`` the sampled action token ids (B, C, A) long, ``env_actions`` their
  bin centers unnormalized with the dataset's BOUNDS_Q99 statistics, (B, C, A) float32 ((B, A)
  when C = 1), ``logprobs`` of the processed distribution (temperature, top-k over the 256 action
  ids only; :mod:`policies.vla.sampling`): (B, K) with an all-True ``mask`` (``logprob_level:
  token``) or summed to (B,) (``action``); ``values`` (B,) from the value head on the last prompt
  token, or None without one (GRPO). ``deterministic`` takes the argmax (greedy).
* ``evaluate(obs, token ids)`` recomputes the same logprobs, their entropies and the values in
  ONE forward pass (OpenVLA: teacher-forced; OFT: the same parallel pass as ``act``).

Observations: images under ``"rgb"`` / ``"rgb/<camera>"`` (B, H, W, 3) uint8, the language goal
under ``obs[INSTRUCTION_KEY]`` (B strings; absent: ``policy.kwargs.instruction``), and for an
OFT checkpoint with a proprio projector the robot state ``"state"`` (B, D), normalized with the
dataset's proprio statistics.

Training modes: a full fine-tune (``lora_rank: 0``; ``freeze_vision`` keeps the towers fixed) or
LoRA on the language model (only adapters and the value head train). The OFT L1 head never
trains here: RL scores the discrete head. :meth:`VLAPolicy.trainable_state_dict` is what a
trainer needs to ship to rollout workers; :meth:`VLAPolicy.merge_lora` folds adapters in.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from embodied.errors import UserError
from policies.base import INSTRUCTION_KEY, ActionOutput, Evaluation, Policy
from policies.config import PolicyConfig
from policies.models.cnn import camera_keys
from policies.vla.actions import BoundsQ99, select_stats
from policies.vla.heads import ValueHead
from policies.vla.loader import LoadedVLA, load_openvla
from policies.vla.lora import apply_lora, has_lora, merge_lora
from policies.vla.model import OpenVLA
from policies.vla.processor import ImageProcessor, PromptBatch, PromptTokenizer
from policies.vla.sampling import Sampler, entropy, gather
from policies.vla.tiny import DATASET, load_tiny


class VLAPolicy(Policy):
    """What OpenVLA and OpenVLA-OFT share: inputs, action decoding, heads, training modes."""

    #: OpenVLA-OFT's unnormalization adds 1e-8 to (q99 - q01); OpenVLA's does not.
    unnormalize_eps = 0.0
    oft = False
    loads_path = True

    def __init__(
        self, cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, options: dict[str, Any]
    ) -> None:
        super().__init__()
        self.name = "openvla_oft" if self.oft else "openvla"
        self.options = options
        self.action_dim = _action_dim(action_space, self.name)
        self.action_chunk = cfg.action_chunk  # C
        self.num_tokens = self.action_chunk * self.action_dim  # K
        self.cameras = self._cameras(observation_space, options["cameras"])
        self.state_dim = int(np.prod(observation_space["state"].shape)) if "state" in observation_space.spaces else 0

        loaded = self._load(observation_space, action_space)
        self.model: OpenVLA = loaded.model
        config = loaded.config
        self.unnorm_key, stats = select_stats(config.norm_stats, options["unnorm_key"])
        self.action_stats = BoundsQ99.from_stats(stats.get("action", {}), self.unnormalize_eps, f"'{self.unnorm_key}' action statistics")
        if self.action_stats.dim != self.action_dim:
            raise UserError(
                f"the checkpoint's '{self.unnorm_key}' actions have {self.action_stats.dim} dimensions, the env's "
                f"{self.action_dim}; pick the matching policy.kwargs.unnorm_key or env."
            )
        self.proprio_stats = self._proprio_stats(stats)
        self.images = ImageProcessor(config.towers, bool(options["center_crop"]), options["image_backend"])
        self.prompts = PromptTokenizer(loaded.tokenizer, int(self.model.llm.config.bos_token_id), config.pad_token_id)
        self.sampler = Sampler(options["temperature"], options["top_k"])
        self.token_level = options["logprob_level"] == "token"

        self.has_critic = bool(options["value_head"])
        self.value_head = ValueHead(self.model.hidden_size) if self.has_critic else None
        if options["lora_rank"]:
            apply_lora(self.model, options["lora_rank"], options["lora_alpha"], options["lora_targets"])
        self._set_trainable()
        if options["gradient_checkpointing"]:
            self._enable_gradient_checkpointing()

    # -- construction --------------------------------------------------------------------------------

    def _cameras(self, observation_space: gym.spaces.Dict, chosen: list[str] | None) -> list[str]:
        available = camera_keys(observation_space)
        cameras = list(chosen) if chosen is not None else available
        missing = [c for c in cameras if c not in available]
        if not cameras or missing:
            raise UserError(
                f"policy {self.name!r} needs image observations ('rgb', 'rgb/<camera>'); policy.kwargs.cameras="
                f"{chosen!r} and the env gives {list(observation_space.spaces)}. Use env.obs_mode=rgb (or state+rgb)."
            )
        for key in cameras:
            space = observation_space[key]
            if len(space.shape) != 3 or space.shape[-1] != 3 or space.dtype != np.uint8:
                raise UserError(f"policy {self.name!r} reads '{key}' as uint8 (H, W, 3) frames; the env gives {space}.")
        return cameras

    def _load(self, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> LoadedVLA:
        options = self.options
        if options["path"] is not None:
            return load_openvla(options["path"], self.oft, options["dtype"], options["attn_implementation"])
        # A random tiny model of the real architecture, with statistics that span the env's bounds.
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        stats: dict[str, Any] = {"action": {"q01": np.where(finite, low, -1.0).tolist(), "q99": np.where(finite, high, 1.0).tolist()}}
        proprio_dim = self.state_dim if self.oft and options["tiny_proprio"] else 0
        if self.oft and options["tiny_proprio"] and not proprio_dim:
            raise UserError("policy.kwargs.tiny_proprio=1 needs a 'state' observation (env.obs_mode=state+rgb).")
        if proprio_dim:
            stats["proprio"] = {"q01": [-1.0] * proprio_dim, "q99": [1.0] * proprio_dim}
        return load_tiny(
            options["tiny"], {DATASET: stats}, oft=self.oft, proprio_dim=proprio_dim,
            l1_action_dim=self.action_dim if self.oft and options["tiny_l1_head"] else 0,
            dtype="float32" if options["dtype"] == "config" else options["dtype"],
            attn_implementation=options["attn_implementation"],
        )

    def _proprio_stats(self, stats: dict[str, Any]) -> BoundsQ99 | None:
        projector = getattr(self.model, "proprio_projector", None)
        if projector is None:
            return None
        if projector.proprio_dim != self.state_dim:
            raise UserError(
                f"the checkpoint's proprio projector reads a state of {projector.proprio_dim} dimensions; the env's "
                f"'state' has {self.state_dim or 'none'} (env.obs_mode=state+rgb gives one)."
            )
        if "proprio" not in stats:
            raise UserError(f"the checkpoint has a proprio projector but '{self.unnorm_key}' has no proprio statistics.")
        return BoundsQ99.from_stats(stats["proprio"], where=f"'{self.unnorm_key}' proprio statistics")

    def _set_trainable(self) -> None:
        """Full fine-tune: everything but frozen towers and the L1 head; LoRA: adapters and the value head."""
        lora = has_lora(self.model)
        freeze_vision = bool(self.options["freeze_vision"])
        for name, param in self.model.named_parameters():
            if lora:
                param.requires_grad_("lora_" in name)
            elif name.startswith("vision_backbone.") and freeze_vision:
                param.requires_grad_(False)
            elif name.startswith("action_head."):
                param.requires_grad_(False)
            else:
                param.requires_grad_(True)

    def _enable_gradient_checkpointing(self) -> None:
        """Recompute activations in backward (transformers only does it in training mode)."""
        modules = [self.model.llm, self.model.vision_backbone.featurizer, self.model.vision_backbone.fused_featurizer]
        for module in (m for m in modules if m is not None):
            enable = getattr(module, "activation_checkpointing_enable", None)  # transformers >= 5.x
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # -- inputs ---------------------------------------------------------------------------------------

    def _pixel_values(self, obs: dict[str, Any]) -> torch.Tensor:
        """(B, N, 3 * towers, S, S) from the N cameras."""
        device = self.model.device
        per_camera = [self.images(torch.as_tensor(obs[key]).to(device)) for key in self.cameras]
        return torch.stack(per_camera, dim=1)

    def _prompt(self, obs: dict[str, Any], batch: int) -> PromptBatch:
        instructions = obs.get(INSTRUCTION_KEY)
        if instructions is None:
            instructions = [self.options["instruction"]] * batch
        elif len(instructions) != batch:
            raise ValueError(f"obs[{INSTRUCTION_KEY!r}] has {len(instructions)} instructions for a batch of {batch}")
        return self.prompts(list(instructions)).to(self.model.device)

    def _proprio(self, obs: dict[str, Any]) -> torch.Tensor | None:
        if self.proprio_stats is None:
            return None
        state = torch.as_tensor(obs["state"]).to(self.model.device)
        return self.proprio_stats.normalize_proprio(state.reshape(state.shape[0], -1)).float()

    def _inputs(self, obs: dict[str, Any]) -> tuple[torch.Tensor, PromptBatch]:
        """The prefix embeddings (B, P, H) and the prompts of a batch of observations."""
        pixels = self._pixel_values(obs)
        return self.model.prefix(pixels, self._proprio(obs)), self._prompt(obs, pixels.shape[0])

    def _token_ids(self, actions: torch.Tensor, batch: int) -> torch.Tensor:
        tokens = torch.as_tensor(actions).to(self.model.device).long().reshape(batch, self.num_tokens)
        tokenizer = self.model.action_tokenizer
        if ((tokens < tokenizer.first_id) | (tokens >= tokenizer.vocab_size)).any():
            raise ValueError(
                f"evaluate() scores action token ids in [{tokenizer.first_id}, {tokenizer.vocab_size}) as act() returns them"
            )
        return tokens  # (B, K)

    # -- outputs --------------------------------------------------------------------------------------

    def _env_actions(self, normalized: torch.Tensor) -> torch.Tensor:
        """Normalized actions (B, C, A) -> env actions (B, C, A) float32, (B, A) when C = 1."""
        actions = self.action_stats.unnormalize(normalized).float()
        return actions[:, 0] if self.action_chunk == 1 else actions

    def _level(self, per_token: torch.Tensor) -> torch.Tensor:
        return per_token if self.token_level else per_token.sum(-1)

    def _value(self, prompt_hidden: torch.Tensor) -> torch.Tensor | None:
        """The critic on the last prompt token's hidden state (B, H), in the value head's dtype (float32)."""
        if self.value_head is None:
            return None
        return self.value_head(prompt_hidden.to(self.value_head.net[0].weight.dtype))

    def _output(
        self, tokens: torch.Tensor, log_probs: torch.Tensor, prompt_hidden: torch.Tensor, normalized: torch.Tensor | None = None
    ) -> ActionOutput:
        batch = tokens.shape[0]
        shaped = tokens.reshape(batch, self.action_chunk, self.action_dim)  # (B, C, A)
        if normalized is None:
            normalized = self.model.action_tokenizer.decode(shaped)
        mask = torch.ones_like(tokens, dtype=torch.bool) if self.token_level else None
        return ActionOutput(shaped, self._level(log_probs), self._value(prompt_hidden),
                            self._env_actions(normalized), mask)

    def encode_actions(self, env_actions: torch.Tensor) -> torch.Tensor:
        """Env actions (B, A) or (B, C, A) in the dataset's units -> the action token ids (B, C, A)
        long that ``act`` would return for them: BOUNDS_Q99-normalized (clipped to [-1, 1]), then
        OpenVLA's 256 bins (the inverse of ``env_actions`` within half a bin)."""
        actions = torch.as_tensor(env_actions).to(self.model.device)
        shaped = actions.reshape(actions.shape[0], self.action_chunk, self.action_dim)  # (B, C, A)
        return self.model.action_tokenizer.encode(self.action_stats.normalize(shaped))

    # -- training state ------------------------------------------------------------------------------

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters that train (LoRA adapters and the value head, or all of a full fine-tune)."""
        return {name: p.detach() for name, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a :meth:`trainable_state_dict` (of a policy built the same way) into this one."""
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        unexpected, missing = sorted(set(state) - set(params)), sorted(set(params) - set(state))
        if unexpected or missing:
            raise UserError(
                f"trainable state does not match policy {self.name!r}: unexpected {unexpected[:5]}, missing {missing[:5]} "
                "(was it saved with the same lora_rank, lora_targets and value_head?)."
            )
        for name, value in state.items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise UserError(f"trainable state {name!r} has shape {tuple(value.shape)}, the policy {tuple(params[name].shape)}.")
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)

    def merge_lora(self) -> None:
        """Fold the LoRA adapters into the language model's weights (same outputs, no adapters left)."""
        merge_lora(self.model)


class OpenVLAPolicy(VLAPolicy):
    """OpenVLA: K = C * A action tokens decoded one by one (KV cache); evaluate is one teacher-forced pass."""

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> ActionOutput:
        prefix, prompt = self._inputs(obs)
        generated = self.model.generate(prefix, prompt, self.num_tokens, self.sampler, deterministic)
        return self._output(generated.tokens, generated.log_probs, generated.prompt_hidden)

    def evaluate(self, obs: dict[str, Any], actions: torch.Tensor) -> Evaluation:
        prefix, prompt = self._inputs(obs)
        tokens = self._token_ids(actions, prefix.shape[0])
        logits, prompt_hidden = self.model.score(prefix, prompt, tokens)  # (B, K, n_bins)
        log_probs = self.sampler.log_probs(logits)
        token_log_probs = gather(log_probs, self.model.action_tokenizer.to_bin(tokens))
        return Evaluation(self._level(token_log_probs), self._level(entropy(log_probs)), self._value(prompt_hidden))

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        """One pass over the prompt (no decoding)."""
        if self.value_head is None:
            raise NotImplementedError(f"policy {self.name!r} was built without a value head (value_head: 0)")
        prefix, prompt = self._inputs(obs)
        return self._value(self.model.prompt_hidden(prefix, prompt))


class OpenVLAOFTPolicy(VLAPolicy):
    """OpenVLA-OFT: the whole chunk's K tokens from one bidirectional pass, sampled independently."""

    unnormalize_eps = 1e-8
    oft = True

    def __init__(
        self, cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, options: dict[str, Any]
    ) -> None:
        super().__init__(cfg, observation_space, action_space, options)
        self.eval_head = options["eval_head"]
        if self.eval_head == "l1":
            head = self.model.action_head
            if head is None:
                raise UserError("policy.kwargs.eval_head=l1 needs a checkpoint with an action_head--*_checkpoint.pt file.")
            if head.action_dim != self.action_dim:
                raise UserError(f"the L1 action head predicts {head.action_dim} dimensions, the env needs {self.action_dim}.")

    def _parallel(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(action hidden states (B, K, H), processed log-probabilities (B, K, n_bins))."""
        prefix, prompt = self._inputs(obs)
        hidden = self.model.parallel(prefix, prompt, self.num_tokens)
        return hidden, self.sampler.log_probs(self.model.action_logits(hidden))

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> ActionOutput:
        """Sampled (or greedy) tokens of the discrete head; deterministic with ``eval_head: l1``,
        the env executes the L1 head's actions (the official OFT evaluation)."""
        hidden, log_probs = self._parallel(obs)
        bins = self.sampler.choose(log_probs, deterministic)  # (B, K)
        tokens = self.model.action_tokenizer.from_bin(bins)
        normalized = self.model.l1_actions(hidden) if deterministic and self.eval_head == "l1" else None
        return self._output(tokens, gather(log_probs, bins), hidden[:, 0], normalized)

    def evaluate(self, obs: dict[str, Any], actions: torch.Tensor) -> Evaluation:
        hidden, log_probs = self._parallel(obs)
        tokens = self._token_ids(actions, hidden.shape[0])
        token_log_probs = gather(log_probs, self.model.action_tokenizer.to_bin(tokens))
        return Evaluation(self._level(token_log_probs), self._level(entropy(log_probs)), self._value(hidden[:, 0]))

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        if self.value_head is None:
            raise NotImplementedError(f"policy {self.name!r} was built without a value head (value_head: 0)")
        hidden, _ = self._parallel(obs)
        return self._value(hidden[:, 0])


def _action_dim(action_space: gym.spaces.Space, name: str) -> int:
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise UserError(f"policy {name!r} produces continuous action vectors; the env's action space is {action_space}.")
    return int(action_space.shape[0])
