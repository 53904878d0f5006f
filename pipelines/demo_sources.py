"""Where ``embodied demos`` gets its experts: a registry of sources, one per family of tasks.

    source = source_for("metaworld_mt10")        # the first registered source that claims the id
    recorded = source.record(cfg, h5_path, log)  # h5_path and its .json, in ManiSkill's trajectory layout

A source is anything with the :class:`DemoSource` protocol (``name``, ``examples``,
``claims(env_id)``, ``file_name(cfg)``, ``record(cfg, h5_path, log) -> Recorded``); the order of
:func:`register_source` calls is the order they are asked. Two kinds exist:

* :class:`ManiSkillSource`: ManiSkill's own ``RecordEpisode`` wrapper records the batched ManiSkill
  env while an expert of :mod:`envs.experts.maniskill` acts on privileged state;
* :class:`EpisodicSource`: a family whose episodes run in one gymnasium env of the project's
  contract, with an expert module of :mod:`envs.experts` that defines (:class:`ExpertModule`)::

      tasks_of(env_id) -> list[ExpertTask]            # the tasks an id selects, with instructions
      make_env(task, obs_mode, image_size, max_episode_steps) -> gym.Env
                                                      # reset(seed=) -> (obs, info); step -> info["success"]
      make_expert(task) -> Expert                     # .reset(env) per episode; (env, obs) -> action (A,)
      recorded_keys(obs_mode) -> tuple[str, ...]      # the observation keys the file keeps
      CAMERA: str                                     # the camera of the ``rgb`` key
      DEFAULT_MAX_EPISODE_STEPS: int

  It runs each task's episodes one after another (attempt i resets with seed ``cfg.seed + i``),
  keeps the ones that reach the env's own success, and writes them with
  :class:`pipelines.trajectory_h5.TrajectoryWriter`. Meta-World (``envs.experts.metaworld``) and
  LIBERO-Spatial/-Object (``envs.experts.libero``) are two; another family plugs in with its
  module and one :func:`register_source` line at the end of this file.

A suite id (``metaworld_mt10``) records ``cfg.episodes`` episodes of every task into one file whose
``env_info.env_id`` is the suite's, each episode naming its task (``env_id``) and instruction:
the file is then the demonstrations of exactly the env a multi-task recipe (``env.id=metaworld_mt10``)
trains, and ``embodied sft`` checks it as it checks a single task's.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from embodied.errors import UserError, did_you_mean

if TYPE_CHECKING:
    import gymnasium as gym

    from envs.experts import Expert, ExpertTask
    from pipelines.demos import DemoConfig

#: ``source_type`` of the files (ManiSkill's own datasets say "human", "motionplanning" or "rl").
SOURCE_TYPE = "scripted"
#: The key of the project's additions in the JSON file.
META_KEY = "embodied"

Log = Callable[[str], None]


@dataclass
class TaskCount:
    """How one task's expert did: episodes kept (successful) of those attempted."""

    kept: int
    attempted: int

    @property
    def success_rate(self) -> float:
        return self.kept / max(self.attempted, 1)


@dataclass
class Recorded:
    """What a source wrote: the kept episodes' seeds (in file order) and each task's counts."""

    seeds: list[int]
    tasks: dict[str, TaskCount] = field(default_factory=dict)

    @property
    def kept(self) -> int:
        return sum(c.kept for c in self.tasks.values())

    @property
    def attempted(self) -> int:
        return sum(c.attempted for c in self.tasks.values())


class DemoSource(Protocol):
    """A family of tasks ``embodied demos`` records (see the module docstring)."""

    name: str
    examples: tuple[str, ...]
    """Ids it records, for the message that names them when no source claims an id."""

    def claims(self, env_id: str) -> bool: ...

    def file_name(self, cfg: DemoConfig) -> str:
        """The default file's name under ``demos/<env_id>/scripted/``."""
        ...

    def record(self, cfg: DemoConfig, h5_path: Path, log: Log) -> Recorded:
        """Write ``cfg.episodes`` successful episodes per task to ``h5_path`` and its ``.json``;
        a UserError when a task's expert falls short within ``cfg.max_attempts``."""
        ...


SOURCES: list[DemoSource] = []


def register_source(source: DemoSource) -> DemoSource:
    SOURCES.append(source)
    return source


def source_for(env_id: str) -> DemoSource:
    """The first registered source that claims ``env_id``; a UserError names the ids there are."""
    for source in SOURCES:
        if source.claims(env_id):
            return source
    known = [e for s in SOURCES for e in s.examples]
    raise UserError(f"no scripted expert for {env_id!r}.{did_you_mean(env_id, known)} Tasks with one: {', '.join(known)}.")


