"""The one policy contract. PPO/GRPO code never branches on the model type.

Shapes: B = batch of envs (or samples), A = action dim, C = action chunk length (1 for per-step
policies). Observations are the env contract's dict of batch-first arrays (``envs.base``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn


@dataclass
class ActionOutput:
    """What ``Policy.act`` returns; all tensors on the policy's device.

    actions:  (B, A) continuous, (B,) discrete, or (B, C, A) when ``action_chunk`` > 1.
    logprobs: (B,) log-probability of the whole action (summed over dims and chunk steps).
    values:   (B,) critic value of the observation, or None for critic-free policies (GRPO).
    """

    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor | None


@dataclass
class Evaluation:
    """What ``Policy.evaluate`` returns for given (obs, actions): logprobs (B,), entropy (B,),
    values (B,) or None."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None


class Policy(nn.Module, ABC):
    """An actor (optionally with a critic) acting on batched env observations."""

    #: number of actions predicted per observation (VLA action chunks); 1 for per-step policies.
    action_chunk: int = 1
    #: whether ``values`` are produced (PPO needs a critic; GRPO does not).
    has_critic: bool = True

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


def space_dims(observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> tuple[int, int, bool]:
    """(state dim, action dim or number of discrete actions, is_discrete) for one env."""
    state = observation_space["state"]
    obs_dim = int(torch.tensor(state.shape).prod().item())
    if isinstance(action_space, gym.spaces.Discrete):
        return obs_dim, int(action_space.n), True
    if isinstance(action_space, gym.spaces.Box):
        return obs_dim, int(torch.tensor(action_space.shape).prod().item()), False
    raise TypeError(f"unsupported action space {action_space}")
