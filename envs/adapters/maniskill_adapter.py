"""ManiSkill3 tasks (any id in ManiSkill's registry, e.g. ``PushCube-v1``).

Backends (``env.backend``):

* ``auto``: ``batched`` when CUDA is available, else ``multiprocess``.
* ``batched``: ManiSkill's GPU simulation (``sim_backend="physx_cuda"``) of all envs in this
  process, returning torch tensors on ``device`` (:class:`ManiSkillBatchedEnv` behind
  :class:`~envs.adapters.batched_adapter.BatchedVecEnv`). Without CUDA the same code runs on
  ManiSkill's CPU simulation, which holds one env (``env.num_envs=1``): a way to try the GPU
  path on a laptop.
* ``multiprocess``: ``env.num_envs`` single CPU envs (ManiSkill's CPU backend refuses
  ``num_envs > 1`` per process), each wrapped in ManiSkill's ``CPUGymWrapper``, spread over
  ``env.num_procs`` processes (default: one per core, at most one per env).
* ``inprocess``: with CUDA, ``batched``; without, the single CPU envs stepped one after another
  in this process.

Observations (``env.obs_mode``), as the env contract's dict:

* ``state``: ``{"state": (D,) float32}``, ManiSkill's privileged state (robot + object poses, goal).
* ``rgb``: ``{"rgb": (H, W, 3) uint8, "state": (d,) float32}`` where ``state`` is only what a real
  robot would know (ManiSkill's proprioception ``agent`` + task ``extra`` of its rgb mode, e.g.
  joint positions/velocities, end-effector pose, goal position), flattened.
* ``state+rgb``: ``{"rgb": ..., "state": (D,) float32}`` with the privileged state.

Cameras render at ``env.image_size`` square. The first camera is ``"rgb"``; further cameras are
``"rgb/<camera name>"`` (separate keys rather than a stack: cameras may differ in size and a
policy can pick the ones it wants). ``success`` comes from ManiSkill's ``info["success"]``.

Several tasks (``env.id: PushCube-v1,PickCube-v1,StackCube-v1``): env i runs task
``(i // task_every) mod T`` of the list (``env.kwargs.task_every``, default 1: round robin; GRPO
sets it to ``algo.group_size`` so that a group's envs run one task), each with its own
instruction, on the CPU backends. Every env of such a batch shows one observation layout, the
**suite layout**: in ``rgb`` mode the ``state`` vector holds every ``agent``/``extra`` entry any of
the tasks has, in the order of their first appearance along the list, zeros where an env's task
lacks an entry (PickCube's ``goal_pos`` sits at the same offset for every env); in the ``state``
modes the privileged vectors are padded with zeros to the longest. ``env.kwargs.task`` (one id of
the list) runs that task on every env with the list's layout: how a multi-task policy is
evaluated task by task (:mod:`pipelines.suite_eval`).

Language (``instructions``): ManiSkill tasks have no language instruction; each task gets one
fixed sentence, from :data:`INSTRUCTIONS` for the common tasks, else derived from the task
class's "Task Description" docstring, else "complete the <task name> task".

Determinism: envs are made with ``enhanced_determinism=True``, so an auto-reset draws the next
episode from the env's own RNG (seeded by ``reset(seed)``) rather than from the process-global
torch RNG: the same seeds give the same episodes whatever ``num_procs`` is.

Every task in ManiSkill's registry either runs here (46 of 74 in ManiSkill 3.0.1, state and rgb,
multi-robot tasks included: their per-robot actions are one flat vector, the robots' actions
concatenated) or fails at once with a :class:`UserError` that says what is missing (assets; a
camera for ``rgb``; an obs mode the task lacks); ``tests/envs/test_maniskill.py`` sweeps them all.

Assets: tasks that need downloaded assets (YCB objects, PartNet-Mobility, scene datasets, some
robots) raise a :class:`UserError` that names the asset set and how to provide it. ManiSkill's
interactive download prompt is never shown (unattended it would be an ``EOFError`` or a hang).

Vulkan: ManiSkill needs a Vulkan device even for state observations; on machines without an
NVIDIA GPU, ``scripts/setup_vulkan.sh`` provides Mesa's lavapipe and :mod:`envs.vulkan`
activates it before ManiSkill is imported, here and in every worker process.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib.util
import re
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.errors import UserError, did_you_mean
from envs.adapters.batched_adapter import BatchedVecEnv
from envs.adapters.gymnasium_adapter import resolve_backend, unknown_kwarg, vectorize
from envs.base import VecEnv, env_seeds
from envs.config import EnvConfig
from envs.registry import register_adapter
from envs.vulkan import ensure_vulkan_env

OBS_MODES = {"state": "state", "rgb": "rgb", "state+rgb": "state+rgb"}  # ours -> ManiSkill's
BACKENDS = ("auto", "batched", "inprocess", "multiprocess")
#: ``env.kwargs`` the adapter reads itself for a list of tasks (never passed to ManiSkill).
SUITE_KWARGS = ("task_every", "task")
#: Imported once by the forkserver of the env processes (seconds of CPU each otherwise, torch included).
PRELOAD = ("mani_skill.envs",)

#: One instruction per common task (ManiSkill has no language; these describe the goal).
INSTRUCTIONS = {
    "PushCube-v1": "push the cube to the red and white target region",
    "PullCube-v1": "pull the cube back onto the target region",
    "PickCube-v1": "pick up the red cube and move it to the goal position",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "PegInsertionSide-v1": "insert the orange end of the peg into the hole in the box",
    "PushT-v1": "push the T-shaped block onto the T-shaped target",
    "PokeCube-v1": "use the peg to push the cube to the goal position",
    "LiftPegUpright-v1": "lift the peg lying on the table into an upright position",
    "PlaceSphere-v1": "place the sphere into the shallow bin",
    "RollBall-v1": "push the ball so that it rolls into the goal region",
    "PlugCharger-v1": "plug the charger into the receptacle on the wall",
    "PullCubeTool-v1": "use the tool to pull the cube within reach",
    "StackPyramid-v1": "stack the three cubes into a pyramid",
    "PickSingleYCB-v1": "pick up the object and move it to the goal position",
    "TurnFaucet-v1": "turn the faucet handle",
    "OpenCabinetDrawer-v1": "open the cabinet drawer",
    "OpenCabinetDoor-v1": "open the cabinet door",
    "DrawTriangle-v1": "draw the outlined triangle on the canvas",
    "DrawSVG-v1": "draw along the outlined path on the canvas",
}

_PRIORITY = 20  # before the generic gymnasium adapter (100): ManiSkill ids are gymnasium ids too
#: Signs, in SAPIEN's errors, that no Vulkan device is available.
_NO_VULKAN = ("rendering device", "physical device", "ErrorIncompatibleDriver", "ErrorInitializationFailed")


# --- registry and assets ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _installed() -> bool:
    return importlib.util.find_spec("mani_skill") is not None


def maniskill_registry() -> dict[str, Any]:
    """ManiSkill's task registry (id -> EnvSpec); imports ManiSkill once, Vulkan activated first."""
    ensure_vulkan_env()
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    from mani_skill.utils.registration import REGISTERED_ENVS

    return REGISTERED_ENVS


