"""LIBERO benchmark suites (hf-libero 0.1.4 on robosuite 1.4).

Id syntax (``env.id``):

* ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``, ``libero_90``: every task
  of the suite; env i runs task ``i mod num_tasks`` (in the suite's standard order).
* ``<suite>/<k>``: the suite's task number k (0-based, standard order), e.g. ``libero_spatial/3``.
* ``<suite>/<task_name>``: a task by its LIBERO name, e.g.
  ``libero_goal/open_the_middle_drawer_of_the_cabinet`` (:func:`list_tasks` lists them).

Initial states: LIBERO ships a fixed set of initial states per task (50) for evaluation. Number
them over the selected tasks, interleaved: state g is trial ``g // num_tasks`` of task
``g % num_tasks`` (``total`` = num_tasks * 50). With ``env.kwargs.init_states = "fixed"`` (the
default) env i starts from state ``i mod total``, so an eval batch of ``total`` envs runs every
state exactly once. Each env stays on its task: its later episodes step through the task's states
with a stride of the number of envs on that task, so a smaller batch walks through all of them,
episode after episode, without two envs repeating each other. With ``"random"`` each episode
draws a state of the env's task from the env's seeded RNG. After setting the state, the
simulation settles for ``num_settle_steps`` (10) no-op steps, as OpenVLA's and RLinf's evaluations do.

Observations (per env): ``state`` (8,) float32 = end-effector position (3), end-effector
orientation as axis-angle (3), gripper finger positions (2), the proprio state OpenVLA-OFT and
RLinf feed their models; with ``obs_mode`` ``rgb`` or ``state+rgb`` also ``rgb`` (agentview) and
``rgb/wrist`` (eye-in-hand), (image_size, image_size, 3) uint8, rotated 180 degrees as OpenVLA,
OpenVLA-OFT and RLinf preprocess LIBERO frames (matching the released LIBERO datasets).
Actions (7,): end-effector delta pose (6) + gripper (-1 open, +1 close), OSC_POSE controller.
Reward 1.0 and ``terminated`` on success (``env._check_success()``); ``info["success"]`` every
step; truncation at ``env.max_episode_steps`` (default per suite: spatial 220, object 280, goal
300, libero_10 520, libero_90 400, as in OpenVLA's evaluation).
Instructions (``VecEnv.instructions``): each env's task language, the instruction the LIBERO
datasets (and the VLAs trained on them) use.

Scene assets: hf-libero ships the task files and initial states but not the scene assets
(meshes, textures), which it would download at run time. They are looked for, in order, in
``env.kwargs.assets_path``, ``$LIBERO_ASSETS_PATH``, ``<site-packages>/libero/libero/assets`` and
``~/.cache/libero/assets``; when none holds them :func:`make_libero` raises a
:class:`UserError` that says where to put them. Nothing is ever downloaded.

Config: LIBERO reads ``$LIBERO_CONFIG_PATH/config.yaml`` and asks on stdin when it is missing;
:func:`prepare_libero_config` writes it first (into ``~/.cache/embodied/libero`` unless the user
set ``LIBERO_CONFIG_PATH``), in every process, before LIBERO is imported.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError, did_you_mean
from envs.adapters.gymnasium_adapter import resolve_backend, vectorize
from envs.adapters.robosuite_adapter import (
    WRIST_CAMERA,
    NumpyRandomStream,
    SuiteRendering,
    box,
    check_obs_mode,
    prepare_mujoco_rendering,
    quat_to_axis_angle,
)
from envs.base import VecEnv
from envs.config import EnvConfig
from envs.registry import register_adapter

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
MAX_EPISODE_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
NUM_SETTLE_STEPS = 10
#: The no-op action of the settle steps: no motion, gripper open.
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], np.float64)
INIT_STATE_MODES = ("fixed", "random")
AGENT_CAMERA = "agentview"
#: Folders a complete LIBERO assets directory holds.
ASSET_DIRS = ("scenes", "articulated_objects", "stable_scanned_objects", "turbosquid_objects", "stable_hope_objects")
ASSET_MARKER = "scenes/libero_tabletop_base_style.xml"
PIP_LINES = "pip install robosuite==1.4.0 termcolor bddl==1.0.1 future easydict && pip install --no-deps hf-libero==0.1.4"


# --- config and package location --------------------------------------------------------------------


def libero_package_dir() -> Path:
    """``<site-packages>/libero/libero`` (found without importing it)."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"LIBERO is not installed. Install it with: {PIP_LINES}")
    return Path(list(spec.submodule_search_locations)[0]) / "libero"


def default_config_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "embodied" / "libero"


