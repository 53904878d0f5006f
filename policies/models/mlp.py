"""MLP actor-critic for state observations, discrete (Categorical) or continuous (Gaussian) actions."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from embodied.errors import UserError
from policies.base import ActionOutput, Evaluation, Policy
from policies.config import PolicyConfig
from policies.registry import POLICIES

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str, out_gain: float) -> nn.Sequential:
    """Orthogonally initialized MLP (the PPO default: sqrt(2) gains inside, ``out_gain`` at the end)."""
    if activation not in ACTIVATIONS:
        raise UserError(f"policy.activation={activation!r} is not one of {', '.join(ACTIVATIONS)}.")
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(dims[-1], out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class RunningNorm(nn.Module):
    """Running mean/variance of inputs (parallel Welford); buffers travel with the weights."""

    def __init__(self, dim: int, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))
        self.clip = clip

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:  # x: (B, D)
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total) / total
        self.count = total

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)


class _DiagonalGaussian:
    """A Gaussian with a state-independent diagonal std, its log-density and entropy summed over the
    action dims in closed form (the same numbers as ``torch.distributions.Normal``, in a third of the
    ops: this runs for every rollout step and every minibatch)."""

    _LOG_2PI = math.log(2 * math.pi)

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor) -> None:
        self.mean, self.log_std = mean, log_std  # (B, D), (D,)

    def sample(self) -> torch.Tensor:
        with torch.no_grad():
            return self.mean + self.log_std.exp() * torch.randn_like(self.mean)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """(B,) log-density of (B, D) actions."""
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return -0.5 * z.square().sum(-1) - (self.log_std.sum() + 0.5 * self.mean.shape[-1] * self._LOG_2PI)

    def entropy(self) -> torch.Tensor:
        """(B,) entropy, the same for every row."""
        per_row = self.log_std.sum() + 0.5 * self.mean.shape[-1] * (1.0 + self._LOG_2PI)
        return per_row.expand(self.mean.shape[0])


class ActorCriticHeads(Policy):
    """Actor and critic MLP heads on features from ``_features(obs)`` (B, F), with a Categorical
    (Discrete) or state-independent Gaussian (Box) action distribution. Subclasses build the
    encoder and call :meth:`_build_heads`.

    With ``policy.action_chunk`` C > 1 the actor predicts C actions at once (its output layer is
    C times wider): actions are (B, C, *action_shape) (Box) or (B, C) (Discrete), and a chunk's
    logprob and entropy are the sums over its C actions (independent given the observation)."""

    def _build_heads(self, cfg: PolicyConfig, action_space: gym.spaces.Space, feature_dim: int, name: str) -> None:
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            self.act_dim = int(action_space.n)
            self.action_shape: tuple[int, ...] = ()
        elif isinstance(action_space, gym.spaces.Box):
            self.act_dim = int(np.prod(action_space.shape))
            self.action_shape = tuple(action_space.shape)
        else:
            raise UserError(f"policy {name!r} supports Discrete and Box action spaces, not {action_space}.")
        self.action_chunk = int(cfg.action_chunk)
        hidden = list(cfg.hidden_sizes)
        self.actor = mlp(feature_dim, hidden, self.action_chunk * self.act_dim, cfg.activation, out_gain=0.01)
        self.critic = mlp(feature_dim, hidden, 1, cfg.activation, out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((self.action_chunk * self.act_dim,), float(cfg.init_log_std)))

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def _dist(self, x: torch.Tensor) -> Categorical | _DiagonalGaussian:
        out = self.actor(x)  # (B, C * act_dim)
        if self.discrete:  # one Categorical per chunk step: batch shape (B,) or (B, C)
            logits = out if self.action_chunk == 1 else out.reshape(out.shape[0], self.action_chunk, self.act_dim)
            return Categorical(logits=logits, validate_args=False)
        return _DiagonalGaussian(out, self.log_std)

    def _logprob(self, dist: Categorical | _DiagonalGaussian, actions: torch.Tensor) -> torch.Tensor:
        batch = actions.shape[0]
        if self.discrete and self.action_chunk == 1:
            return dist.log_prob(actions.long().reshape(batch))
        if self.discrete:
            return dist.log_prob(actions.long().reshape(batch, self.action_chunk)).sum(-1)
        return dist.log_prob(actions.reshape(batch, -1))

    def _entropy(self, dist: Categorical | _DiagonalGaussian) -> torch.Tensor:
        entropy = dist.entropy()  # (B,), or (B, C) for a chunk of discrete actions
        return entropy.sum(-1) if self.discrete and self.action_chunk > 1 else entropy

    def _shape_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Flat samples -> (B, *action_shape), (B, C, *action_shape) or (B, C) for Discrete chunks."""
        if self.discrete:
            return actions
        chunk = () if self.action_chunk == 1 else (self.action_chunk,)
        return actions.reshape(actions.shape[0], *chunk, *self.action_shape)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActionOutput:
        x = self._features(obs)
        dist = self._dist(x)
        if deterministic:
            actions = dist.probs.argmax(-1) if self.discrete else dist.mean
        else:
            actions = dist.sample()
        logprobs = self._logprob(dist, actions)
        return ActionOutput(self._shape_actions(actions), logprobs, self.critic(x).squeeze(-1))

    def evaluate(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> Evaluation:
        x = self._features(obs)
        dist = self._dist(x)
        return Evaluation(self._logprob(dist, actions), self._entropy(dist), self.critic(x).squeeze(-1))

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.critic(self._features(obs)).squeeze(-1)


class MLPActorCritic(ActorCriticHeads):
    """Separate actor and critic MLPs on the flattened ``state`` observation."""

    def __init__(self, cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> None:
        super().__init__()
        if "state" not in observation_space.spaces:
            raise UserError(
                f"policy 'mlp' needs a 'state' observation; the env gives {list(observation_space.spaces)}. "
                "Use env.obs_mode=state or a pixel policy (policy.name=cnn)."
            )
        self.obs_dim = int(np.prod(observation_space["state"].shape))
        self.normalizer = RunningNorm(self.obs_dim) if cfg.normalize_obs else None
        self._build_heads(cfg, action_space, self.obs_dim, "mlp")

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = obs["state"].reshape(obs["state"].shape[0], -1).float()  # (B, D)
        return self.normalizer(x) if self.normalizer is not None else x

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if self.normalizer is not None:
            self.normalizer.update(obs["state"].reshape(obs["state"].shape[0], -1).float())


@POLICIES.register("mlp")
def make_mlp(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """MLP actor-critic on state observations (discrete or continuous actions)."""
    return MLPActorCritic(cfg, observation_space, action_space)