def parse_tasks(env_id: str) -> list[str]:
    """The task ids of ``env_id``: one id, or a comma-separated list (each id once, in order)."""
    parts = [p.strip() for p in env_id.split(",")]
    if not all(parts):
        raise UserError(f"env.id={env_id!r}: an empty task id in the comma-separated list.")
    return list(dict.fromkeys(parts))


def _claims(env_id: str) -> bool:
    if "," in env_id:
        return all(_claims(part) for part in parse_tasks(env_id))
    if ":" in env_id or "/" in env_id or not _installed():
        return False
    spec = gym.registry.get(env_id)
    if spec is not None:  # a gymnasium id already: its entry point tells, without importing ManiSkill
        entry = spec.entry_point
        module = entry if isinstance(entry, str) else getattr(getattr(entry, "func", entry), "__module__", "")
        return str(module).startswith("mani_skill")
    try:
        return env_id in maniskill_registry()
    except Exception:  # noqa: BLE001 - a broken ManiSkill install must not break other adapters
        return False


def missing_assets(env_id: str) -> list[str]:
    """The asset data sources task ``env_id`` declares and this machine lacks."""
    from mani_skill.utils import assets

    missing = []
    for asset_id in maniskill_registry()[env_id].asset_download_ids or []:
        if asset_id in assets.DATA_GROUPS:
            sources = assets.expand_data_group_into_individual_data_source_ids(asset_id)
        else:
            sources = [asset_id]
        missing += [s for s in sources if not assets.is_data_source_downloaded(s)]
    return missing