def max_attempts(cfg: DemoConfig) -> int:
    """Episodes tried at most per task (default ``2 * episodes + 10``)."""
    return cfg.max_attempts or 2 * cfg.episodes + 10


def check_kept(task: str, count: TaskCount, cfg: DemoConfig) -> None:
    """A UserError when ``task``'s expert kept fewer than ``cfg.episodes`` episodes."""
    if count.kept < cfg.episodes:
        raise UserError(f"the {task} expert succeeded in {count.kept} of {count.attempted} episodes (seeds {cfg.seed}.."
                        f"{cfg.seed + count.attempted - 1}), fewer than episodes={cfg.episodes}; raise max_attempts or max_episode_steps.")


def progress(task: str, count: TaskCount, cfg: DemoConfig, started: float, tried: int | None = None, left_after: int = 0) -> str:
    """One progress line: the task's kept and tried episodes, its expert's success rate, the speed
    (``tried``: episodes of every task since ``started``, default this task's) and the time left
    (``left_after``: successful episodes still to come after this task's)."""
    per_s = (tried or count.attempted) / max(time.perf_counter() - started, 1e-9)
    left = (cfg.episodes - count.kept + left_after) / max(count.success_rate, 1e-6) / per_s
    return (f"[demos] {task}: {count.kept}/{cfg.episodes} kept of {count.attempted} tried (expert success {count.success_rate:.0%}), "
            f"{per_s:.2f} episodes/s, ~{left:.0f} s left")


def embodied_entry(cfg: DemoConfig, expert: str, recorded: Recorded, action_low: Any, action_high: Any) -> dict[str, Any]:
    """The JSON's ``embodied`` entry: how the file was made (expert, counts, spaces)."""
    return {
        "expert": expert, "attempted": recorded.attempted, "succeeded": recorded.kept,
        "success_rate": recorded.kept / max(recorded.attempted, 1), "first_seed": cfg.seed, "obs_mode": cfg.obs_mode,
        "image_size": cfg.image_size if cfg.obs_mode != "state" else None,
        "action_low": np.asarray(action_low, np.float64).tolist(), "action_high": np.asarray(action_high, np.float64).tolist(),
        "tasks": {task: {"attempted": c.attempted, "succeeded": c.kept, "success_rate": c.success_rate}
                  for task, c in recorded.tasks.items()},
    }


# --- ManiSkill ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManiSkillSource:
    """ManiSkill tasks with an expert in :mod:`envs.experts.maniskill`, recorded by ManiSkill's own
    ``RecordEpisode`` (so ``env_states`` and ManiSkill's ``env_kwargs`` are in the files)."""

    name: str = "maniskill"
    examples: tuple[str, ...] = ("PushCube-v1", "PickCube-v1", "StackCube-v1")
    max_episode_steps: int = 100

    def claims(self, env_id: str) -> bool:
        from envs.experts.maniskill import EXPERTS

        return env_id in EXPERTS

    def control_mode(self, cfg: DemoConfig) -> str:
        from envs.experts.maniskill import CONTROL_MODE, CONTROL_MODES

        mode = cfg.control_mode or CONTROL_MODE
        if mode not in CONTROL_MODES:
            raise UserError(f"control_mode={mode!r} must be one of {', '.join(CONTROL_MODES)} (what the scripted experts command).")
        return mode

    def file_name(self, cfg: DemoConfig) -> str:
        return f"trajectory.{cfg.obs_mode.replace('+', '_')}.{self.control_mode(cfg)}.physx_cpu.h5"

    def record(self, cfg: DemoConfig, h5_path: Path, log: Log) -> Recorded:
        from mani_skill.utils.wrappers.record import RecordEpisode

        from envs.adapters.maniskill_adapter import OBS_MODES, check_task, instruction_for, make_raw_maniskill
        from envs.config import EnvConfig
        from envs.experts.maniskill import expert_for

        if cfg.obs_mode not in OBS_MODES:
            raise UserError(f"obs_mode={cfg.obs_mode!r} must be one of {', '.join(OBS_MODES)}.")
        control_mode = self.control_mode(cfg)
        expert = expert_for(cfg.env_id)
        max_steps = cfg.max_episode_steps or self.max_episode_steps
        check_task(cfg.env_id)
        env_cfg = EnvConfig(id=cfg.env_id, obs_mode=cfg.obs_mode, image_size=cfg.image_size,
                            max_episode_steps=max_steps, kwargs={"control_mode": control_mode})
        raw = make_raw_maniskill(env_cfg, "physx_cpu", 1)
        started = time.perf_counter()
        env = RecordEpisode(
            raw, str(h5_path.parent), trajectory_name=h5_path.stem, save_video=False, save_on_reset=False, record_reward=True,
            source_type=SOURCE_TYPE, source_desc=f"envs.experts.maniskill scripted expert of {cfg.env_id} on privileged state "
                                                 f"through {control_mode}; successful episodes only",
        )
        count, seeds = TaskCount(0, 0), []
        try:
            while count.kept < cfg.episodes and count.attempted < max_attempts(cfg):
                seed = cfg.seed + count.attempted
                ok = _run_maniskill_episode(env, expert, seed, max_steps, control_mode)
                count.attempted += 1
                env.flush_trajectory(save=ok)
                if ok:
                    count.kept += 1
                    seeds.append(seed)
                log(progress(cfg.env_id, count, cfg, started))
        finally:
            env.close()  # writes the JSON (ids are consecutive: only kept episodes were saved)
        check_kept(cfg.env_id, count, cfg)
        recorded = Recorded(seeds, {cfg.env_id: count})
        space = raw.unwrapped.single_action_space
        _annotate(h5_path.with_suffix(".json"), instruction_for(cfg.env_id),
                  embodied_entry(cfg, f"envs.experts.maniskill:{cfg.env_id}", recorded, space.low, space.high))
        return recorded


