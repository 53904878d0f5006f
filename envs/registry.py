"""The env adapter registry and ``make_vec_env``.

An adapter turns an :class:`~envs.config.EnvConfig` into a :class:`~envs.base.VecEnv`. Adapters
register themselves; ``env.adapter=auto`` asks each adapter, in order of registration priority,
whether it claims the id. A user plugs in their own env without touching this file: any
gymnasium id, ``module:EnvId`` or ``package.module:ClassName`` goes through the gymnasium adapter.
"""

from __future__ import annotations

import importlib.util
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
    takes_device: the adapter builds its simulator on ``env.kwargs.device`` (``cpu``, ``cuda``,
              ``cuda:N``, ``auto``), so ``workers.env_device`` reaches it there.
    """

    claims: Callable[[str], bool]
    make: Callable[[EnvConfig, int], VecEnv]
    priority: int = 50
    doc: str = ""
    takes_device: bool = False


ADAPTERS: Registry[EnvAdapter] = Registry("env adapter")


def register_adapter(name: str, claims: Callable[[str], bool], priority: int = 50, doc: str = "",
                     takes_device: bool = False):
    """Decorator for a ``make(cfg, seed) -> VecEnv`` function: registers it as adapter ``name``
    (``takes_device``: see :class:`EnvAdapter`)."""

    def decorator(make: Callable[[EnvConfig, int], VecEnv]):
        ADAPTERS.add(name, EnvAdapter(claims, make, priority, doc or (make.__doc__ or ""), takes_device), doc or make.__doc__)
        return make

    return decorator


def takes_device(cfg: EnvConfig) -> bool:
    """Whether the adapter of ``cfg`` builds its simulator on ``env.kwargs.device``; False for an
    id that no adapter claims (building it names that problem)."""
    try:
        return ADAPTERS.get(resolve_adapter(cfg)).takes_device
    except UserError:
        return False


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
    check_env_module(cfg.id)
    return ADAPTERS.get(resolve_adapter(cfg)).make(cfg, seed)


def check_env_module(env_id: str) -> None:
    """For a ``package.module:Name`` id: a UserError saying how to make the module importable when
    Python cannot find it (or a package above it) on ``sys.path``. A module that is found but fails
    while it imports is left to the adapter, whose message names that error."""
    if ":" not in env_id:
        return
    module_name = env_id.split(":", 1)[0]
    try:
        found = importlib.util.find_spec(module_name) is not None
        missing = module_name
    except ModuleNotFoundError as err:  # a package above it is missing
        found, missing = False, err.name or module_name
    except (ImportError, ValueError):
        return
    if not found:
        raise UserError(not_importable_message(env_id, module_name, missing))


def not_importable_message(env_id: str, module_name: str, missing: str) -> str:
    """What to do when ``module_name`` of ``env.id`` (``missing``: the first part Python did not
    find) is not on ``sys.path``: the folder holding its top package goes on PYTHONPATH, or the
    package is installed. The ``embodied`` command does not search the current directory."""
    top = module_name.split(".", 1)[0]
    if missing != top:  # its package is importable: the module is not in it
        return (f"env.id={env_id!r}: cannot import module {module_name!r}: Python finds package {top!r} but no "
                f"module {missing!r} in it. Check the module's name (env.id='package.module:ClassName').")
    cwd = Path.cwd()
    here = (cwd / top).is_dir() or (cwd / f"{top}.py").is_file()
    where = (f"{top!r} is in the current directory {cwd}, which the `embodied` command does not search: run "
             f"`PYTHONPATH={shlex.quote(str(cwd))} embodied train ...`" if here else
             f"the current directory is {cwd}; put the folder that holds {top!r} on PYTHONPATH "
             f"(`PYTHONPATH=/path/to/that/folder embodied train ...`)")
    return (f"env.id={env_id!r}: cannot import module {module_name!r} (no module named {missing!r} on Python's "
            f"path). Your env's package must be importable: {where}, or install it (`pip install -e .` in its "
            "project).")


def load_builtin_adapters() -> None:
    # Importing the adapter modules registers them. Each import is cheap: simulators are
    # imported lazily inside ``make``.
    import envs.adapters  # noqa: F401