def _asset_help(what: str) -> str:
    import mani_skill

    return (
        f"{what} This machine cannot download assets at run time. On a machine with internet run "
        f"`python -m mani_skill.utils.download_asset <asset id>` (it writes to ~/.maniskill/data, or "
        f"$MS_ASSET_DIR/data), copy that data folder here to {mani_skill.ASSET_DIR}, or point "
        "MS_ASSET_DIR at the folder that contains it. Tasks that need no downloads: PushCube-v1, "
        "PickCube-v1, StackCube-v1, PegInsertionSide-v1, PushT-v1."
    )


def check_task(env_id: str) -> None:
    """UserError for an unknown task id or a task whose declared assets are missing."""
    registry = maniskill_registry()
    if env_id not in registry:
        raise UserError(
            f"Unknown ManiSkill task {env_id!r}.{did_you_mean(env_id, registry)} "
            f"Registered tasks: {', '.join(sorted(registry))}."
        )
    missing = missing_assets(env_id)
    if missing:
        ids = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        raise UserError(_asset_help(f"ManiSkill task {env_id!r} needs the asset set(s) {ids}, which are not downloaded."))


@contextlib.contextmanager
def _no_download_prompt() -> Iterator[None]:
    """Turn ManiSkill's interactive "download assets now?" prompt into a UserError."""
    from mani_skill.utils import download_asset

    def refuse(message: str) -> bool:
        message = message.replace("Would you like to download them now?", "").strip()
        raise UserError(_asset_help(f"ManiSkill needs assets that are not downloaded: {message}"))

    original = download_asset.prompt_yes_no
    download_asset.prompt_yes_no = refuse
    try:
        yield
    finally:
        download_asset.prompt_yes_no = original


def instruction_for(env_id: str) -> str:
    """The task's one-sentence instruction (see the module docstring)."""
    if env_id in INSTRUCTIONS:
        return INSTRUCTIONS[env_id]
    doc = maniskill_registry()[env_id].cls.__doc__ or ""
    found = re.search(r"\*\*Task Description:\*\*\s*(.+?)(?:\n\s*\n|\*\*|$)", doc, re.S)
    if found:
        sentence = " ".join(found.group(1).split()).split(". ")[0].strip(" .-")
        sentence = re.sub(r"^(A simple task where )?the (objective|goal) is to ", "", sentence, flags=re.I)
        return sentence[0].lower() + sentence[1:]
    name = re.sub(r"-v\d+$", "", env_id)
    return "complete the " + re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).lower() + " task"


# --- one CPU env ---------------------------------------------------------------------------------------


def _maniskill_kwargs(cfg: EnvConfig, sim_backend: str, num_envs: int) -> dict[str, Any]:
    kwargs = dict(cfg.kwargs)
    kwargs.setdefault("obs_mode", OBS_MODES[cfg.obs_mode])
    kwargs.setdefault("sim_backend", sim_backend)
    if sim_backend == "physx_cpu":
        kwargs.setdefault("render_backend", "cpu")
    kwargs.setdefault("render_mode", "rgb_array")  # VecEnv.render() for videos; costs only when called
    kwargs.setdefault("human_render_camera_configs", {"width": cfg.render_size, "height": cfg.render_size})
    # Unseeded (auto-)resets then draw from each env's own seeded RNG instead of the process's
    # global torch RNG: episodes are reproducible and do not depend on how envs share processes.
    kwargs.setdefault("enhanced_determinism", True)
    if cfg.obs_mode != "state":
        kwargs.setdefault("sensor_configs", {"width": cfg.image_size, "height": cfg.image_size})
    kwargs["num_envs"] = num_envs
    return kwargs


