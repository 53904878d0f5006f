"""The one policy contract. PPO/GRPO code never branches on the model type.

Shapes: B = batch of envs (or samples), A = action dim, C = action chunk length (1 for per-step
policies), K = scored positions per sample for token-level policies (VLA action tokens, LLM
response tokens). Observations are the env contract's dict of batch-first arrays (``envs.base``)
as torch tensors, plus, where the env has language goals, ``obs[INSTRUCTION_KEY]``: a numpy array
of B Python strings (never a tensor). Policies that do not read language ignore it.

Two granularities of log-probabilities share the contract:

* **action-level** (MLP, CNN, the token transformer): ``logprobs`` is (B,), the log-probability of
  the whole action (chunk), summed over dimensions, chunk steps or tokens;
* **token-level** (VLAs with ``logprob_level: token``, causal LMs): ``logprobs`` is (B, K), one
  entry per scored token, and ``mask`` (B, K) says which entries are real (an LLM response ends at
  its first EOS; a VLA's action tokens are all real). Losses aggregate over the mask.

``actions`` is what the trajectory stores and what ``evaluate`` scores (for token policies: the
token ids); ``env_actions`` is what the env executes (for token policies: the de-tokenized,
unnormalized continuous actions). When ``env_actions`` is None the env executes ``actions``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils import _pytree as pytree

#: Observation key of the per-env language instruction (a numpy array of B strings).
INSTRUCTION_KEY = "instruction"


@dataclass
class ActionOutput:
    """What ``Policy.act`` returns; all tensors on the policy's device.

    actions:     (B, A) continuous, (B,) discrete, (B, C, A) when ``action_chunk`` > 1, or the
                 token ids a token policy sampled ((B, C, A) for a VLA, (B, K) for an LLM).
                 Stored in the trajectory; ``evaluate`` scores exactly these.
    logprobs:    (B,) log-probability of the whole action, or (B, K) per token (token-level).
    values:      (B,) critic value of the observation, or None for critic-free policies (GRPO).
    env_actions: what the env executes when it differs from ``actions`` (a VLA's de-tokenized
                 continuous actions, (B, C, A) float), else None.
    mask:        (B, K) bool for token-level logprobs: which positions are real; None otherwise.
    """

    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor | None
    env_actions: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@dataclass
class Evaluation:
    """What ``Policy.evaluate`` returns for given (obs, actions): logprobs and entropy of the
    same shape as ``act`` gave them ((B,) action-level or (B, K) token-level), values (B,) or None."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None


# A pytree node: FSDP2 runs ``evaluate`` as a forward method (``register_fsdp_forward_method``) and
# hooks its backward on the tensors of the output, which torch up to at least 2.11 finds with
# ``tree_flatten`` -- a plain dataclass is one opaque leaf there, no hook runs, the gradients stay
# on the gathered parameters and every shard's ``.grad`` is None (seen on an H200: grad_norm 0.0,
# weights unmoved). Later releases walk dataclasses themselves.
pytree.register_pytree_node(
    Evaluation,
    lambda e: ([e.logprobs, e.entropy, e.values], None),
    lambda children, _: Evaluation(*children),
)


class Policy(nn.Module, ABC):
    """An actor (optionally with a critic) acting on batched env observations."""

    #: number of actions predicted per observation (VLA action chunks); 1 for per-step policies.
    action_chunk: int = 1
    #: whether ``values`` are produced (PPO needs a critic; GRPO does not).
    has_critic: bool = True
    #: whether the policy loads a pretrained checkpoint directory from ``policy.path``.
    loads_path: bool = False
    #: the submodules that make up the critic (what ``algo.critic_warmup`` trains alone).
    critic_modules: tuple[str, ...] = ("critic", "value_head")

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critic's own parameters (those of :attr:`critic_modules` the policy has), not the
        features it shares with the actor."""
        return [p for name in self.critic_modules if isinstance(getattr(self, name, None), nn.Module)
                for p in getattr(self, name).parameters()]

    @abstractmethod
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActionOutput:
        """Sample (or take the mode of) actions for a batch of observations."""

    @abstractmethod
    def evaluate(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> Evaluation:
        """Logprobs, entropy and values of given actions under the current parameters."""

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Critic value (B,) of observations (used to bootstrap truncated episodes)."""
        out = self.act(obs, deterministic=True)
        if out.values is None:
            raise NotImplementedError(f"{type(self).__name__} has no critic")
        return out.values

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        """Update input-normalization statistics from a batch (no-op by default)."""

    def encode_actions(self, env_actions: torch.Tensor) -> torch.Tensor:
        """The stored form of actions an env executes: what ``act`` would return as ``actions``
        for them, and what ``evaluate`` scores. ``env_actions``: (B, *action_shape), or
        (B, C, *action_shape) with ``action_chunk`` C > 1. The identity for policies whose env
        actions are their actions (the default); token policies tokenize (a VLA: normalize, then
        its action tokens). Behaviour cloning scores demonstrations with it."""
        return env_actions

