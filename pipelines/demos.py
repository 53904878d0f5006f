"""Demonstrations made here: a scripted expert's successful episodes, in ManiSkill's trajectory format.

    summary = record_demos(DemoConfig("PickCube-v1", episodes=100, obs_mode="rgb", image_size=32))
    demos = load_demos([summary.path], chunk=8)          # -> pipelines.demonstrations.Demonstrations

Writing: ManiSkill's own ``RecordEpisode`` wrapper records a ManiSkill env (``pd_ee_delta_pos``,
the experts' controller) while an expert of :mod:`envs.experts.maniskill` acts from privileged
state; every episode ends at the env's own ``success`` or at ``max_episode_steps``, and only
successful ones are written (``flush_trajectory(save=success)``). The files are therefore exactly
what ManiSkill writes (read by ``ManiSkillTrajectoryDataset``, ``replay_trajectory``, the
LeRobot converter, ...):

* ``<out>.h5``: ``traj_<i>`` groups with ``obs`` (T+1 frames; ``agent``/``extra``/``sensor_data``
  /``<camera>``/``rgb`` uint8 for ``obs_mode=rgb``, one (T+1, D) array for ``state``),
  ``actions`` (T, A) float32 (A = 4 for pd_ee_delta_pos, 7 for pd_ee_delta_pose), ``terminated``, ``truncated``, ``success`` (T,) bool,
  ``env_states`` (T+1 states), ``rewards`` (T,);
* ``<out>.json``: ``env_info`` (``env_id``, ``env_kwargs``: obs mode, control mode, camera size,
  ..., ``max_episode_steps``) and ``episodes`` (``episode_id``, ``episode_seed``,
  ``reset_kwargs`` with the ``seed``, ``control_mode``, ``elapsed_steps``, ``success``), with
  ``source_type`` "scripted" and ``source_desc``. Added, for language-conditioned policies: the
  task's ``instruction`` in ``env_info`` and in every episode, and an ``embodied`` entry (the
  expert, its attempts and successes, the action bounds, the image size).

Reading (:func:`load_demos`): the episodes as the project's env contract shows them to a policy
(``rgb`` the first camera, ``rgb/<camera>`` the others, ``state`` as
:class:`envs.adapters.maniskill_adapter.ContractObservation` flattens it, the instruction under
``policies.base.INSTRUCTION_KEY``), the final frame of each episode left out (no action follows
it), actions chunked for the policy.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied.errors import UserError
from policies.base import INSTRUCTION_KEY

#: ``source_type`` of the files (ManiSkill's own datasets say "human", "motionplanning" or "rl").
SOURCE_TYPE = "scripted"
#: The key of the project's additions in the JSON file.
META_KEY = "embodied"


@dataclass
class DemoConfig:
    """What ``embodied demos ENV_ID [key=value ...]`` records."""

    env_id: str
    """ManiSkill task with a scripted expert (``envs.experts.maniskill.EXPERTS``)."""
    episodes: int = 100
    """Successful episodes to keep."""
    out: str | None = None
    """The ``.h5`` file (its ``.json`` beside it). Default:
    ``demos/<env_id>/scripted/trajectory.<obs_mode>.pd_ee_delta_pos.physx_cpu.h5``, ManiSkill's naming."""
    obs_mode: str = "rgb"
    """``rgb`` (camera frames + the robot's own state), ``state`` (privileged state) or ``state+rgb``."""
    image_size: int = 128
    """Camera frames' height and width in pixels; the size the policy's env gives (``env.image_size``)."""
    seed: int = 0
    """Attempt i resets with seed ``seed + i``."""
    max_episode_steps: int = 100
    """An episode that has not succeeded by then is dropped (and counted)."""
    max_attempts: int | None = None
    """Episodes to try at most (default ``2 * episodes + 10``); fewer kept is a UserError."""
    control_mode: str = "pd_ee_delta_pos"
    """The controller: ``pd_ee_delta_pos`` (4 dimensions) or ``pd_ee_delta_pose`` (7, as OpenVLA
    checkpoints' actions; the expert's rotation stays zero)."""
    overwrite: bool = False
    """Replace an existing ``out`` (otherwise an existing file is an error)."""


@dataclass
class DemoSummary:
    """Where the demonstrations went and how the expert did."""

    path: Path
    kept: int
    attempted: int
    seeds: list[int]
    wall_s: float

    @property
    def success_rate(self) -> float:
        return self.kept / max(self.attempted, 1)


def default_out(cfg: DemoConfig) -> Path:
    return Path("demos") / cfg.env_id / SOURCE_TYPE / f"trajectory.{cfg.obs_mode.replace('+', '_')}.{cfg.control_mode}.physx_cpu.h5"