def make_cpu_env(cfg: EnvConfig, suite: tuple[str, ...] = ()) -> gym.Env:
    """One ManiSkill CPU env with numpy, unbatched outputs and the contract's observation dict;
    with ``suite`` (the task list ``cfg.id`` is one of), in the suite layout (module docstring)."""
    maniskill_registry()
    env = _cpu_gym_env(cfg)
    return ContractObservation(env, cfg.obs_mode, suite_layout(suite, cfg) if len(suite) > 1 else None)


def _cpu_gym_env(cfg: EnvConfig) -> gym.Env:
    from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

    env = make_raw_maniskill(cfg, "physx_cpu", 1)
    cpu = CPUGymWrapper(env)
    cpu.action_space = env.get_wrapper_attr("single_action_space")  # the flattened one of multi-robot tasks
    return cpu


@dataclass(frozen=True)
class SuiteLayout:
    """The observation every env of a task list shows (module docstring, "Several tasks").

    entries: for ``rgb``: ((group, name), size), each ``agent``/``extra`` entry of any task, by task
             in list order, then by name (so spaces and demo files give the same order);
             for the ``state`` modes: empty (the privileged vector is padded to ``dim``).
    cameras: the cameras every task has, in the first task's order (a task's other cameras are dropped).
    """

    entries: tuple[tuple[tuple[str, str], int], ...]
    dim: int
    cameras: tuple[str, ...] = ()

    def vector(self, obs: dict[str, Any]) -> np.ndarray:
        """The suite's ``state`` (dim,) float32 of one env's ManiSkill observation ``obs``."""
        if not self.entries:
            flat = np.asarray(obs["state"] if isinstance(obs, dict) else obs, np.float32).reshape(-1)
            return np.concatenate([flat, np.zeros(self.dim - flat.size, np.float32)])
        parts = []
        for (group, name), size in self.entries:
            value = obs.get(group, {}).get(name)
            parts.append(np.zeros(size, np.float32) if value is None else np.asarray(value, np.float32).reshape(-1))
        return np.concatenate(parts)


def layout_of(spaces: Sequence[gym.spaces.Space], obs_mode: str) -> SuiteLayout:
    """The suite layout of tasks whose single-env ManiSkill observation spaces are ``spaces`` (in list order)."""
    cameras: tuple[str, ...] = ()
    if obs_mode != "state":
        names = [[c for c, v in space["sensor_data"].spaces.items() if "rgb" in v.spaces] for space in spaces]
        cameras = tuple(c for c in names[0] if all(c in other for other in names[1:]))
        if not cameras:
            raise UserError(f"the tasks share no camera ({'; '.join(', '.join(n) for n in names)}), so one policy cannot see them all.")
    if obs_mode != "rgb":
        dims = [int(np.prod(space.shape if obs_mode == "state" else space["state"].shape)) for space in spaces]
        return SuiteLayout((), max(dims), cameras)
    entries: dict[tuple[str, str], int] = {}
    for space in spaces:
        for group in ("agent", "extra"):
            for name, leaf in sorted(space.spaces.get(group, gym.spaces.Dict()).spaces.items()):
                size = int(np.prod(leaf.shape))
                if entries.setdefault((group, name), size) != size:
                    raise UserError(f"the tasks' {group}/{name} observations differ in size ({entries[(group, name)]} vs {size}); "
                                    "they cannot share one policy input.")
    return SuiteLayout(tuple(entries.items()), sum(entries.values()), cameras)


def suite_layout(tasks: Sequence[str], cfg: EnvConfig) -> SuiteLayout:
    """The suite layout of ``tasks`` under ``cfg``'s observations and kwargs, from one env of each
    task built in this process (once per process and setting)."""
    key = (tuple(tasks), cfg.obs_mode, cfg.image_size, repr(sorted(cfg.kwargs.items(), key=str)))
    if key not in _LAYOUTS:
        spaces = []
        for task in tasks:
            env = _cpu_gym_env(dataclasses.replace(cfg, id=task))
            spaces.append(env.observation_space)
            env.close()
        _LAYOUTS[key] = layout_of(spaces, cfg.obs_mode)
    return _LAYOUTS[key]


