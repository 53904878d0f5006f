"""Any gymnasium env: a registered id, ``module:EnvId``, or ``package.module:ClassName``.

Backends (``env.backend``): ``inprocess`` steps the envs one after another in this process
(:class:`SerialVecEnv`), ``multiprocess`` spreads them over ``env.num_procs`` worker processes
(:class:`MultiprocessVecEnv`); ``auto`` is ``inprocess`` (gymnasium envs are usually cheap, and
one process has no message overhead).

Pixel observations (``env.obs_mode`` ``rgb`` or ``state+rgb``): the env renders with
``render_mode="rgb_array"`` at ``env.image_size`` square, and the observation becomes
``{"state": (D,) float32, "rgb": (H, W, 3) uint8}`` (``rgb`` mode drops ``state``). MuJoCo envs
render offscreen through EGL (``MUJOCO_GL=egl``, Debian package ``libegl1``) or OSMesa
(``libosmesa6``); the first one present is chosen when ``MUJOCO_GL`` is unset. Shadows,
reflections and the skybox are switched off for pixel observations: with a software renderer they
cost most of a frame's time and add nothing a policy needs.
"""

from __future__ import annotations

import ctypes.util
import functools
import importlib
import inspect
import os
import re
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

from embodied.errors import UserError, did_you_mean
from envs.base import VecEnv
from envs.config import EnvConfig
from envs.multiprocess import MultiprocessVecEnv
from envs.registry import register_adapter
from envs.serial import SerialVecEnv
from envs.wrappers import WithoutTerminations

OBS_MODES = ("state", "rgb", "state+rgb")
BACKENDS = ("auto", "inprocess", "multiprocess")


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


def _is_mujoco(kind: str, target: Any) -> bool:
    """Whether the env is a gymnasium MuJoCo env (accepts ``width``/``height`` for rendering)."""
    if kind == "id":
        entry = gym.spec(target).entry_point
        if not isinstance(entry, str):
            target = entry
        else:
            return entry.startswith("gymnasium.envs.mujoco")
    try:
        from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
    except ImportError:  # mujoco not installed
        return False
    return isinstance(target, type) and issubclass(target, MujocoEnv)


def ensure_mujoco_gl() -> str | None:
    """Choose MuJoCo's offscreen GL backend (EGL, else OSMesa) unless ``MUJOCO_GL`` is set.

    Must run before MuJoCo's rendering module is imported (it reads the variable on import).
    """
    if "MUJOCO_GL" not in os.environ:
        for backend, lib in (("egl", "EGL"), ("osmesa", "OSMesa")):
            if ctypes.util.find_library(lib):
                os.environ["MUJOCO_GL"] = backend
                break
    return os.environ.get("MUJOCO_GL")


def make_single_env(cfg: EnvConfig, render: bool = False) -> gym.Env:
    """One gymnasium env as the config describes (time limit, kwargs, rgb render mode, pixels)."""
    kind, target = _resolve(cfg.id)
    kwargs = dict(cfg.kwargs)
    pixels = cfg.obs_mode != "state"
    mujoco = _is_mujoco(kind, target)
    if render or pixels:
        kwargs.setdefault("render_mode", "rgb_array")
        if mujoco:
            ensure_mujoco_gl()
            kwargs.setdefault("width", cfg.image_size)
            kwargs.setdefault("height", cfg.image_size)
    try:
        if kind == "class":
            env = target(**kwargs)
            if cfg.max_episode_steps is not None:
                env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
        else:
            env = gym.make(target, max_episode_steps=cfg.max_episode_steps, **kwargs)
    except TypeError as err:
        raise unknown_kwarg(err, cfg.id, cfg.kwargs, env_class(kind, target)) or err
    except ImportError as err:  # a dependency the env needs (or a version it refuses, e.g. Pusher-v4 on mujoco>=3)
        raise UserError(f"env.id={cfg.id!r} cannot be built here: {err}") from None
    if pixels:
        env = PixelObservation(env, cfg.image_size, keep_state=cfg.obs_mode == "state+rgb", fast_mujoco=mujoco)
    return env


