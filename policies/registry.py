"""The policy registry: ``POLICIES.get(name)(cfg, observation_space, action_space) -> Policy``."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from embodied.errors import UserError
from embodied.registry import Registry
from policies.base import Policy
from policies.config import PolicyConfig

PolicyFactory = Callable[[PolicyConfig, gym.spaces.Dict, gym.spaces.Space], Policy]
POLICIES: Registry[PolicyFactory] = Registry("policy")


def build_policy(cfg: PolicyConfig, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space) -> Policy:
    """Instantiate the registered policy ``cfg.name`` for these spaces."""
    import policies.models  # noqa: F401  (registers the built-in models)

    chunk = cfg.action_chunk
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise UserError(f"policy.action_chunk={chunk!r} must be a positive integer (1: one action per step).")
    policy = POLICIES.get(cfg.name)(cfg, observation_space, action_space)
    if policy.action_chunk != chunk:
        raise UserError(
            f"policy {cfg.name!r} predicts {policy.action_chunk} action(s) per observation, not "
            f"policy.action_chunk={chunk}; it does not support action chunks."
        )
    return policy