_LAYOUTS: dict[tuple[Any, ...], SuiteLayout] = {}


def _explain_make_error(err: Exception, cfg: EnvConfig) -> UserError | None:
    """The UserError for an error of ManiSkill's ``gym.make`` that the user can fix, else None."""
    import mani_skill

    message = str(err)
    if isinstance(err, AssertionError):  # ManiSkill asserts the control mode against the robot's controllers
        found = re.match(r"(.+) not in supported modes: (\[.*\])", message)
        if found is None:
            return None
        mode, modes = found[1], ast.literal_eval(found[2])
        return UserError(
            f"env.kwargs.control_mode={mode!r} is not a control mode of {cfg.id}'s robot.{did_you_mean(mode, modes)} "
            f"Its control modes: {', '.join(modes)}."
        )
    if isinstance(err, TypeError):  # a misspelt env.kwargs key
        return unknown_kwarg(err, cfg.id, cfg.kwargs, maniskill_registry()[cfg.id].cls)
    if isinstance(err, NotImplementedError):  # e.g. SO100GraspCube-v1 has no plain "rgb" mode
        if "obs mode" not in message.lower():
            return None
        return UserError(f"ManiSkill task {cfg.id!r} does not support env.obs_mode={cfg.obs_mode!r} ({err}).")
    if isinstance(err, KeyError):  # ManiSkill's PartNet-Mobility index has no path for a model that is not here
        if not any("partnet_mobility" in frame.filename for frame in traceback.extract_tb(err.__traceback__)):
            return None
        return UserError(
            _asset_help(f"ManiSkill task {cfg.id!r} needs PartNet-Mobility model {err}, which is not here (asset set partnet_mobility_cabinet).")
        )
    if isinstance(err, ImportError):  # a package only some tasks import
        return UserError(f"ManiSkill task {cfg.id!r} needs a package that is not installed: {err}")
    # FileNotFoundError, RuntimeError: datasets some tasks load without declaring them
    # (PartNet-Mobility, ReplicaCAD scenes), or no Vulkan device
    if str(mani_skill.ASSET_DIR) in message or "download_asset" in message:
        return UserError(_asset_help(f"ManiSkill task {cfg.id!r} needs assets that are not here ({err})."))
    if any(sign in message for sign in _NO_VULKAN):
        return UserError(
            f"ManiSkill needs a Vulkan device, even for state observations, and found none ({err}). "
            "Without an NVIDIA GPU run scripts/setup_vulkan.sh: it fetches Mesa's lavapipe (software "
            "Vulkan) into .venv/vulkan, which the envs then use automatically."
        )
    return None


#: One empty SAPIEN render system per render device, kept for the life of the process (see
#: :func:`keep_renderer`).
_KEPT_RENDER_SYSTEMS: dict[str, Any] = {}


def keep_renderer(device: Any) -> None:
    """Keep SAPIEN's renderer on ``device`` alive for the rest of this process.

    SAPIEN shares one renderer among its render systems and tears it down when the last one goes.
    Built again, it regenerates its BRDF lookup table with a compute shader at its first picture,
    seconds of work on a software renderer (lavapipe), for every rgb env built after all earlier
    envs of the process were dropped (an evaluation, a video, the next env of a sweep). An empty
    render system holds it (a few MB); nothing is kept for a device that cannot render.
    """
    import sapien
    import mani_skill.render.utils as render_utils

    if device is None or str(device) in _KEPT_RENDER_SYSTEMS or not render_utils.can_render(device):
        return
    _KEPT_RENDER_SYSTEMS[str(device)] = sapien.render.RenderSystem(device)