def _write_config(path: Path, package_dir: Path) -> None:
    import yaml

    content = {
        "benchmark_root": str(package_dir),
        "bddl_files": str(package_dir / "bddl_files"),
        "init_states": str(package_dir / "init_files"),
        "datasets": str(package_dir.parent / "datasets"),
        "assets": str(package_dir / "assets"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config.", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(content, f)
    os.replace(tmp, path)  # atomic: several env processes may race here


def prepare_libero_config() -> Path:
    """Make ``import libero.libero`` non-interactive; returns the config folder.

    A user's ``LIBERO_CONFIG_PATH`` is kept (its config.yaml is written only when missing);
    otherwise ``LIBERO_CONFIG_PATH`` is set to ``~/.cache/embodied/libero`` (a temporary folder
    if that is not writable) whose config.yaml points at the installed package.
    """
    package_dir = libero_package_dir()
    user_dir = os.environ.get("LIBERO_CONFIG_PATH")
    if user_dir:
        config = Path(user_dir) / "config.yaml"
        if not config.exists():
            _write_config(config, package_dir)
        return Path(user_dir)
    folder = default_config_dir()
    config = folder / "config.yaml"
    try:
        stale = not config.exists() or str(package_dir / "bddl_files") not in config.read_text()
        if stale:
            _write_config(config, package_dir)
    except OSError:
        folder = Path(tempfile.mkdtemp(prefix="libero-config-"))
        _write_config(folder / "config.yaml", package_dir)
    os.environ["LIBERO_CONFIG_PATH"] = str(folder)
    return folder


def _benchmark_module() -> Any:
    prepare_libero_config()
    try:
        from libero.libero import benchmark
    except ImportError as err:
        raise UserError(f"LIBERO cannot be imported ({err}). Install it with: {PIP_LINES}") from None
    return benchmark


# --- suites, tasks, initial states ------------------------------------------------------------------


@dataclass(frozen=True)
class LiberoTask:
    """One LIBERO task: where its files are and what it asks for."""

    suite: str
    index: int
    """Position in the suite's standard order (``<suite>/<index>``)."""
    name: str
    instruction: str
    """The language instruction (the LIBERO datasets' wording)."""
    bddl_file: str
    init_states_file: str

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.index}"


def list_suites() -> list[str]:
    """The LIBERO suites this adapter serves."""
    return list(SUITES)


@functools.lru_cache(maxsize=None)
def _tasks(suite: str) -> tuple[LiberoTask, ...]:
    benchmark = _benchmark_module()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "[info] using task orders ..."
        bench = benchmark.get_benchmark_dict()[suite]()
    root = libero_package_dir()
    tasks = []
    for i, task in enumerate(bench.tasks):
        tasks.append(
            LiberoTask(
                suite=suite,
                index=i,
                name=task.name,
                instruction=task.language,
                bddl_file=str(root / "bddl_files" / task.problem_folder / task.bddl_file),
                init_states_file=str(root / "init_files" / task.problem_folder / task.init_states_file),
            )
        )
    return tuple(tasks)


def _check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise UserError(f"Unknown LIBERO suite {suite!r}.{did_you_mean(suite, SUITES)} Suites: {', '.join(SUITES)}.")


def list_tasks(suite: str) -> list[LiberoTask]:
    """The tasks of ``suite`` in its standard order."""
    _check_suite(suite)
    return list(_tasks(suite))


def load_init_states(task: LiberoTask) -> np.ndarray:
    """The task's fixed initial states, (num_states, state_dim) float64 MuJoCo states."""
    import torch

    states = torch.load(task.init_states_file, weights_only=False)  # a pickled numpy array
    return np.asarray(states, np.float64)


def parse_id(env_id: str) -> tuple[str, list[LiberoTask]]:
    """(suite, selected tasks) of an id in the syntax of the module docstring."""
    suite, _, selector = env_id.partition("/")
    _check_suite(suite)
    tasks = list_tasks(suite)
    if not selector:
        return suite, tasks
    if re.fullmatch(r"\d+", selector):
        k = int(selector)
        if k >= len(tasks):
            raise UserError(f"env.id={env_id!r}: {suite} has tasks 0..{len(tasks) - 1}.")
        return suite, [tasks[k]]
    by_name = {t.name: t for t in tasks}
    if selector not in by_name:
        raise UserError(
            f"env.id={env_id!r}: {suite} has no task {selector!r}.{did_you_mean(selector, by_name)} "
            f"Use a task number 0..{len(tasks) - 1} or a name from envs.adapters.libero_adapter.list_tasks({suite!r})."
        )
    return suite, [by_name[selector]]


def init_state_schedule(num_envs: int, num_tasks: int) -> list[tuple[int, int, int]]:
    """(task, first_trial, stride) per env for ``init_states="fixed"``.

    Env i runs task ``i % num_tasks``; its k-th episode uses trial ``first_trial + k * stride``
    (mod the task's number of states). With equal state counts per task this is global state
    ``(i + k * num_envs) mod total`` of the interleaved numbering (see the module docstring).
    """
    schedule = []
    for i in range(num_envs):
        task = i % num_tasks
        envs_on_task = len(range(task, num_envs, num_tasks))
        schedule.append((task, i // num_tasks, envs_on_task))
    return schedule


def env_tasks(env_id: str, num_envs: int) -> list[LiberoTask]:
    """The task each of ``num_envs`` envs runs for ``env_id`` (env i: task i mod num_tasks)."""
    _, tasks = parse_id(env_id)
    return [tasks[task_i] for task_i, _, _ in init_state_schedule(num_envs, len(tasks))]


# --- assets -----------------------------------------------------------------------------------------


def asset_search_paths(explicit: str | None = None) -> list[Path]:
    """Where LIBERO's scene assets are looked for, in order."""
    paths = []
    if explicit:
        paths.append(Path(explicit).expanduser())
    if os.environ.get("LIBERO_ASSETS_PATH"):
        paths.append(Path(os.environ["LIBERO_ASSETS_PATH"]).expanduser())
    paths.append(libero_package_dir() / "assets")  # where hf-libero looks first
    paths.append(Path(os.path.expanduser("~")) / ".cache" / "libero" / "assets")  # its download target
    return paths


def is_assets_dir(path: Path) -> bool:
    return all((path / d).is_dir() for d in ASSET_DIRS) and (path / ASSET_MARKER).is_file()


def find_assets(explicit: str | None = None) -> Path:
    """The first folder holding LIBERO's scene assets, or a :class:`UserError` saying how to supply them."""
    paths = asset_search_paths(explicit)
    for path in paths:
        if is_assets_dir(path):
            return path
    looked = "; ".join(str(p) for p in paths)
    raise UserError(
        f"LIBERO's scene assets are missing (no {ASSET_MARKER} with the folders {', '.join(ASSET_DIRS)}). "
        f"Looked in: {looked}. hf-libero does not ship them and nothing is downloaded at run time. "
        f"On a machine with internet, download them (the Hugging Face dataset 'lerobot/libero-assets', e.g. "
        f"`huggingface-cli download lerobot/libero-assets --repo-type dataset --local-dir libero-assets`, "
        f"or the libero/libero/assets folder of github.com/Lifelong-Robot-Learning/LIBERO) and copy that folder "
        f"to {paths[-2]} (where LIBERO looks) or {paths[-1]}, or point env.kwargs.assets_path or the "
        f"LIBERO_ASSETS_PATH environment variable at it."
    )


# --- one LIBERO task as a gymnasium env -------------------------------------------------------------


def rotate_180(image: np.ndarray) -> np.ndarray:
    """LIBERO frame as the LIBERO datasets and the VLAs trained on them see it."""
    return np.ascontiguousarray(image[::-1, ::-1])


def proprio_state(raw: dict[str, np.ndarray]) -> np.ndarray:
    """(8,) float32: eef position, eef axis-angle, gripper finger positions."""
    return np.concatenate(
        [raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]]
    ).astype(np.float32)


class LiberoEnv(SuiteRendering, gym.Env):
    """One LIBERO task in a LIBERO ``OffScreenRenderEnv`` (``ControlEnv`` without cameras)."""

    metadata = {"render_modes": ["rgb_array"]}
    camera = AGENT_CAMERA
    orient = staticmethod(rotate_180)

    def __init__(
        self,
        bddl_file: str,
        init_states: np.ndarray,
        assets_path: str,
        first_trial: int = 0,
        trial_stride: int = 1,
        init_state_mode: str = "fixed",
        obs_mode: str = "state",
        image_size: int = 128,
        max_episode_steps: int = 300,
        num_settle_steps: int = NUM_SETTLE_STEPS,
        render: bool = False,
        seed: int | None = None,
        **env_kwargs: Any,
    ) -> None:
        check_obs_mode(obs_mode)
        prepare_libero_config()
        prepare_mujoco_rendering()
        import libero.libero as libero_root

        # LIBERO would otherwise try a download when its package folder has no assets.
        libero_root._assets_path_cache = str(assets_path)
        from libero.libero.envs.env_wrapper import ControlEnv, OffScreenRenderEnv

        self.init_states = np.asarray(init_states, np.float64)
        self.trial = first_trial % len(self.init_states)
        self.trial_stride = trial_stride
        self.init_state_mode = init_state_mode
        self.obs_mode = obs_mode
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps
        self.num_settle_steps = num_settle_steps
        self.render_mode = "rgb_array" if render or obs_mode != "state" else None
        self._rng = NumpyRandomStream(seed)
        self._trial_rng = np.random.default_rng(seed)
        use_rgb = obs_mode != "state"
        env_kwargs.update(
            bddl_file_name=bddl_file,
            camera_heights=image_size,
            camera_widths=image_size,
            camera_names=[AGENT_CAMERA, WRIST_CAMERA],
            use_camera_obs=use_rgb,
            ignore_done=True,  # the time limit is counted here, as truncation
        )
        if self.render_mode is not None:
            self.env = OffScreenRenderEnv(**env_kwargs)
        else:
            self.env = ControlEnv(has_renderer=False, has_offscreen_renderer=False, **env_kwargs)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        spaces = {"state": box((8,))}
        if use_rgb:
            spaces["rgb"] = box((image_size, image_size, 3), np.uint8)
            spaces["rgb/wrist"] = box((image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self._steps = 0
        self.current_trial = -1
        self._last_obs: dict[str, np.ndarray] | None = None

    def _observe(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        obs = {"state": proprio_state(raw)}
        if self.obs_mode != "state":
            obs["rgb"] = rotate_180(raw[f"{AGENT_CAMERA}_image"])
            obs["rgb/wrist"] = rotate_180(raw[f"{WRIST_CAMERA}_image"])
        return obs

    def _next_trial(self) -> int:
        if self.init_state_mode == "random":
            return int(self._trial_rng.integers(len(self.init_states)))
        trial = self.trial
        self.trial = (self.trial + self.trial_stride) % len(self.init_states)
        return trial

    def _reset_sim(self) -> dict[str, np.ndarray]:
        self.env.reset()
        raw = self.env.set_init_state(self.init_states[self.current_trial])
        for _ in range(self.num_settle_steps):
            raw, _, _, _ = self.env.step(SETTLE_ACTION)
        return raw

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng.seed(seed)
            self._trial_rng = np.random.default_rng(seed)
        self.current_trial = self._next_trial()
        raw = self._rng.run(self._reset_sim)
        self._steps = 0
        self._last_obs = self._observe(raw)
        return self._last_obs, {"init_state": self.current_trial}

    def step(self, action: np.ndarray):
        raw, reward, _, _ = self.env.step(np.asarray(action, np.float64))
        self._steps += 1
        success = bool(self.env.check_success())
        self._last_obs = self._observe(raw)
        truncated = self._steps >= self.max_episode_steps and not success
        return self._last_obs, float(reward), success, truncated, {"success": success}



# --- adapter ----------------------------------------------------------------------------------------


def _claims(env_id: str) -> bool:
    # every "libero*" id, so that a misspelt suite gets LIBERO's "did you mean"
    return env_id.partition("/")[0].startswith("libero")


@register_adapter("libero", _claims, priority=20, doc="LIBERO suites and tasks: libero_spatial, libero_goal/3, ...")
def make_libero(cfg: EnvConfig, seed: int) -> VecEnv:
    """LIBERO suites and tasks: ``libero_spatial``, ``libero_goal/3``, ``libero_10/<task_name>``."""
    check_obs_mode(cfg.obs_mode)
    suite, tasks = parse_id(cfg.id)
    kwargs = dict(cfg.kwargs)
    mode = kwargs.pop("init_states", "fixed")
    if mode not in INIT_STATE_MODES:
        raise UserError(f"env.kwargs.init_states={mode!r}; use one of {', '.join(INIT_STATE_MODES)}.")
    assets = find_assets(kwargs.pop("assets_path", None))
    num_settle_steps = int(kwargs.pop("num_settle_steps", NUM_SETTLE_STEPS))
    render = bool(kwargs.pop("render", False))
    max_steps = cfg.max_episode_steps or MAX_EPISODE_STEPS[suite]
    states = [load_init_states(t) for t in tasks]
    env_fns = []
    for i, (task_i, first_trial, stride) in enumerate(init_state_schedule(cfg.num_envs, len(tasks))):
        env_fns.append(
            functools.partial(
                LiberoEnv,
                tasks[task_i].bddl_file,
                states[task_i],
                str(assets),
                first_trial=first_trial,
                trial_stride=stride,
                init_state_mode=mode,
                obs_mode=cfg.obs_mode,
                image_size=cfg.image_size,
                max_episode_steps=max_steps,
                num_settle_steps=num_settle_steps,
                render=render,
                seed=seed + i,
                **kwargs,
            )
        )
    instructions = [t.instruction for t in env_tasks(cfg.id, cfg.num_envs)]
    return vectorize(env_fns, cfg, resolve_backend(cfg, auto="multiprocess"), instructions)
