"""The env adapter registry and ``make_vec_env``.

An adapter turns an :class:`~envs.config.EnvConfig` into a :class:`~envs.base.VecEnv`. Adapters
register themselves; ``env.adapter=auto`` asks each adapter, in order of registration priority,
whether it claims the id. A user plugs in their own env without touching this file: any
gymnasium id, ``module:EnvId`` or ``package.module:ClassName`` goes through the gymnasium adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from embodied.errors import UserError
from embodied.registry import Registry
from envs.base import VecEnv
from envs.config import EnvConfig


@dataclass(frozen=True)
class EnvAdapter:
    """How to build one family of envs.

    claims:   whether this adapter handles ``env_id`` under ``adapter=auto`` (cheap; no sim start).
    make:     builds the VecEnv from the config and a base seed.
    priority: adapters with a lower number are asked first (the generic gymnasium adapter is last).
    """

    claims: Callable[[str], bool]
    make: Callable[[EnvConfig, int], VecEnv]
    priority: int = 50
    doc: str = ""


ADAPTERS: Registry[EnvAdapter] = Registry("env adapter")


def register_adapter(name: str, claims: Callable[[str], bool], priority: int = 50, doc: str = ""):
    """Decorator for a ``make(cfg, seed) -> VecEnv`` function: registers it as adapter ``name``."""

    def decorator(make: Callable[[EnvConfig, int], VecEnv]):
        ADAPTERS.add(name, EnvAdapter(claims, make, priority, doc or (make.__doc__ or "")), doc or make.__doc__)
        return make

    return decorator


def resolve_adapter(cfg: EnvConfig) -> str:
    """The adapter name that builds ``cfg.id``."""
    load_builtin_adapters()
    if cfg.adapter != "auto":
        ADAPTERS.get(cfg.adapter)
        return cfg.adapter
    for name in sorted(ADAPTERS.names(), key=lambda n: ADAPTERS.get(n).priority):
        if ADAPTERS.get(name).claims(cfg.id):
            return name
    raise UserError(
        f"No env adapter recognises env.id={cfg.id!r}. Use a registered gymnasium id, "
        "'module:EnvId', 'package.module:ClassName', or set env.adapter to one of "
        f"{', '.join(ADAPTERS.names())}."
    )


def make_vec_env(cfg: EnvConfig, seed: int = 0) -> VecEnv:
    """Build the vectorized env that ``cfg`` describes (not yet reset)."""
    if cfg.num_envs < 1:
        raise UserError(f"env.num_envs must be >= 1, got {cfg.num_envs}.")
    return ADAPTERS.get(resolve_adapter(cfg)).make(cfg, seed)


def load_builtin_adapters() -> None:
    # Importing the adapter modules registers them. Each import is cheap: simulators are
    # imported lazily inside ``make``.
    import envs.adapters  # noqa: F401