def make_raw_maniskill(cfg: EnvConfig, sim_backend: str, num_envs: int) -> gym.Env:
    """ManiSkill's own env of ``cfg.id``, built exactly as the adapter builds it, before any contract wrapper.

    ``gym.make`` with the adapter's kwargs (``cfg.kwargs`` over its defaults: obs mode, renderers,
    image sizes, deterministic resets), ``sim_backend`` (``"physx_cpu"``: one env per process;
    ``"physx_cuda"``: ``num_envs`` in one GPU simulation) and ``cfg.max_episode_steps``. Batched
    torch outputs as ManiSkill gives them; multi-robot tasks get one flat action vector. What a user
    can fix (assets, kwargs, modes, Vulkan) becomes a UserError. Benchmarks use it for the raw
    simulator loop they compare the contract with; :func:`make_cpu_env` and
    :class:`ManiSkillBatchedEnv` wrap it.
    """
    try:
        with _no_download_prompt():
            env = gym.make(cfg.id, max_episode_steps=cfg.max_episode_steps, **_maniskill_kwargs(cfg, sim_backend, num_envs))
    except (AssertionError, TypeError, NotImplementedError, KeyError, ImportError, FileNotFoundError, RuntimeError) as err:
        explained = _explain_make_error(err, cfg)
        if explained is None:
            raise
        raise explained from None
    keep_renderer(env.unwrapped.backend.render_device)
    if isinstance(env.unwrapped.single_action_space, gym.spaces.Dict):
        # multi-robot tasks (TwoRobotPickCube, ...) take one action per robot: one flat vector,
        # the robots' actions concatenated in the order of the space's keys
        from mani_skill.utils.wrappers.flatten import FlattenActionSpaceWrapper

        env = FlattenActionSpaceWrapper(env)
    return env


def _leaves(space_or_obs: Any) -> Iterator[Any]:
    """Leaves of a nested dict (of spaces or arrays), in insertion order."""
    items = space_or_obs.spaces if isinstance(space_or_obs, gym.spaces.Dict) else space_or_obs
    for value in items.values():
        if isinstance(value, (dict, gym.spaces.Dict)):
            yield from _leaves(value)
        else:
            yield value


def flatten_state(obs: dict[str, Any]) -> np.ndarray:
    """Concatenate the leaves of a nested state dict into one (D,) float32 vector."""
    parts = [np.asarray(leaf, np.float32).reshape(-1) for leaf in _leaves(obs)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def camera_keys(cameras: list[str]) -> dict[str, str]:
    """Camera name -> observation key: the first camera is "rgb", the others "rgb/<name>"."""
    return {cam: "rgb" if i == 0 else f"rgb/{cam}" for i, cam in enumerate(cameras)}


def contract_space(space: gym.spaces.Space, obs_mode: str, task: str = "this task") -> tuple[gym.spaces.Dict, dict[str, str]]:
    """The contract's Dict space of one env from ManiSkill's single-env space, and its cameras
    (camera name -> observation key); a UserError when image observations are asked of a task
    without cameras."""
    if obs_mode == "state":
        dim = int(np.prod(space.shape))
    elif obs_mode == "state+rgb":
        dim = int(np.prod(space["state"].shape))
    else:  # rgb: the robot's own (non-privileged) state from ManiSkill's agent + extra
        dim = sum(int(np.prod(leaf.shape)) for key in ("agent", "extra") if key in space.spaces for leaf in _leaves(space[key]))
    spaces: dict[str, gym.Space] = {"state": gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)}
    cameras: dict[str, str] = {}
    if obs_mode != "state":
        sensors = space.spaces.get("sensor_data", gym.spaces.Dict())
        cameras = camera_keys([cam for cam in sensors.spaces if "rgb" in sensors[cam].spaces])
        if not cameras:
            raise UserError(
                f"ManiSkill task {task} has no cameras, so env.obs_mode={obs_mode!r} would have no images; use "
                "env.obs_mode=state (videos still come from the env's render camera)."
            )
        for cam, key in cameras.items():
            h, w = sensors[cam]["rgb"].shape[-3:-1]
            spaces[key] = gym.spaces.Box(0, 255, (h, w, 3), np.uint8)
    return gym.spaces.Dict(spaces), cameras


