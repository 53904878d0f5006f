"""robosuite manipulation tasks (``robosuite/Lift``, ``robosuite/Stack``, ``robosuite/Door``, ...).

Id syntax: ``robosuite/<EnvName>`` with any environment robosuite registers (``Lift``, ``Stack``,
``NutAssembly``, ``PickPlace``, ``Door``, ``Wipe``, ``TwoArmLift``, ...).

Observations (per env):

* ``state`` (D,) float32: ``obs_mode=state`` and ``state+rgb``: every robot's ``robotK_proprio-state``
  then ``object-state`` (privileged object poses), flattened; ``obs_mode=rgb``: proprio only.
* ``rgb`` (image_size, image_size, 3) uint8 from ``camera`` (default ``agentview``), upright
  (robosuite renders upside down; rows are flipped here); ``rgb/wrist`` from
  ``robot0_eye_in_hand`` when ``wrist_camera=True``.

Actions: the controller's (default ``OSC_POSE``: 6-D end-effector delta + gripper, in [-1, 1]).
Reward: robosuite's (``reward_shaping=True`` by default). ``info["success"]`` is
``env._check_success()`` at every step; an episode terminates on success only with
``terminate_on_success=True`` (robosuite's own tasks run to the time limit), and is truncated at
``env.max_episode_steps`` (default 500).

``env.kwargs``: ``robot`` (default ``"Panda"``; two Pandas for the two-arm tasks), ``controller``
(default ``"OSC_POSE"``), ``camera``, ``wrist_camera``, ``terminate_on_success``, ``render``
(True: ``render()`` returns camera frames for videos even with state observations); every other
key goes to ``robosuite.make`` (defaults changed here: ``reward_shaping=True``,
``hard_reset=False``, which resets in place instead of rebuilding the model, far quicker); a key
that neither takes is a :class:`UserError` listing the parameters.

Backends: ``env.backend=auto`` (the default) and ``multiprocess`` run the envs in
``env.num_procs`` worker processes (:class:`~envs.multiprocess.MultiprocessVecEnv`), so the
simulator, its GL context and numpy's global RNG never live in the policy's process;
``inprocess`` steps them in this process (:class:`~envs.serial.SerialVecEnv`).

This module also holds what the robosuite-based adapters share (LIBERO builds on robosuite):
per-env numpy RNG streams, image orientation and quaternion helpers.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError, did_you_mean
from envs.adapters.gymnasium_adapter import ensure_mujoco_gl, resolve_backend, unknown_kwarg, vectorize
from envs.base import VecEnv
from envs.config import EnvConfig
from envs.registry import register_adapter

OBS_MODES = ("state", "rgb", "state+rgb")
DEFAULT_MAX_EPISODE_STEPS = 500
WRIST_CAMERA = "robot0_eye_in_hand"


# --- shared by the robosuite-based adapters ---------------------------------------------------------


def prepare_mujoco_rendering() -> None:
    """Headless offscreen rendering defaults, set before robosuite/mujoco are imported.

    ``MUJOCO_GL``: EGL (Mesa's software EGL on CPU-only machines, the NVIDIA driver's on GPUs),
    else OSMesa; a user's own setting wins. (robosuite would force EGL when it is unset.)
    """
    ensure_mujoco_gl()
    # robosuite warns on import about its optional private macro file; that is not actionable here.
    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)


def import_robosuite() -> Any:
    """``robosuite`` (1.4), with a clear error when the optional dependency is missing."""
    prepare_mujoco_rendering()
    try:
        import robosuite
    except ImportError as err:
        raise UserError(
            f"robosuite is not installed ({err}). Install it with: pip install robosuite==1.4.0 termcolor"
        ) from None
    return robosuite


def check_obs_mode(obs_mode: str) -> None:
    if obs_mode not in OBS_MODES:
        raise UserError(f"env.obs_mode={obs_mode!r} is not supported here; use one of {', '.join(OBS_MODES)}.")


def upright(image: np.ndarray) -> np.ndarray:
    """A robosuite camera image (OpenGL rows: bottom first) with its top row first."""
    return np.ascontiguousarray(image[::-1])


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> (3,) axis * angle in radians (robosuite's convention)."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3, np.float32)
    return (np.asarray(quat[:3], np.float64) * 2.0 * math.acos(w) / den).astype(np.float32)


class NumpyRandomStream:
    """A private ``np.random`` global state for one env.

    robosuite 1.4 and LIBERO draw object placements and init noise from numpy's GLOBAL random
    state; several envs in one process would share it. Each env swaps its own state in around the
    calls that sample (reset), so env i's episodes depend only on its own seed.
    """

    def __init__(self, seed: int | None) -> None:
        self.state = np.random.RandomState(seed).get_state()

    def seed(self, seed: int | None) -> None:
        self.state = np.random.RandomState(seed).get_state()

    def run(self, fn: Callable[[], Any]) -> Any:
        saved = np.random.get_state()
        np.random.set_state(self.state)
        try:
            return fn()
        finally:
            self.state = np.random.get_state()
            np.random.set_state(saved)


def box(shape: tuple[int, ...], dtype: Any = np.float32) -> gym.spaces.Box:
    if np.dtype(dtype) == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    return gym.spaces.Box(-np.inf, np.inf, shape, dtype)


# --- robosuite tasks as gymnasium envs --------------------------------------------------------------


class SuiteRendering:
    """``render()``/``close()`` of a gymnasium env around a robosuite-based env in ``self.env``
    (robosuite, LIBERO): frames from the camera observation when there is one, else rendered from
    ``self.camera`` and turned by ``orient``."""

    env: Any
    camera: str
    image_size: int
    render_mode: str | None
    _last_obs: dict[str, np.ndarray] | None
    orient: Callable[[np.ndarray], np.ndarray] = staticmethod(upright)

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            return None
        if self._last_obs is not None and "rgb" in self._last_obs:
            return self._last_obs["rgb"]
        frame = self.env.sim.render(width=self.image_size, height=self.image_size, camera_name=self.camera)
        return self.orient(frame)

    def close(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            env.close()
            self.env = None


class RobosuiteEnv(SuiteRendering, gym.Env):
    """One robosuite task as a gymnasium env with the contract's dict observations."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        env_name: str,
        robot: str | list[str] = "Panda",
        controller: str = "OSC_POSE",
        obs_mode: str = "state",
        image_size: int = 128,
        max_episode_steps: int = DEFAULT_MAX_EPISODE_STEPS,
        camera: str = "agentview",
        wrist_camera: bool = False,
        terminate_on_success: bool = False,
        render: bool = False,
        seed: int | None = None,
        **make_kwargs: Any,
    ) -> None:
        check_obs_mode(obs_mode)
        suite = import_robosuite()
        self.obs_mode = obs_mode
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps
        self.camera = camera
        self.wrist_camera = wrist_camera
        self.terminate_on_success = terminate_on_success
        self.render_mode = "rgb_array" if render or obs_mode != "state" else None
        self._rng = NumpyRandomStream(seed)
        use_rgb = obs_mode != "state"
        cameras = [camera] + ([WRIST_CAMERA] if wrist_camera else [])
        make_kwargs.setdefault("reward_shaping", True)
        # keep the compiled model between episodes: a reset then need not rebuild it
        make_kwargs.setdefault("hard_reset", False)
        try:
            self.env = suite.make(
                env_name,
                robots=robot,
                controller_configs=suite.load_controller_config(default_controller=controller),
                has_renderer=False,
                has_offscreen_renderer=self.render_mode is not None,
                use_camera_obs=use_rgb,
                use_object_obs=True,
                camera_names=cameras if use_rgb else camera,
                camera_heights=image_size,
                camera_widths=image_size,
                horizon=max_episode_steps,
                ignore_done=True,  # the time limit is counted here, as truncation
                **make_kwargs,
            )
        except TypeError as err:  # a misspelt env.kwargs key
            from robosuite.environments.base import REGISTERED_ENVS

            ours = ("robot", "robots", "controller", "camera", "wrist_camera", "terminate_on_success", "render")
            raise unknown_kwarg(err, f"robosuite/{env_name}", make_kwargs, REGISTERED_ENVS.get(env_name), also=ours) or err
        low, high = self.env.action_spec
        self.action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        raw = self._rng.run(self.env.reset)
        self._state_keys = sorted(k for k in raw if k.endswith("proprio-state"))
        if obs_mode != "rgb" and "object-state" in raw:
            self._state_keys.append("object-state")
        first = self._observe(raw)
        self.observation_space = gym.spaces.Dict({k: box(v.shape, v.dtype) for k, v in first.items()})
        self._last_obs = first
        self._steps = 0

    def _observe(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        obs = {"state": np.concatenate([np.ravel(raw[k]) for k in self._state_keys]).astype(np.float32)}
        if self.obs_mode != "state":
            obs["rgb"] = upright(raw[f"{self.camera}_image"])
            if self.wrist_camera:
                obs["rgb/wrist"] = upright(raw[f"{WRIST_CAMERA}_image"])
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng.seed(seed)
        self._last_obs = self._observe(self._rng.run(self.env.reset))
        self._steps = 0
        return self._last_obs, {}

    def step(self, action: np.ndarray):
        raw, reward, _, _ = self.env.step(np.asarray(action, np.float64))
        self._steps += 1
        success = bool(self.env._check_success())
        self._last_obs = self._observe(raw)
        terminated = success and self.terminate_on_success
        truncated = self._steps >= self.max_episode_steps and not terminated
        return self._last_obs, float(reward), terminated, truncated, {"success": success}


def _claims(env_id: str) -> bool:
    return env_id.startswith("robosuite/")


def robosuite_tasks() -> list[str]:
    """robosuite's own environments (``Lift``, ``Stack``, ...). Packages built on robosuite
    register theirs in the same registry (LIBERO's BDDL scenes, which need a problem file and
    have their own adapter); those are not ``robosuite/<name>`` tasks."""
    import_robosuite()  # rendering set up first, and a clear error without robosuite
    from robosuite.environments.base import REGISTERED_ENVS

    return sorted(name for name, cls in REGISTERED_ENVS.items() if getattr(cls, "__module__", "").startswith("robosuite."))


def _is_two_arm(env_name: str) -> bool:
    from robosuite.environments.base import REGISTERED_ENVS
    from robosuite.environments.manipulation.two_arm_env import TwoArmEnv

    cls = REGISTERED_ENVS.get(env_name)
    return isinstance(cls, type) and issubclass(cls, TwoArmEnv)


@register_adapter("robosuite", _claims, priority=20, doc="robosuite tasks by robosuite/<EnvName> (Lift, Stack, Door, ...).")
def make_robosuite(cfg: EnvConfig, seed: int) -> VecEnv:
    """robosuite tasks by ``robosuite/<EnvName>`` (``robosuite/Lift``, ``robosuite/Door``, ...)."""
    name = cfg.id.split("/", 1)[1] if "/" in cfg.id else cfg.id
    check_obs_mode(cfg.obs_mode)
    tasks = robosuite_tasks()
    if name not in tasks:
        raise UserError(
            f"env.id={cfg.id!r}: robosuite has no environment {name!r}.{did_you_mean(name, tasks)} "
            f"Known: {', '.join(tasks)}."
        )
    kwargs = dict(cfg.kwargs)
    if "robots" in kwargs:  # robosuite's own spelling
        kwargs["robot"] = kwargs.pop("robots")
    if "robot" not in kwargs and _is_two_arm(name):
        kwargs["robot"] = ["Panda", "Panda"]  # TwoArmLift, TwoArmHandover, ...: one robot per arm
    max_steps = cfg.max_episode_steps or DEFAULT_MAX_EPISODE_STEPS
    env_fns = [
        functools.partial(
            RobosuiteEnv,
            name,
            obs_mode=cfg.obs_mode,
            image_size=cfg.image_size,
            max_episode_steps=max_steps,
            seed=seed + i,
            **kwargs,
        )
        for i in range(cfg.num_envs)
    ]
    return vectorize(env_fns, cfg, resolve_backend(cfg, auto="multiprocess"))
