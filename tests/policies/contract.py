"""Checks every policy of the Policy contract must pass (shared by the per-model test files)."""

from __future__ import annotations

import torch

from policies.base import Policy


def assert_gradients_reach_every_parameter(policy: Policy, obs: dict[str, torch.Tensor], actions: torch.Tensor | None = None) -> None:
    """A PPO-shaped loss on ``evaluate(obs, actions)`` (actions sampled by ``act`` when not given)
    gives every parameter a finite, non-zero gradient."""
    if actions is None:
        with torch.no_grad():
            actions = policy.act(obs).actions
    ev = policy.evaluate(obs, actions)
    (-ev.logprobs.mean() - 0.01 * ev.entropy.mean() + ev.values.pow(2).mean()).backward()
    for name, param in policy.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