class ContractObservation(gym.ObservationWrapper):
    """ManiSkill's (unbatched, numpy) observation -> the contract's ``{"state", "rgb", ...}`` dict
    (with ``layout``, the ``state`` of a task list's suite layout)."""

    def __init__(self, env: gym.Env, obs_mode: str, layout: SuiteLayout | None = None) -> None:
        super().__init__(env)
        self.obs_mode = obs_mode
        self.layout = layout
        self.observation_space, self.cameras = contract_space(env.observation_space, obs_mode, repr(env.unwrapped.spec.id))
        if layout is not None:
            self.cameras = camera_keys([c for c in layout.cameras])
            spaces = {k: v for k, v in self.observation_space.spaces.items() if k == "state" or k in self.cameras.values()}
            self.observation_space = gym.spaces.Dict({**spaces, "state": gym.spaces.Box(-np.inf, np.inf, (layout.dim,), np.float32)})

    def observation(self, obs: Any) -> dict[str, np.ndarray]:
        out = {"state": self._state(obs)}
        if self.obs_mode != "state":
            for cam, key in self.cameras.items():
                out[key] = np.ascontiguousarray(obs["sensor_data"][cam]["rgb"][..., :3], dtype=np.uint8)
        return out

    def _state(self, obs: Any) -> np.ndarray:
        if self.layout is not None:
            return self.layout.vector(obs)
        if self.obs_mode == "state":
            return np.asarray(obs, np.float32).reshape(-1)
        if self.obs_mode == "state+rgb":
            return np.asarray(obs["state"], np.float32).reshape(-1)
        return flatten_state({k: obs[k] for k in ("agent", "extra") if k in obs})


# --- the adapter -------------------------------------------------------------------------------------


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@register_adapter("maniskill", _claims, priority=_PRIORITY, doc="ManiSkill3 tasks (CPU processes or GPU-batched sim).")
def make_maniskill(cfg: EnvConfig, seed: int) -> VecEnv:
    """ManiSkill3 tasks: CPU envs in worker processes, or the GPU-batched simulator with CUDA."""
    if not _installed():
        raise UserError("ManiSkill is not installed: pip install 'embodied[maniskill]' (mani_skill==3.0.1, sapien==3.0.3).")
    if cfg.obs_mode not in OBS_MODES:
        raise UserError(f"env.obs_mode={cfg.obs_mode!r} is not one of {', '.join(OBS_MODES)} for ManiSkill.{did_you_mean(cfg.obs_mode, OBS_MODES)}")
    tasks = parse_tasks(cfg.id)
    for task in tasks:
        check_task(task)
    if len(tasks) > 1:
        return _make_task_list(cfg, tasks)
    cuda = _cuda_available()
    backend = resolve_backend(cfg, auto="batched" if cuda else "multiprocess", allowed=BACKENDS)
    if backend == "batched" or (backend == "inprocess" and cuda):
        return BatchedVecEnv(ManiSkillBatchedEnv(cfg, "physx_cuda" if cuda else "physx_cpu"), nonfinite=cfg.nonfinite,
                             env_id=cfg.id)  # instructions: its own
    fn = functools.partial(make_cpu_env, cfg)
    return vectorize([fn] * cfg.num_envs, cfg, backend, [instruction_for(cfg.id)] * cfg.num_envs, preload=PRELOAD)


def _make_task_list(cfg: EnvConfig, tasks: list[str]) -> VecEnv:
    """Several tasks in one batch of CPU envs (module docstring, "Several tasks")."""
    from envs.adapters.libero_adapter import task_index

    backend = resolve_backend(cfg, auto="multiprocess", allowed=BACKENDS)
    if backend == "batched":
        raise UserError(f"env.id={cfg.id!r} lists {len(tasks)} tasks; ManiSkill's GPU simulation runs one task per batch, "
                        "so a task list runs on env.backend=multiprocess (or inprocess).")
    kwargs = dict(cfg.kwargs)
    every, only = kwargs.pop("task_every", 1), kwargs.pop("task", None)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UserError(f"env.kwargs.task_every={every!r} must be a positive integer (envs in a row on one task).")
    if only is not None and only not in tasks:
        raise UserError(f"env.kwargs.task={only!r} is not one of env.id's tasks ({', '.join(tasks)}).{did_you_mean(str(only), tasks)}")
    env_tasks = [only or tasks[task_index(i, len(tasks), every)] for i in range(cfg.num_envs)]
    base = dataclasses.replace(cfg, kwargs=kwargs)
    fns = [functools.partial(make_cpu_env, dataclasses.replace(base, id=task), tuple(tasks)) for task in env_tasks]
    return vectorize(fns, cfg, backend, [instruction_for(task) for task in env_tasks], preload=PRELOAD)


