"""CNN actor-critic for pixel observations (ManiSkill rgb / state+rgb, MuJoCo pixels).

Each camera key (``"rgb"``, ``"rgb/<camera>"``) gets its own NatureCNN encoder, the encoder of
ManiSkill's PPO rgb baseline (conv 8x8/4 32ch, 4x4/2 64ch, 3x3/1 64ch, flatten, linear
``feature_dim``); a ``"state"`` key, when present, gets a linear embedding of the same width.
The features are concatenated into one shared trunk feeding an actor head (Categorical for
Discrete, Gaussian with a state-independent log std for Box) and a critic head, both MLPs of
``policy.hidden_sizes``. Gradients of both heads train the shared encoder.

Flatten sizes per input: 128x128 -> 64 x 12 x 12 = 9216, 64x64 -> 64 x 4 x 4 = 1024; frames need
at least 36 pixels a side. The encoder uses ReLU (as NatureCNN); the heads use ``policy.activation``.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from embodied.errors import UserError
from policies.base import Policy
from policies.config import PolicyConfig
from policies.models.mlp import ActorCriticHeads, RunningNorm, _init
from policies.registry import POLICIES

#: ``policy.kwargs`` the CNN understands, with their defaults.
CNN_KWARGS: dict[str, Any] = {"feature_dim": 256, "channels": [32, 64, 64]}
#: (kernel, stride) of the three NatureCNN convolutions.
CONV_LAYOUT = ((8, 4), (4, 2), (3, 1))


def camera_keys(observation_space: gym.spaces.Dict) -> list[str]:
    """The image keys of an observation space: ``"rgb"`` first, then ``"rgb/<camera>"`` sorted."""
    keys = [k for k in observation_space.spaces if k == "rgb" or k.startswith("rgb/")]
    return sorted(keys, key=lambda k: (k != "rgb", k))


class NatureCNN(nn.Module):
    """uint8 frames (B, H, W, C) -> features (B, feature_dim); the flatten size comes from a dummy pass."""

    def __init__(self, image_shape: tuple[int, int, int], channels: list[int], feature_dim: int) -> None:
        super().__init__()
        height, width, in_channels = image_shape
        layers: list[nn.Module] = []
        for out_channels, (kernel, stride) in zip(channels, CONV_LAYOUT):
            layers += [_init(nn.Conv2d(in_channels, out_channels, kernel, stride), math.sqrt(2)), nn.ReLU()]
            in_channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            try:
                flat_dim = self.convs(torch.zeros(1, image_shape[2], height, width)).shape[1]
            except RuntimeError as err:
                raise UserError(
                    f"policy 'cnn' needs frames of at least 36x36 pixels, the env gives {height}x{width}. "
                    "Raise env.image_size."
                ) from err
        self.flat_dim = int(flat_dim)
        self.project = nn.Sequential(_init(nn.Linear(self.flat_dim, feature_dim), math.sqrt(2)), nn.ReLU())

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames.permute(0, 3, 1, 2).float() / 255.0  # (B, C, H, W) in [0, 1]
        return self.project(self.convs(x))  # (B, feature_dim)


class CNNActorCritic(ActorCriticHeads):
    """Shared pixel (+ state) encoder, actor and critic heads."""

    def __init__(self, cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> None:
        super().__init__()
        options = _options(cfg.kwargs)
        feature_dim, channels = int(options["feature_dim"]), [int(c) for c in options["channels"]]
        self.cameras = camera_keys(observation_space)
        if not self.cameras:
            raise UserError(
                f"policy 'cnn' needs an image observation ('rgb' or 'rgb/<camera>'); the env gives "
                f"{list(observation_space.spaces)}. Use env.obs_mode=rgb or state+rgb, or policy.name=mlp."
            )
        # ModuleDict names may not contain '.', and '/' reads badly in state_dict keys.
        self.encoders = nn.ModuleDict({
            _module_name(key): NatureCNN(_image_shape(observation_space[key], key), channels, feature_dim)
            for key in self.cameras
        })
        self.has_state = "state" in observation_space.spaces
        self.state_dim = int(np.prod(observation_space["state"].shape)) if self.has_state else 0
        self.normalizer = RunningNorm(self.state_dim) if self.has_state and cfg.normalize_obs else None
        self.state_encoder = None
        if self.has_state:
            self.state_encoder = nn.Sequential(_init(nn.Linear(self.state_dim, feature_dim), math.sqrt(2)), nn.ReLU())
        trunk_dim = feature_dim * (len(self.cameras) + int(self.has_state))
        self._build_heads(cfg, action_space, trunk_dim, "cnn")

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        device = self.actor[0].weight.device
        parts = [self.encoders[_module_name(key)](torch.as_tensor(obs[key], device=device)) for key in self.cameras]
        if self.state_encoder is not None:
            state = self._state(obs, device)
            parts.append(self.state_encoder(self.normalizer(state) if self.normalizer is not None else state))
        return torch.cat(parts, dim=-1)  # (B, feature_dim * parts)

    def _state(self, obs: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        state = torch.as_tensor(obs["state"], device=device)
        return state.reshape(state.shape[0], -1).float()  # (B, D)

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if self.normalizer is not None:
            self.normalizer.update(self._state(obs, self.normalizer.mean.device))


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(CNN_KWARGS))
    if unknown:
        allowed = ", ".join(CNN_KWARGS)
        raise UserError(f"policy.kwargs {unknown} are not understood by policy 'cnn'; allowed: {allowed}.")
    options = {**CNN_KWARGS, **kwargs}
    channels = options["channels"]
    if not isinstance(channels, (list, tuple)) or len(channels) != len(CONV_LAYOUT) or min(map(int, channels)) <= 0:
        raise UserError(
            f"policy.kwargs.channels={channels!r} must list {len(CONV_LAYOUT)} positive widths, e.g. [32, 64, 64]."
        )
    if int(options["feature_dim"]) <= 0:
        raise UserError(f"policy.kwargs.feature_dim={options['feature_dim']!r} must be a positive integer.")
    return options


def _image_shape(space: gym.spaces.Space, key: str, policy: str = "cnn") -> tuple[int, int, int]:
    shape = tuple(space.shape or ())
    if len(shape) != 3:
        raise UserError(f"policy {policy!r} expects {key!r} frames of shape (H, W, C), the env declares {shape}.")
    return int(shape[0]), int(shape[1]), int(shape[2])


def _module_name(key: str) -> str:
    return key.replace("/", "__").replace(".", "_")


@POLICIES.register("cnn")
def make_cnn(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """NatureCNN actor-critic on rgb (+ state) observations (discrete or continuous actions)."""
    return CNNActorCritic(cfg, observation_space, action_space)