def _env_config(cfg: DemoConfig):
    from envs.adapters.maniskill_adapter import OBS_MODES
    from envs.config import EnvConfig
    from envs.experts.maniskill import CONTROL_MODES

    if cfg.obs_mode not in OBS_MODES:
        raise UserError(f"obs_mode={cfg.obs_mode!r} must be one of {', '.join(OBS_MODES)}.")
    if cfg.control_mode not in CONTROL_MODES:
        raise UserError(f"control_mode={cfg.control_mode!r} must be one of {', '.join(CONTROL_MODES)} (what the scripted experts command).")
    return EnvConfig(id=cfg.env_id, obs_mode=cfg.obs_mode, image_size=cfg.image_size,
                     max_episode_steps=cfg.max_episode_steps, kwargs={"control_mode": cfg.control_mode})


def record_demos(cfg: DemoConfig, log: Callable[[str], None] = print) -> DemoSummary:
    """Run the task's scripted expert until ``cfg.episodes`` successful episodes are written to
    ``cfg.out`` (see the module docstring); a progress line after every episode."""
    from envs.adapters.maniskill_adapter import check_task, instruction_for, make_raw_maniskill
    from envs.experts.maniskill import expert_for

    if cfg.episodes < 1:
        raise UserError(f"episodes={cfg.episodes} must be at least 1.")
    expert = expert_for(cfg.env_id)
    out = Path(cfg.out) if cfg.out else default_out(cfg)
    if out.suffix != ".h5":
        raise UserError(f"out={str(out)!r} must name an .h5 file (its .json goes beside it), as ManiSkill's trajectories are.")
    if not cfg.overwrite and (out.exists() or out.with_suffix(".json").exists()):
        raise UserError(f"{out} already exists; give another out=PATH or overwrite=true.")
    max_attempts = cfg.max_attempts or 2 * cfg.episodes + 10
    env_cfg = _env_config(cfg)
    check_task(cfg.env_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = f".tmp-{out.stem}-{os.getpid()}"
    from mani_skill.utils.wrappers.record import RecordEpisode

    t0 = time.perf_counter()
    raw = make_raw_maniskill(env_cfg, "physx_cpu", 1)
    t_built = time.perf_counter()
    env = RecordEpisode(
        raw, str(out.parent), trajectory_name=tmp_name, save_video=False, save_on_reset=False, record_reward=True,
        source_type=SOURCE_TYPE, source_desc=f"envs.experts.maniskill scripted expert of {cfg.env_id} on privileged state "
                                             f"through {env_cfg.kwargs['control_mode']}; successful episodes only",
    )
    kept, attempted, seeds = 0, 0, []
    try:
        while kept < cfg.episodes and attempted < max_attempts:
            seed = cfg.seed + attempted
            ok = _run_episode(env, expert, seed, cfg.max_episode_steps, cfg.control_mode)
            attempted += 1
            env.flush_trajectory(save=ok)
            if ok:
                kept += 1
                seeds.append(seed)
            rate = kept / attempted
            per_s = attempted / (time.perf_counter() - t_built)
            eta = (cfg.episodes - kept) / max(rate, 1e-6) / per_s
            log(f"[demos] {cfg.env_id}: {kept}/{cfg.episodes} kept of {attempted} tried (expert success {rate:.0%}), "
                f"{per_s:.2f} episodes/s, ~{eta:.0f} s left")
    finally:
        env.close()  # writes the JSON (ids are consecutive: only kept episodes were saved)
    tmp_h5, tmp_json = out.parent / f"{tmp_name}.h5", out.parent / f"{tmp_name}.json"
    if kept < cfg.episodes:
        for f in (tmp_h5, tmp_json):
            f.unlink(missing_ok=True)
        raise UserError(f"the {cfg.env_id} expert succeeded in {kept} of {attempted} episodes (seeds {cfg.seed}..{cfg.seed + attempted - 1}), "
                        f"fewer than episodes={cfg.episodes}; raise max_attempts or max_episode_steps.")
    _annotate(tmp_json, instruction_for(cfg.env_id), cfg, raw, kept, attempted)
    tmp_h5.replace(out)
    tmp_json.replace(out.with_suffix(".json"))
    wall_s = time.perf_counter() - t0
    log(f"[demos] wrote {kept} episodes of {cfg.env_id} to {out} (+ .json); expert success {kept}/{attempted} "
        f"= {kept / attempted:.0%} on seeds {cfg.seed}..{cfg.seed + attempted - 1}, {wall_s:.0f} s")
    return DemoSummary(out, kept, attempted, seeds, wall_s)


def _run_episode(env: Any, expert: Any, seed: int, max_steps: int, control_mode: str) -> bool:
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


def _annotate(json_path: Path, instruction: str, cfg: DemoConfig, raw: Any, kept: int, attempted: int) -> None:
    """Add the instruction (``env_info`` and each episode) and the project's record to the JSON."""
    from mani_skill.utils.io_utils import dump_json, load_json

    data = load_json(json_path)
    data["env_info"]["instruction"] = instruction
    for episode in data["episodes"]:
        episode["instruction"] = instruction
    space = raw.unwrapped.single_action_space
    data[META_KEY] = {
        "expert": f"envs.experts.maniskill:{cfg.env_id}", "attempted": attempted, "succeeded": kept,
        "success_rate": kept / attempted, "first_seed": cfg.seed, "obs_mode": cfg.obs_mode,
        "image_size": cfg.image_size if cfg.obs_mode != "state" else None,
        "action_low": np.asarray(space.low, np.float64).tolist(), "action_high": np.asarray(space.high, np.float64).tolist(),
    }
    dump_json(json_path, data, indent=2)


# --- reading --------------------------------------------------------------------------------------------


@dataclass
class DemoFile:
    """One demonstration file's metadata (the JSON)."""

    path: Path
    env_id: str
    control_mode: str | None
    obs_mode: str
    instruction: str
    episodes: list[dict[str, Any]]
    action_low: np.ndarray
    action_high: np.ndarray
    image_size: int | None


def read_meta(path: str | Path) -> DemoFile:
    """The metadata of a demonstration file (``.h5``; its ``.json`` beside it)."""
    from mani_skill.utils.io_utils import load_json

    path = Path(path)
    json_path = path.with_suffix(".json")
    if path.suffix != ".h5" or not path.is_file() or not json_path.is_file():
        raise UserError(f"demos={str(path)!r}: expected a ManiSkill trajectory .h5 file with its .json beside it "
                        "(`embodied demos ENV_ID` writes them).")
    data = load_json(json_path)
    info = data.get("env_info") or {}
    kwargs = info.get("env_kwargs") or {}
    meta = data.get(META_KEY) or {}
    episodes = data.get("episodes") or []
    if not episodes:
        raise UserError(f"demos={str(path)!r} holds no episodes.")
    from envs.adapters.maniskill_adapter import instruction_for

    instruction = info.get("instruction") or instruction_for(info["env_id"])
    if "action_low" not in meta:
        raise UserError(f"demos={str(path)!r} was not written by `embodied demos` (its JSON has no '{META_KEY}' entry with the action bounds).")
    obs_mode = meta.get("obs_mode") or kwargs.get("obs_mode", "state")
    return DemoFile(path, info["env_id"], kwargs.get("control_mode"), obs_mode, instruction, episodes,
                    np.asarray(meta["action_low"], np.float32), np.asarray(meta["action_high"], np.float32), meta.get("image_size"))


def episode_observations(obs: Any, obs_mode: str) -> dict[str, np.ndarray]:
    """One trajectory's ``obs`` (as ManiSkill stored it, loaded to numpy) -> the contract's
    ``{"state", "rgb", "rgb/<camera>"}`` arrays of its T+1 frames."""
    from envs.adapters.maniskill_adapter import camera_keys, flatten_state

    if obs_mode == "state":
        return {"state": np.asarray(obs, np.float32).reshape(len(obs), -1)}
    if obs_mode == "state+rgb":
        out = {"state": np.asarray(obs["state"], np.float32).reshape(len(obs["state"]), -1)}
    else:
        parts = {k: obs[k] for k in ("agent", "extra") if k in obs}
        frames = len(next(iter(obs["sensor_data"].values()))["rgb"])
        out = {"state": np.stack([flatten_state(_frame(parts, t)) for t in range(frames)])}
    sensors = obs.get("sensor_data", {})
    cameras = camera_keys([cam for cam in sensors if "rgb" in sensors[cam]])
    for cam, key in cameras.items():
        out[key] = np.ascontiguousarray(sensors[cam]["rgb"][..., :3], dtype=np.uint8)
    return out


def _frame(tree: dict[str, Any], t: int) -> dict[str, Any]:
    return {k: _frame(v, t) if isinstance(v, dict) else v[t] for k, v in tree.items()}


def load_demos(paths: Sequence[str | Path], chunk: int = 1, limit: int | None = None):
    """Every episode of ``paths`` (files of one or several tasks) as a
    :class:`pipelines.demonstrations.Demonstrations` of frames: observations in the contract's
    keys plus the instruction, actions (N, C, A) chunked (``chunks_of``), ``episode`` numbering
    the episodes across files. ``limit``: at most that many episodes per file."""
    import h5py
    from mani_skill.trajectory.dataset import load_h5_data

    from pipelines.demonstrations import Demonstrations, chunks_of

    obs_parts: list[dict[str, np.ndarray]] = []
    actions: list[np.ndarray] = []
    episode_ids: list[np.ndarray] = []
    attempted = 0
    for path in paths:
        meta = read_meta(path)
        attempted += len(meta.episodes)
        with h5py.File(meta.path, "r") as h5:
            for entry in meta.episodes[:limit]:
                traj = load_h5_data(h5[f"traj_{entry['episode_id']}"])
                steps = len(traj["actions"])
                obs = episode_observations(traj["obs"], meta.obs_mode)
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
    return json.dumps({"path": str(summary.path), "kept": summary.kept, "attempted": summary.attempted,
                       "success_rate": round(summary.success_rate, 4), "seeds": [summary.seeds[0], summary.seeds[-1]]
                       if summary.seeds else [], "wall_s": round(summary.wall_s, 1)})
