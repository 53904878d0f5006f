"""Demonstrations made here: a scripted expert's successful episodes, in ManiSkill's trajectory format.

    summary = record_demos(DemoConfig("PickCube-v1", episodes=100, obs_mode="rgb", image_size=32))
    summary = record_demos(DemoConfig("metaworld_mt10", episodes=50, obs_mode="rgb", image_size=64))
    demos = load_demos([summary.path], chunk=8)          # -> pipelines.demonstrations.Demonstrations

Writing: the id's source in :mod:`pipelines.demo_sources` (ManiSkill's scripted experts through
ManiSkill's own ``RecordEpisode``; Meta-World's ``metaworld.policies`` through the project's
Meta-World adapter; LIBERO's experts the same way) runs the expert, ends every episode at the env's
own ``success`` or at ``max_episode_steps``, and writes only successful ones, to a temporary file
renamed to ``out`` once every task has its ``episodes``. The files are ManiSkill's trajectory
format (read by ``ManiSkillTrajectoryDataset``, ``replay_trajectory`` for ManiSkill's, the LeRobot
converter, ...):

* ``<out>.h5``: ``traj_<i>`` groups with ``obs`` (T+1 frames; for ManiSkill's ``obs_mode=rgb``
  ``agent``/``extra``/``sensor_data``/``<camera>``/``rgb`` uint8, for others ``state`` and
  ``sensor_data/<camera>/rgb``; one (T+1, D) array for ``state``), ``actions`` (T, A) float32
  (A = 4 for pd_ee_delta_pos and Meta-World, 7 for pd_ee_delta_pose), ``terminated``,
  ``truncated``, ``success`` (T,) bool, ``rewards`` (T,); ``env_states`` (T+1 states) for ManiSkill;
* ``<out>.json``: ``env_info`` (``env_id``, ``env_kwargs``: obs mode, control mode, camera size,
  ..., ``max_episode_steps``) and ``episodes`` (``episode_id``, ``episode_seed``,
  ``reset_kwargs`` with the ``seed``, ``control_mode``, ``elapsed_steps``, ``success``), with
  ``source_type`` "scripted" and ``source_desc``. Added, for language-conditioned policies: the
  task's ``instruction`` in ``env_info`` (a suite's file: ``instructions`` per task) and in every
  episode (with the episode's task ``env_id`` in a suite's file), and an ``embodied`` entry (the
  expert, its attempts and successes overall and per task, the action bounds, the image size).

Reading (:func:`load_demos`): the episodes as the project's env contract shows them to a policy
(``rgb`` the first camera, ``rgb/<camera>`` the others, ``state`` as
:class:`envs.adapters.maniskill_adapter.ContractObservation` flattens it, the episode's
instruction under ``policies.base.INSTRUCTION_KEY``), the final frame of each episode left out (no
action follows it), actions chunked for the policy. Reading needs h5py, not ManiSkill.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.errors import UserError
from pipelines.demo_sources import META_KEY, SOURCE_TYPE, TaskCount, source_for
from policies.base import INSTRUCTION_KEY


@dataclass
class DemoConfig:
    """What ``embodied demos ENV_ID [key=value ...]`` records."""

    env_id: str
    """A task or suite with a scripted expert (:mod:`pipelines.demo_sources`): ``PickCube-v1``,
    ``metaworld/<task>``, ``metaworld_mt10``, ``metaworld_mt50``."""
    episodes: int = 100
    """Successful episodes to keep (per task of a suite)."""
    out: str | None = None
    """The ``.h5`` file (its ``.json`` beside it). Default: ``demos/<env_id>/scripted/`` and
    ManiSkill's naming, ``trajectory.<obs_mode>.pd_ee_delta_pos.physx_cpu.h5`` (Meta-World:
    ``trajectory.<obs_mode>.mujoco.h5``)."""
    obs_mode: str = "rgb"
    """``rgb`` (camera frames, and for ManiSkill the robot's own state), ``state`` (privileged state) or ``state+rgb``."""
    image_size: int = 128
    """Camera frames' height and width in pixels; the size the policy's env gives (``env.image_size``)."""
    seed: int = 0
    """Attempt i (of each task) resets with seed ``seed + i``."""
    max_episode_steps: int | None = None
    """An episode that has not succeeded by then is dropped (and counted). Default: the source's
    (ManiSkill 100, Meta-World 500)."""
    max_attempts: int | None = None
    """Episodes to try at most per task (default ``2 * episodes + 10``); fewer kept is a UserError."""
    control_mode: str | None = None
    """ManiSkill's controller: ``pd_ee_delta_pos`` (4 dimensions, the default) or ``pd_ee_delta_pose``
    (7, as OpenVLA checkpoints' actions; the expert's rotation stays zero). Meta-World has one."""
    overwrite: bool = False
    """Replace an existing ``out`` (otherwise an existing file is an error)."""


@dataclass
class DemoSummary:
    """Where the demonstrations went and how the expert did (overall and per task)."""

    path: Path
    kept: int
    attempted: int
    seeds: list[int]
    wall_s: float
    tasks: dict[str, TaskCount] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        return self.kept / max(self.attempted, 1)


def default_out(cfg: DemoConfig) -> Path:
    return Path("demos") / cfg.env_id / SOURCE_TYPE / source_for(cfg.env_id).file_name(cfg)


def record_demos(cfg: DemoConfig, log: Callable[[str], None] = print) -> DemoSummary:
    """Run the id's scripted expert until ``cfg.episodes`` successful episodes of each task are
    written to ``cfg.out`` (see the module docstring); a progress line after every episode."""
    if cfg.episodes < 1:
        raise UserError(f"episodes={cfg.episodes} must be at least 1.")
    source = source_for(cfg.env_id)
    out = Path(cfg.out) if cfg.out else default_out(cfg)
    if out.suffix != ".h5":
        raise UserError(f"out={str(out)!r} must name an .h5 file (its .json goes beside it), as ManiSkill's trajectories are.")
    if not cfg.overwrite and (out.exists() or out.with_suffix(".json").exists()):
        raise UserError(f"{out} already exists; give another out=PATH or overwrite=true.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.stem}-{os.getpid()}.h5"
    t0 = time.perf_counter()
    try:
        recorded = source.record(cfg, tmp, log)
    except BaseException:
        for f in (tmp, tmp.with_suffix(".json")):
            f.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    tmp.with_suffix(".json").replace(out.with_suffix(".json"))
    wall_s = time.perf_counter() - t0
    seeds = f"seeds {cfg.seed}..{cfg.seed + max(c.attempted for c in recorded.tasks.values()) - 1}"
    log(f"[demos] wrote {recorded.kept} episodes of {cfg.env_id} to {out} (+ .json); expert success {recorded.kept}/{recorded.attempted} "
        f"= {recorded.kept / recorded.attempted:.0%} on {seeds}{' per task' if len(recorded.tasks) > 1 else ''}, {wall_s:.0f} s")
    return DemoSummary(out, recorded.kept, recorded.attempted, recorded.seeds, wall_s, recorded.tasks)


# --- reading --------------------------------------------------------------------------------------------


@dataclass
class DemoFile:
    """One demonstration file's metadata (the JSON)."""

    path: Path
    env_id: str
    control_mode: str | None
    obs_mode: str
    instruction: str | None
    """The file's one instruction; None for a suite's file, whose episodes name theirs."""
    episodes: list[dict[str, Any]]
    action_low: np.ndarray
    action_high: np.ndarray
    image_size: int | None


def read_meta(path: str | Path) -> DemoFile:
    """The metadata of a demonstration file (``.h5``; its ``.json`` beside it)."""
    path = Path(path)
    json_path = path.with_suffix(".json")
    if path.suffix != ".h5" or not path.is_file() or not json_path.is_file():
        raise UserError(f"demos={str(path)!r}: expected a ManiSkill trajectory .h5 file with its .json beside it "
                        "(`embodied demos ENV_ID` writes them).")
    data = json.loads(json_path.read_text())
    info = data.get("env_info") or {}
    kwargs = info.get("env_kwargs") or {}
    meta = data.get(META_KEY) or {}
    episodes = data.get("episodes") or []
    if not episodes:
        raise UserError(f"demos={str(path)!r} holds no episodes.")
    if "action_low" not in meta:
        raise UserError(f"demos={str(path)!r} was not written by `embodied demos` (its JSON has no '{META_KEY}' entry with the action bounds).")
    instruction = info.get("instruction")
    if instruction is None and not all("instruction" in e for e in episodes):
        from envs.adapters.maniskill_adapter import instruction_for

        instruction = instruction_for(info["env_id"])
    obs_mode = meta.get("obs_mode") or kwargs.get("obs_mode", "state")
    return DemoFile(path, info["env_id"], kwargs.get("control_mode"), obs_mode, instruction, episodes,
                    np.asarray(meta["action_low"], np.float32), np.asarray(meta["action_high"], np.float32), meta.get("image_size"))


def episode_observations(obs: Any, obs_mode: str) -> dict[str, np.ndarray]:
    """One trajectory's ``obs`` (as the file stores it, loaded to numpy) -> the contract's
    ``{"state", "rgb", "rgb/<camera>"}`` arrays of its T+1 frames (``rgb`` frames without
    ``agent``/``extra`` state, as Meta-World's, give no ``state``)."""
    from envs.adapters.maniskill_adapter import camera_keys, flatten_state

    if obs_mode == "state":
        return {"state": np.asarray(obs, np.float32).reshape(len(obs), -1)}
    out: dict[str, np.ndarray] = {}
    if "state" in obs:
        out["state"] = np.asarray(obs["state"], np.float32).reshape(len(obs["state"]), -1)
    elif obs_mode == "rgb" and ("agent" in obs or "extra" in obs):
        parts = {k: obs[k] for k in ("agent", "extra") if k in obs}
        frames = len(next(iter(obs["sensor_data"].values()))["rgb"])
        out["state"] = np.stack([flatten_state(_frame(parts, t)) for t in range(frames)])
    sensors = obs.get("sensor_data", {})
    cameras = camera_keys([cam for cam in sensors if "rgb" in sensors[cam]])
    for cam, key in cameras.items():
        out[key] = np.ascontiguousarray(sensors[cam]["rgb"][..., :3], dtype=np.uint8)
    return out


def read_group(group: Any) -> Any:
    """An h5py dataset as numpy, a group as a dict of them (what ManiSkill's ``load_h5_data`` gives)."""
    import h5py

    if isinstance(group, h5py.Dataset):
        return group[()]
    return {k: read_group(group[k]) for k in group.keys()}


def _frame(tree: dict[str, Any], t: int) -> dict[str, Any]:
    return {k: _frame(v, t) if isinstance(v, dict) else v[t] for k, v in tree.items()}


def load_demos(paths: Sequence[str | Path], chunk: int = 1, limit: int | None = None, layout: Any = None):
    """Every episode of ``paths`` (files of one or several tasks) as a
    :class:`pipelines.demonstrations.Demonstrations` of frames: observations in the contract's
    keys plus the instruction, actions (N, C, A) chunked (``chunks_of``), ``episode`` numbering
    the episodes across files. ``limit``: at most that many episodes per task of each file (a
    suite's file holds every task's, in task order). ``layout``: a ManiSkill task list's
    :class:`~envs.adapters.maniskill_adapter.SuiteLayout` (:func:`task_list_layout`), so that every
    task's frames show the ``state`` and cameras the list's envs show."""
    import h5py

    from pipelines.demonstrations import Demonstrations, chunks_of

    obs_parts: list[dict[str, np.ndarray]] = []
    actions: list[np.ndarray] = []
    episode_ids: list[np.ndarray] = []
    attempted = 0
    for path in paths:
        meta = read_meta(path)
        attempted += len(meta.episodes)
        per_task: dict[str, int] = {}
        with h5py.File(meta.path, "r") as h5:
            for entry in meta.episodes:
                task = entry.get("env_id", meta.env_id)
                per_task[task] = per_task.get(task, 0) + 1
                if limit is not None and per_task[task] > limit:
                    continue
                traj = read_group(h5[f"traj_{entry['episode_id']}"])
                steps = len(traj["actions"])
                obs = episode_observations(traj["obs"], meta.obs_mode)
                if layout is not None:
                    obs = _in_layout(obs, traj["obs"], layout, meta.obs_mode)
                obs = {k: v[:steps] for k, v in obs.items()}  # the final frame has no action
                obs[INSTRUCTION_KEY] = np.full(steps, entry.get("instruction", meta.instruction), dtype=object).astype(str)
                obs_parts.append(obs)
                actions.append(chunks_of(np.asarray(traj["actions"], np.float32), chunk))
                episode_ids.append(np.full(steps, len(episode_ids)))
    keys = set(obs_parts[0])
    for path, obs in zip(paths, obs_parts):
        if set(obs) != keys:
            raise UserError(f"the demo files give different observations ({sorted(keys)} vs {sorted(obs)} in {path}); "
                            "record them all with the same obs_mode.")
    return Demonstrations(
        obs={k: _concat([o[k] for o in obs_parts], k) for k in obs_parts[0]},
        actions=np.concatenate(actions), episode=np.concatenate(episode_ids), attempted=attempted, succeeded=attempted,
    )


def task_list_layout(tasks: Sequence[str], paths: Sequence[str | Path]) -> Any:
    """The :class:`~envs.adapters.maniskill_adapter.SuiteLayout` of the ManiSkill task list
    ``tasks`` (in its order), read from the first episode of each task's demo file in ``paths``;
    a UserError when a task of the list has no file (its entries would be missing)."""
    import gymnasium as gym
    import h5py

    from envs.adapters.maniskill_adapter import layout_of

    metas = {meta.env_id: meta for meta in map(read_meta, paths)}
    missing = [t for t in tasks if t not in metas]
    if missing:
        raise UserError(f"env.id lists {', '.join(tasks)}, the demos hold no episode of {', '.join(missing)}; "
                        f"record them (`embodied demos {missing[0]} ...`) and give every task's file.")

    def space(group: Any) -> gym.spaces.Space:
        if isinstance(group, h5py.Dataset):
            return gym.spaces.Box(-np.inf, np.inf, group.shape[1:], np.float32)
        return gym.spaces.Dict({k: space(group[k]) for k in group.keys()})

    spaces = []
    for task in tasks:
        meta = metas[task]
        with h5py.File(meta.path, "r") as h5:
            spaces.append(space(h5[f"traj_{meta.episodes[0]['episode_id']}"]["obs"]))
    return layout_of(spaces, metas[tasks[0]].obs_mode)


def _in_layout(obs: dict[str, np.ndarray], raw: Any, layout: Any, obs_mode: str) -> dict[str, np.ndarray]:
    """One episode's contract arrays ``obs`` with the task list's ``state`` and cameras."""
    from envs.adapters.maniskill_adapter import camera_keys

    keep = set(camera_keys(list(layout.cameras)).values())
    out = {k: v for k, v in obs.items() if k == "state" or k in keep}
    frames = len(obs["state"])
    if obs_mode == "rgb":
        parts = {g: raw[g] for g in ("agent", "extra") if g in raw}
        out["state"] = np.stack([layout.vector(_frame(parts, t)) for t in range(frames)])
    else:
        out["state"] = np.stack([layout.vector(row) for row in obs["state"]])
    return out


def _concat(arrays: list[np.ndarray], key: str) -> np.ndarray:
    shapes = {a.shape[1:] for a in arrays}
    if len(shapes) > 1:
        raise UserError(f"the demo files' {key!r} observations differ in shape ({sorted(shapes)}); record them with the same image_size.")
    return np.concatenate(arrays)


def parse_demo_args(env_id: str, overrides: list[str]) -> DemoConfig:
    """``DemoConfig`` of ``embodied demos ENV_ID key=value ...``; an unknown key is a UserError."""
    from embodied.config import parse_override
    from embodied.errors import did_you_mean

    kinds = {"episodes": int, "image_size": int, "seed": int, "max_episode_steps": int, "max_attempts": int,
             "overwrite": bool, "out": str, "obs_mode": str, "control_mode": str}
    values: dict[str, Any] = {}
    for text in overrides:
        key, value = parse_override(text)
        if key not in kinds:
            raise UserError(f"embodied demos does not know {key!r}.{did_you_mean(key, kinds)} Keys: {', '.join(kinds)}.")
        kind = kinds[key]
        if kind is str:
            value = str(value)
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UserError(f"embodied demos: {key}={value!r} must be {'true or false' if kind is bool else 'an integer'}.")
        values[key] = value
    return DemoConfig(env_id=env_id, **values)


def summary_json(summary: DemoSummary) -> str:
    """The last line of ``embodied demos``: file, counts, seeds, time and, for a suite, each task's counts."""
    data: dict[str, Any] = {"path": str(summary.path), "kept": summary.kept, "attempted": summary.attempted,
                            "success_rate": round(summary.success_rate, 4),
                            "seeds": [summary.seeds[0], summary.seeds[-1]] if summary.seeds else [], "wall_s": round(summary.wall_s, 1)}
    if len(summary.tasks) > 1:
        data["tasks"] = {task: {"kept": c.kept, "attempted": c.attempted, "success_rate": round(c.success_rate, 4)}
                         for task, c in summary.tasks.items()}
    return json.dumps(data)
