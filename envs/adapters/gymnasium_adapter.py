"""Any gymnasium env: a registered id, ``module:EnvId``, or ``package.module:ClassName``."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import gymnasium as gym

from embodied.errors import UserError, did_you_mean
from envs.config import EnvConfig
from envs.registry import register_adapter
from envs.serial import SerialVecEnv


def _resolve(env_id: str) -> tuple[str, Any]:
    """("class", cls) for ``package.module:ClassName``, else ("id", gymnasium id)."""
    if ":" in env_id:
        module_name, attr = env_id.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise UserError(f"env.id={env_id!r}: cannot import module {module_name!r} ({err}).") from None
        obj = getattr(module, attr, None)
        if isinstance(obj, type):
            return "class", obj
        # gymnasium's own "module:EnvId" syntax: importing the module registered the id.
        if attr in gym.registry:
            return "id", attr
        raise UserError(
            f"env.id={env_id!r}: module {module_name!r} has no class {attr!r} and registered no "
            f"gymnasium id {attr!r}."
        )
    if env_id not in gym.registry:
        raise UserError(
            f"Unknown env id {env_id!r}: it is not a registered gymnasium id.{did_you_mean(env_id, gym.registry)} "
            "Give a registered id, 'module:EnvId' (the module registers it on import), or "
            "'package.module:ClassName' of your own gymnasium.Env class."
        )
    return "id", env_id


def make_single_env(cfg: EnvConfig, render: bool = False) -> gym.Env:
    """One gymnasium env as the config describes (time limit, kwargs, rgb render mode)."""
    kind, target = _resolve(cfg.id)
    kwargs = dict(cfg.kwargs)
    if render:
        kwargs.setdefault("render_mode", "rgb_array")
    if kind == "class":
        env = target(**kwargs)
        if cfg.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
        return env
    return gym.make(target, max_episode_steps=cfg.max_episode_steps, **kwargs)


def _claims(env_id: str) -> bool:
    return True  # the generic fallback: unknown ids get a clear error from make_single_env


@register_adapter("gymnasium", _claims, priority=100, doc="Any gymnasium env by id, module:EnvId or module:Class.")
def make_gymnasium(cfg: EnvConfig, seed: int) -> SerialVecEnv:
    """Any gymnasium env by id, ``module:EnvId`` or ``package.module:ClassName``."""
    _resolve(cfg.id)  # fail fast, in this process, with a clear message
    if cfg.obs_mode != "state":
        raise UserError(f"env.obs_mode={cfg.obs_mode!r} is not supported by the gymnasium adapter yet; use 'state'.")
    fn = functools.partial(make_single_env, cfg)
    return SerialVecEnv([fn] * cfg.num_envs)
