"""Rollout backends: the engine that generates responses inside a rollout worker.

    backend = ROLLOUT_BACKENDS.get(cfg.workers.rollout_backend)(cfg, device)
    gen = backend.generate(prompts, samples=8)      # n = len(prompts) * 8 responses, prompt-major
    backend.load_weights(payload)                    # the trainer's weights (WeightSyncer payload)

A backend must return, for every sampled token, its logprob under the **processed** sampling
distribution that the trainer recomputes (``policy.kwargs`` temperature, top-k, top-p): the
trainer's ratio compares the two. ``transformers`` is the built-in one: the ``causal_lm`` policy's
batched ``generate`` with a KV cache. An inference engine (vLLM, SGLang) is added on GPU machines
by registering a class with this interface; it must load the trainer's weight payloads (names as in
the ``causal_lm`` policy's ``state_dict``) and return its logprobs of the processed distribution
(otherwise set ``algo.rollout_is`` to correct for the difference).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from embodied.registry import Registry
from embodied.runtime.weights import WeightPayload, WeightSyncer
from policies.registry import build_policy


@dataclass
class Generation:
    """``n = prompts x samples`` responses, prompt-major: rows ``i*samples .. i*samples+samples-1``
    answer prompt i. Tensors on the CPU.

    prompt_ids:    (n, P') long, left-padded to the longest prompt of the call (P' <= any width).
    prompt_mask:   (n, P') bool, True on real prompt tokens.
    response_ids:  (n, K) long, K = max_new_tokens, padded after the EOS.
    logprobs:      (n, K) float32, each sampled token's logprob under the processed distribution
                   (0 outside ``response_mask``).
    response_mask: (n, K) bool, True up to and including the first EOS.
    truncated:     (n,) bool, the response has no EOS (cut at K tokens).
    texts:         n decoded responses (EOS and special tokens removed).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    logprobs: torch.Tensor
    response_mask: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]

    def __len__(self) -> int:
        return int(self.response_ids.shape[0])


class RolloutBackend(ABC):
    """A generation engine. ``pad_token_id``: the id that pads prompts and responses."""

    pad_token_id: int

    @abstractmethod
    def generate(self, prompts: Sequence[Any], samples: int = 1, greedy: bool = False) -> Generation:
        """``samples`` responses to each prompt (text or chat messages), sampled with the policy's
        settings, or greedy (``greedy=True``)."""

    @abstractmethod
    def load_weights(self, payload: WeightPayload) -> int:
        """Load the trainer's weights; returns their version."""

    @abstractmethod
    def weights_mib(self) -> float:
        """MiB a weight sync brings to this backend (what the planner charges for it)."""

    def kv_cache_gib(self, tokens: int) -> float:
        """GiB of cache one response of ``tokens`` tokens (prompt and response) holds; 0: unknown."""
        return 0.0


#: name -> ``factory(cfg: ReasoningConfig, device: torch.device) -> RolloutBackend``
ROLLOUT_BACKENDS: Registry[Callable[[Any, torch.device], RolloutBackend]] = Registry("rollout backend")


@ROLLOUT_BACKENDS.register("transformers")
class TransformersRollout(RolloutBackend):
    """transformers ``generate`` with a KV cache through the ``causal_lm`` policy (any device)."""

    def __init__(self, cfg: Any, device: torch.device) -> None:
        self.policy = build_policy(cfg.policy, None, None).to(device).eval()
        self.pad_token_id = self.policy.pad_token_id
        self.syncer = WeightSyncer()

    @torch.no_grad()
    def generate(self, prompts: Sequence[Any], samples: int = 1, greedy: bool = False) -> Generation:
        obs = self.policy.encode_prompts(list(prompts))  # (p, P') each
        if samples > 1:
            obs = {k: v.repeat_interleave(samples, dim=0) for k, v in obs.items()}  # (p * samples, P')
        out = self.policy.act(obs, deterministic=greedy)
        assert out.mask is not None
        return Generation(
            prompt_ids=obs["prompt_ids"].cpu(),
            prompt_mask=obs["prompt_mask"].cpu(),
            response_ids=out.actions.cpu(),
            logprobs=out.logprobs.float().cpu(),
            response_mask=out.mask.cpu(),
            truncated=self.policy.truncated(out.actions).cpu(),
            texts=self.policy.decode(out.actions, out.mask),
        )

    def load_weights(self, payload: WeightPayload) -> int:
        return self.syncer.load(self.policy, payload)

    def weights_mib(self) -> float:
        tensors = self.syncer.tensors(self.policy)
        return sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20

    def kv_cache_gib(self, tokens: int) -> float:
        config = self.policy.model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype_bytes = next(self.policy.parameters()).element_size()
        return 2 * config.num_hidden_layers * heads * head_dim * tokens * dtype_bytes / 2**30  # keys and values