# --- GPU-batched backend -------------------------------------------------------------------------------


class ManiSkillBatchedEnv:
    """All ``num_envs`` envs in one ManiSkill simulation, as a batched env of the protocol in
    :mod:`envs.adapters.batched_adapter` (``is_vector_env``): :class:`BatchedVecEnv` turns it into
    the contract, exactly as it does a user's Isaac-style env (episode stats, final observations,
    a ``chunk_step`` that stays in torch), with torch tensors on ``device``.

    Auto-reset comes from ManiSkill's ``ManiSkillVectorEnv`` (a partial reset of the finished
    envs); after one, the step's own info is ManiSkill's ``final_info``, so ``success`` is read from
    there. ``sim_backend="physx_cuda"`` is the GPU simulation; ``"physx_cpu"`` runs the same code
    on ManiSkill's CPU simulation, which holds one env per process (how the tests check this path
    on machines without CUDA).
    """

    is_vector_env = True

    def __init__(self, cfg: EnvConfig, sim_backend: str = "physx_cuda") -> None:
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

        if sim_backend == "physx_cpu" and cfg.num_envs != 1:
            raise UserError(
                f"ManiSkill's CPU simulation holds one env per process, got num_envs={cfg.num_envs}; "
                "use env.backend=multiprocess for several CPU envs (or a CUDA GPU for the batched simulation)."
            )
        self.num_envs = cfg.num_envs
        env = make_raw_maniskill(cfg, sim_backend, cfg.num_envs)
        self.env = ManiSkillVectorEnv(
            env, cfg.num_envs, auto_reset=True, ignore_terminations=cfg.ignore_terminations, record_metrics=False
        )
        self.device = str(self.env.device)
        self.obs_mode = cfg.obs_mode
        self.single_observation_space, self.cameras = contract_space(self.env.single_observation_space, cfg.obs_mode, repr(cfg.id))
        self.single_action_space = self.env.single_action_space
        self.instructions = [instruction_for(cfg.id)] * cfg.num_envs

    def observation(self, obs: Any) -> dict[str, Any]:
        """ManiSkill's batched observation -> the contract's ``{"state", "rgb", ...}`` dict of tensors."""
        from mani_skill.utils import common

        if self.obs_mode == "state":
            return {"state": obs.float()}
        if self.obs_mode == "state+rgb":
            out = {"state": obs["state"].float()}
        else:
            parts = {k: obs[k] for k in ("agent", "extra") if k in obs}
            out = {"state": common.flatten_state_dict(parts, use_torch=True, device=self.device).float()}
        for cam, key in self.cameras.items():
            out[key] = obs["sensor_data"][cam]["rgb"][..., :3]
        return out

    def reset(self, seed: int | Sequence[int] | None = None) -> dict[str, Any]:
        """Reset every env; env i is seeded with ``seed + i`` (or ``seed[i]`` for a list)."""
        obs, _ = self.env.reset(seed=None if seed is None else env_seeds(seed, self.num_envs))
        return self.observation(obs)

    def step(self, actions: Any) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        out: dict[str, Any] = {}
        step_info = info.get("final_info", info)  # after an auto-reset, info is the reset's
        if "success" in step_info:
            out["success"] = step_info["success"]
        if "final_observation" in info:
            out["final_obs"] = self.observation(info["final_observation"])
        return self.observation(obs), reward, terminated, truncated, out

    def render(self) -> Any:
        frames = self.env.render()
        return None if frames is None else frames[..., :3]

    def close(self) -> None:
        self.env.close()
