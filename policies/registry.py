"""The policy registry: ``POLICIES.get(name)(cfg, observation_space, action_space) -> Policy``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import torch

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
    if cfg.path is not None and not policy.loads_path:
        raise UserError(f"policy.path={cfg.path!r}: policy {cfg.name!r} loads no pretrained checkpoint; remove policy.path "
                        "(the VLA policies openvla and openvla_oft read one).")
    if cfg.init is not None:
        load_init(policy, cfg.init)
    return policy


def init_file(path: str | Path) -> Path:
    """The safetensors file ``policy.init`` names: the file itself, or the model of a checkpoint
    dir or of a run dir's latest checkpoint."""
    from embodied.checkpoint import MODEL_FILE, find_checkpoint

    path = Path(path).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        raise UserError(f"policy.init={str(path)!r} does not exist: give a .safetensors file of the policy's weights, "
                        "a checkpoint dir or a run dir (a warm start's cache entry may have been deleted: run it again).")
    return find_checkpoint(path) / MODEL_FILE


def load_init(policy: Policy, path: str | Path) -> dict[str, int]:
    """Copy the tensors of ``policy.init`` (see :func:`init_file`) into ``policy``. Every tensor of
    the file must be one of the policy's (``state_dict`` names) with its shape; the policy's
    tensors the file lacks keep their values. Returns ``{"loaded": n, "kept": m}``."""
    from safetensors.torch import load_file

    file = init_file(path)
    tensors = load_file(str(file))
    state = policy.state_dict()
    unexpected = sorted(set(tensors) - set(state))
    misshaped = [f"{k} {tuple(v.shape)} (the policy's: {tuple(state[k].shape)})"
                 for k, v in tensors.items() if k in state and tuple(v.shape) != tuple(state[k].shape)]
    if unexpected or misshaped:
        raise UserError(
            f"policy.init={str(file)!r} does not fit the policy {policy.__class__.__name__}: "
            + (f"tensors it does not have: {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}; " if unexpected else "")
            + (f"other shapes: {misshaped[:5]}; " if misshaped else "")
            + "was it saved from a policy built with the same policy.* settings?"
        )
    with torch.no_grad():
        for name, value in tensors.items():
            state[name].copy_(value.to(state[name].dtype))
    return {"loaded": len(tensors), "kept": len(state) - len(tensors)}
