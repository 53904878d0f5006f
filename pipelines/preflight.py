"""Checks that run in the driver before a run dir is created: the env exists and builds, and the
policy fits its observation and action spaces. Bad input fails here, with nothing written."""

from __future__ import annotations

import dataclasses
from typing import Any

from embodied.errors import UserError
from envs.registry import make_vec_env
from policies.registry import build_policy


def preflight(cfg) -> tuple[Any, Any]:
    """(observation_space, action_space) of one env of ``cfg.env``; raises UserError on bad input."""
    env = make_vec_env(dataclasses.replace(cfg.env, num_envs=1), seed=cfg.seed)
    try:
        obs_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    policy_cfg = cfg.policy
    if getattr(getattr(cfg, "warmstart", None), "expert", None) is not None:
        policy_cfg = dataclasses.replace(policy_cfg, init=None)  # the warm start sets it
    try:
        build_policy(policy_cfg, obs_space, action_space)
    except UserError:
        raise
    except (TypeError, ValueError, RuntimeError) as err:
        raise UserError(
            f"policy {cfg.policy.name!r} does not fit env {cfg.env.id!r} (observations {obs_space}, "
            f"actions {action_space}): {err}"
        ) from None
    return obs_space, action_space