def _run_maniskill_episode(env: Any, expert: Any, seed: int, max_steps: int, control_mode: str) -> bool:
    """One episode from ``reset(seed)`` until the env's success or ``max_steps``: whether it succeeded."""
    import torch

    from envs.experts.maniskill import for_control_mode

    env.reset(seed=seed)
    expert.reset()
    for _ in range(max_steps):
        action = torch.as_tensor(for_control_mode(expert(env), control_mode))[None]  # (1, A): the batched raw env
        _, _, terminated, truncated, info = env.step(action)
        if bool(info["success"][0]):
            return True
        if bool(terminated[0]) or bool(truncated[0]):
            return False
    return False


def _annotate(json_path: Path, instruction: str, entry: dict[str, Any]) -> None:
    """Add the instruction (``env_info`` and each episode) and the project's entry to ManiSkill's JSON."""
    from mani_skill.utils.io_utils import dump_json, load_json

    data = load_json(json_path)
    data["env_info"]["instruction"] = instruction
    for episode in data["episodes"]:
        episode["instruction"] = instruction
    data[META_KEY] = entry
    dump_json(json_path, data, indent=2)


# --- one gymnasium env per task (Meta-World, LIBERO) ------------------------------------------------------


class ExpertModule(Protocol):
    """What the expert module of an :class:`EpisodicSource` defines (module docstring)."""

    CAMERA: str
    DEFAULT_MAX_EPISODE_STEPS: int

    def tasks_of(self, env_id: str) -> list[ExpertTask]: ...

    def make_env(self, task: ExpertTask, obs_mode: str, image_size: int, max_episode_steps: int) -> gym.Env: ...

    def make_expert(self, task: ExpertTask) -> Expert: ...

    def recorded_keys(self, obs_mode: str) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class EpisodicSource:
    """Tasks whose expert module (``module``, imported when recording) gives one env and one
    expert per task; episodes are written by :class:`pipelines.trajectory_h5.TrajectoryWriter`."""

    name: str
    claims: Callable[[str], bool]
    module: str
    """The expert module (:class:`ExpertModule`), e.g. ``envs.experts.metaworld``."""
    expert_desc: str
    """What the expert is, for the files' ``source_desc`` and ``embodied.expert``."""
    examples: tuple[str, ...] = ()
    sim: str = "mujoco"
    """The last part of the default file name (ManiSkill's names end in the sim backend)."""

    def file_name(self, cfg: DemoConfig) -> str:
        return f"trajectory.{cfg.obs_mode.replace('+', '_')}.{self.sim}.h5"

    def record(self, cfg: DemoConfig, h5_path: Path, log: Log) -> Recorded:
        from pipelines.trajectory_h5 import TrajectoryWriter

        experts: ExpertModule = importlib.import_module(self.module)  # type: ignore[assignment]
        if cfg.control_mode is not None:
            raise UserError(f"control_mode={cfg.control_mode!r}: {self.name} tasks have one controller; leave control_mode out.")
        if cfg.obs_mode not in ("state", "rgb", "state+rgb"):
            raise UserError(f"obs_mode={cfg.obs_mode!r} must be one of state, rgb, state+rgb.")
        tasks = experts.tasks_of(cfg.env_id)
        max_steps = cfg.max_episode_steps or experts.DEFAULT_MAX_EPISODE_STEPS
        keys = experts.recorded_keys(cfg.obs_mode)
        writer = TrajectoryWriter(h5_path, experts.CAMERA)
        recorded = Recorded([])
        started = time.perf_counter()
        try:
            for i, task in enumerate(tasks):
                env = experts.make_env(task, cfg.obs_mode, cfg.image_size, max_steps)
                expert = experts.make_expert(task)
                space = env.action_space
                count = recorded.tasks.setdefault(task.env_id, TaskCount(0, 0))
                try:
                    while count.kept < cfg.episodes and count.attempted < max_attempts(cfg):
                        seed = cfg.seed + count.attempted
                        episode = run_episode(env, expert, seed, max_steps, keys)
                        count.attempted += 1
                        if episode is not None:
                            arrays, reset_info = episode
                            count.kept += 1
                            recorded.seeds.append(seed)
                            fields = {"episode_seed": seed, "reset_kwargs": {"seed": seed}, "success": True, "env_id": task.env_id,
                                      "instruction": task.instruction, **episode_fields(reset_info)}
                            writer.add(**arrays, episode=fields)
                        log(progress(task.env_id, count, cfg, started, recorded.attempted, cfg.episodes * (len(tasks) - i - 1)))
                finally:
                    env.close()
                check_kept(task.env_id, count, cfg)
        finally:
            writer.close()
        env_info: dict[str, Any] = {
            "env_id": cfg.env_id, "max_episode_steps": max_steps,
            "env_kwargs": {"obs_mode": cfg.obs_mode, "image_size": cfg.image_size, "camera": experts.CAMERA, "max_episode_steps": max_steps},
        }
        if len(tasks) == 1:
            env_info["instruction"] = tasks[0].instruction
        else:  # a suite: each episode names its task and instruction
            env_info["instructions"] = {t.env_id: t.instruction for t in tasks}
        writer.write_json({
            "env_info": env_info, "source_type": SOURCE_TYPE,
            "source_desc": f"{self.expert_desc}; successful episodes only",
            META_KEY: embodied_entry(cfg, self.expert_desc, recorded, space.low, space.high),
        })
        return recorded