def _init_parameters(cls: type) -> set[str]:
    """Keyword parameters of ``cls.__init__`` and of the ``__init__`` of its bases (which take
    what a ``**kwargs`` passes on)."""
    names: set[str] = set()
    for klass in getattr(cls, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        names |= {p.name for p in params if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names


def env_class(kind: str, target: Any) -> type | None:
    """The class behind a resolved env id (its entry point), or None if it is not a class."""
    if kind == "id":
        entry = gym.spec(target).entry_point
        try:
            target = load_env_creator(entry) if isinstance(entry, str) else entry
        except Exception:  # noqa: BLE001 - only used to explain another error
            return None
    return target if isinstance(target, type) else None


def unknown_kwarg(
    err: TypeError, env_id: str, given: Iterable[str], *classes: type | None, also: Iterable[str] = ()
) -> UserError | None:
    """A UserError for an ``env.kwargs`` key (one of ``given``) that the env does not take (a
    typo, usually), naming the parameters of ``classes`` (and ``also``) that it does take; None
    when ``err`` is another TypeError."""
    found = re.search(r"unexpected keyword argument '(\w+)'", str(err))
    if found is None or found[1] not in set(given):
        return None
    name = found[1]
    params = sorted(set(also).union(*(_init_parameters(cls) for cls in classes if cls is not None)))
    listing = f" Its parameters: {', '.join(params)}." if params else ""
    return UserError(f"env.kwargs.{name}: {env_id} takes no parameter {name!r}.{did_you_mean(name, params)}{listing}")


class PixelObservation(gym.ObservationWrapper):
    """Adds the rendered frame to the observation: ``{"state"?: (D,) float32, "rgb": (S, S, 3) uint8}``.

    Frames not already ``size`` x ``size`` are resized (bilinear); the state is the env's own
    observation, flattened, as float32.
    """

    def __init__(self, env: gym.Env, size: int, keep_state: bool = True, fast_mujoco: bool = False) -> None:
        super().__init__(env)
        if env.render_mode != "rgb_array":
            raise UserError(f"pixel observations need render_mode='rgb_array', {env.spec.id if env.spec else env} has {env.render_mode!r}.")
        self.size = size
        self.keep_state = keep_state
        self.fast_mujoco = fast_mujoco
        self._viewer_tuned = False
        spaces: dict[str, gym.Space] = {}
        if keep_state:
            flat = gym.spaces.flatten_space(env.observation_space)
            spaces["state"] = gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), flat.shape, np.float32)
        spaces["rgb"] = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)

    def observation(self, observation: Any) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        if self.keep_state:
            out["state"] = np.asarray(gym.spaces.flatten(self.env.observation_space, observation), np.float32)
        out["rgb"] = self._frame()
        return out

    def _frame(self) -> np.ndarray:
        if self.fast_mujoco and not self._viewer_tuned:
            self._tune_mujoco_viewer()
        frame = np.asarray(self.env.render())
        if frame.shape[:2] != (self.size, self.size):
            from PIL import Image

            frame = np.asarray(Image.fromarray(frame[..., :3]).resize((self.size, self.size), Image.BILINEAR))
        return np.ascontiguousarray(frame[..., :3], dtype=np.uint8)

    def _tune_mujoco_viewer(self) -> None:
        # Shadows, reflections and skybox cost a software renderer most of a frame's time.
        import mujoco

        self._viewer_tuned = True
        renderer = getattr(self.env.unwrapped, "mujoco_renderer", None)
        if renderer is None:
            return
        viewer = renderer._get_viewer("rgb_array")
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
            viewer.scn.flags[flag] = False


def resolve_backend(cfg: EnvConfig, auto: str, allowed: tuple[str, ...] = BACKENDS) -> str:
    """``cfg.backend`` validated against the adapter's ``allowed`` backends, with ``auto``
    replaced by the adapter's choice ``auto``."""
    if cfg.backend not in allowed:
        raise UserError(f"env.backend={cfg.backend!r} is not one of {', '.join(allowed)}.{did_you_mean(cfg.backend, allowed)}")
    return auto if cfg.backend == "auto" else cfg.backend


def default_num_procs(cfg: EnvConfig) -> int:
    """``cfg.num_procs`` when set (> 0), else one process per available core, at most one per env."""
    if cfg.num_procs is not None and cfg.num_procs > 0:
        return min(cfg.num_procs, cfg.num_envs)
    return max(1, min(cfg.num_envs, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def vectorize(env_fns: list, cfg: EnvConfig, backend: str, instructions: list[str] | None = None,
              preload: tuple[str, ...] = ()) -> VecEnv:
    """The VecEnv of ``env_fns`` on ``backend`` (``inprocess`` or ``multiprocess``); applies the
    config's single-env wrappers (``ignore_terminations``), its NaN/inf policy (``nonfinite``) and
    the env processes' timeouts. ``preload``: the simulator's modules, imported once by the
    forkserver that starts the env processes instead of by each of them (a slow import)."""
    if cfg.ignore_terminations:
        env_fns = [WithoutTerminations(fn) for fn in env_fns]
    if backend == "inprocess":
        return SerialVecEnv(env_fns, instructions, env_id=cfg.id, nonfinite=cfg.nonfinite, timeout_s=cfg.timeout_s,
                            start_timeout_s=cfg.start_timeout_s)
    return MultiprocessVecEnv(
        env_fns, default_num_procs(cfg), instructions, spin_s=cfg.worker_spin_us * 1e-6, timeout_s=cfg.timeout_s,
        start_timeout_s=cfg.start_timeout_s, env_id=cfg.id, nonfinite=cfg.nonfinite, preload=preload,
    )


def _claims(env_id: str) -> bool:
    return True  # the generic fallback: unknown ids get a clear error from make_single_env


@register_adapter("gymnasium", _claims, priority=100, doc="Any gymnasium env by id, module:EnvId or module:Class.")
def make_gymnasium(cfg: EnvConfig, seed: int) -> VecEnv:
    """Any gymnasium env by id, ``module:EnvId`` or ``package.module:ClassName``."""
    _resolve(cfg.id)  # fail fast, in this process, with a clear message
    if cfg.obs_mode not in OBS_MODES:
        raise UserError(f"env.obs_mode={cfg.obs_mode!r} is not one of {', '.join(OBS_MODES)}.{did_you_mean(cfg.obs_mode, OBS_MODES)}")
    backend = resolve_backend(cfg, auto="inprocess")
    fn = functools.partial(make_single_env, cfg)
    return vectorize([fn] * cfg.num_envs, cfg, backend)