def run_episode(env: gym.Env, expert: Expert, seed: int, max_steps: int,
                keys: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One episode from ``env.reset(seed=seed)``: at the env's success, the arrays
    :meth:`TrajectoryWriter.add` takes (frames of ``keys``) and the reset's info; None at an end
    without success or after ``max_steps``."""
    obs, info = env.reset(seed=seed)
    expert.reset(env)
    frames = [{k: obs[k] for k in keys}]
    actions, rewards, terminated, truncated, success = [], [], [], [], []
    for _ in range(max_steps):
        action = np.asarray(expert(env, obs), np.float32)
        obs, reward, term, trunc, step_info = env.step(action)
        frames.append({k: obs[k] for k in keys})
        actions.append(action)
        rewards.append(reward)
        ok = bool(step_info["success"])
        terminated.append(bool(term))
        truncated.append(bool(trunc))
        success.append(ok)
        if ok:
            return {"frames": frames, "actions": np.stack(actions), "rewards": np.asarray(rewards), "terminated": np.asarray(terminated),
                    "truncated": np.asarray(truncated), "success": np.asarray(success)}, info
        if term or trunc:
            return None
    return None


def episode_fields(reset_info: dict[str, Any]) -> dict[str, Any]:
    """The reset's info entries that are plain JSON values (Meta-World's ``layout``, ...)."""
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in reset_info.items()
            if isinstance(v, (int, float, str, bool, np.generic))}


register_source(EpisodicSource(
    "metaworld", claims=lambda env_id: env_id.partition("/")[0].startswith("metaworld"), module="envs.experts.metaworld",
    expert_desc="metaworld.policies scripted policy of each task on the adapter's state (envs.experts.metaworld)",
    examples=("metaworld/<task>", "metaworld_mt10", "metaworld_mt50"),
))
register_source(EpisodicSource(
    "libero", claims=lambda env_id: env_id.partition("/")[0].startswith("libero"), module="envs.experts.libero",
    expert_desc="envs.experts.libero scripted pick-and-place expert of each task's BDDL goal on privileged object poses "
                "through OSC_POSE, from LIBERO's official initial states",
    examples=("libero_spatial", "libero_object", "libero_spatial/<k>", "libero_object/<k>"),
))
register_source(ManiSkillSource())
