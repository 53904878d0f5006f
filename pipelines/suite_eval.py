"""Suite evaluation, the way papers report LIBERO: success rate per task and their mean.

``env.id`` names the tasks: a comma-separated list of task ids (``PushCube-v1,PickCube-v1``), in
which a LIBERO suite stands for its tasks in the suite's standard order (``libero_spatial`` ->
``libero_spatial/0`` .. ``libero_spatial/9``; ``libero_goal/3`` is one task). Each task runs
``episodes_per_task`` episodes with :func:`pipelines.evaluate.evaluate_policy`, its envs reset
with seeds ``seed, seed + 1, ...`` and auto-reset after that; for LIBERO, seed 0 (the default)
makes a task's episodes start from its official initial states 0..N-1, one each
(``envs.adapters.libero_adapter``). :func:`pipelines.evaluate.record_video` then films the first
``video_envs`` episodes of every task (the same seeds, hence the same initial states).

Written into ``out_dir``: ``suite_results.json`` (:meth:`SuiteResult.to_dict`),
``suite_results.md`` (the table) and ``videos/<task>.mp4``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.errors import UserError
from embodied.registry import Registry
from envs.config import EnvConfig
from envs.registry import resolve_adapter
from pipelines.evaluate import EpisodeProgress, evaluate_policy, record_video
from policies.base import Policy

RESULTS_NAME = "suite_results"


@dataclass(frozen=True)
class SuiteTask:
    """One task of a suite: the ``env.id`` that runs it, and how the table names it."""

    id: str
    instruction: str | None = None


@dataclass(frozen=True)
class SuiteFamily:
    """How an adapter's ids take part in a suite evaluation.

    tasks:     the tasks one id stands for (a LIBERO suite: its tasks).
    for_video: the env config that can render a video of ``cfg`` (e.g. a renderer for state obs).
    task_env:  the env config that runs one task of the suite ``cfg`` names (default: ``cfg`` with
               ``id`` the task's); an adapter whose task list shares one observation layout keeps
               the list and selects the task (ManiSkill: ``env.kwargs.task``).
    """

    tasks: Callable[[str], list[SuiteTask]]
    for_video: Callable[[EnvConfig], EnvConfig] = lambda cfg: cfg
    task_env: Callable[[EnvConfig, str], EnvConfig] = lambda cfg, task: dataclasses.replace(cfg, id=task)


#: Per env adapter (``envs.registry``); an adapter without an entry evaluates each id as one task.
SUITE_FAMILIES: Registry[SuiteFamily] = Registry("suite family")


def _libero_tasks(env_id: str) -> list[SuiteTask]:
    from envs.adapters.libero_adapter import parse_id

    return [SuiteTask(t.id, t.instruction) for t in parse_id(env_id)[1]]


def _libero_video(cfg: EnvConfig) -> EnvConfig:
    if cfg.obs_mode != "state" or cfg.kwargs.get("render"):
        return cfg
    return dataclasses.replace(cfg, kwargs={**cfg.kwargs, "render": True})


SUITE_FAMILIES.add("libero", SuiteFamily(_libero_tasks, _libero_video), "LIBERO suites: one task per suite task")


def _maniskill_tasks(env_id: str) -> list[SuiteTask]:
    from envs.adapters.maniskill_adapter import instruction_for, parse_tasks

    return [SuiteTask(t, instruction_for(t)) for t in parse_tasks(env_id)]


def _maniskill_task_env(cfg: EnvConfig, task: str) -> EnvConfig:
    from envs.adapters.maniskill_adapter import parse_tasks

    if len(parse_tasks(cfg.id)) == 1:
        return dataclasses.replace(cfg, id=task)
    return dataclasses.replace(cfg, kwargs={**cfg.kwargs, "task": task})  # the list's observation layout


SUITE_FAMILIES.add("maniskill", SuiteFamily(_maniskill_tasks, task_env=_maniskill_task_env),
                   "ManiSkill task lists: one task each, in the list's observation layout")


def _metaworld_tasks(env_id: str) -> list[SuiteTask]:
    from envs.adapters.metaworld_adapter import INSTRUCTIONS, PREFIX, parse_id

    return [SuiteTask(f"{PREFIX}/{t}", INSTRUCTIONS.get(t)) for t in parse_id(env_id)]


SUITE_FAMILIES.add("metaworld", SuiteFamily(_metaworld_tasks), "Meta-World MT10/MT50: one task per benchmark task")


def _family(env_id: str) -> SuiteFamily:
    adapter = resolve_adapter(EnvConfig(id=env_id))
    return SUITE_FAMILIES.get(adapter) if adapter in SUITE_FAMILIES else SuiteFamily(lambda i: [SuiteTask(i)])


def suite_tasks(env_id: str) -> list[SuiteTask]:
    """The tasks ``env_id`` names (see the module docstring), in order, each once."""
    parts = [p.strip() for p in env_id.split(",")]
    if not all(parts):
        raise UserError(f"env.id={env_id!r}: an empty task id in the comma-separated list.")
    tasks: list[SuiteTask] = []
    for part in parts:
        tasks += [t for t in _family(part).tasks(part) if t.id not in {s.id for s in tasks}]
    return tasks


def task_env(env_cfg: EnvConfig, task: str) -> EnvConfig:
    """The env config that runs ``task``, one of the tasks of the suite ``env_cfg.id`` names."""
    return _family(task).task_env(env_cfg, task)


@dataclass
class TaskResult:
    """One task's evaluation. Rates are fractions in [0, 1]; lengths in env steps."""

    id: str
    instruction: str | None
    episodes: int
    successes: int | None
    """Episodes that ended in success; None when the env reports no success."""
    success_rate: float | None
    episode_return: float
    episode_length: float
    video: str | None
    """The task's video, relative to the output folder, or None."""


@dataclass
class SuiteResult:
    """The table: per-task results and the mean success rate over tasks (None without success signals)."""

    env_id: str
    episodes_per_task: int
    seed: int
    tasks: list[TaskResult]
    mean_success_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_markdown(self) -> str:
        instructions = any(t.instruction for t in self.tasks)
        head = ["task"] + (["instruction"] if instructions else []) + ["success", "episodes", "return", "length", "video"]
        lines = [
            f"# Suite evaluation: `{self.env_id}`",
            "",
            f"{self.episodes_per_task} episodes per task; env i of a task reset with seed {self.seed} + i, then auto-reset.",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for t in self.tasks:
            success = "n/a" if t.success_rate is None else f"{100 * t.success_rate:.1f}% ({t.successes}/{t.episodes})"
            row = [f"`{t.id}`"] + ([_cell(t.instruction or "")] if instructions else [])
            row += [success, str(t.episodes), f"{t.episode_return:.3f}", f"{t.episode_length:.1f}", f"[mp4]({t.video})" if t.video else ""]
            lines.append("| " + " | ".join(row) + " |")
        mean = "n/a" if self.mean_success_rate is None else f"**{100 * self.mean_success_rate:.1f}%**"
        total = sum(t.episodes for t in self.tasks)
        lines.append("| " + " | ".join(["**mean**"] + ([""] if instructions else []) + [mean, str(total), "", "", ""]) + " |")
        return "\n".join(lines) + "\n"

    def write(self, out_dir: str | Path) -> tuple[Path, Path]:
        """``<out_dir>/suite_results.json`` and ``.md``; returns both paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = out / f"{RESULTS_NAME}.json", out / f"{RESULTS_NAME}.md"
        _write_atomic(paths[0], json.dumps(self.to_dict(), indent=2) + "\n")
        _write_atomic(paths[1], self.to_markdown())
        return paths


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _file_name(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", task_id).strip("_") or "task"


def evaluate_suite(
    policy: Policy,
    env_cfg: EnvConfig,
    out_dir: str | Path,
    episodes_per_task: int = 50,
    seed: int = 0,
    num_envs: int | None = None,
    deterministic: bool = True,
    device: torch.device | str = "cpu",
    video: bool = True,
    video_envs: int = 1,
    progress: bool = False,
) -> SuiteResult:
    """Evaluate ``policy`` on every task ``env_cfg.id`` names; write the table into ``out_dir``.

    episodes_per_task: N episodes per task (LIBERO: official initial states seed..seed+N-1).
    num_envs:          parallel envs per task; default ``min(N, env_cfg.num_envs)``.
    video:             film ``video_envs`` episodes per task into ``out_dir/videos/<task>.mp4``
                       (a task whose env cannot render gets none, with a warning).
    progress:          show each task's episodes as they end (``task K/T <id>: i/N episodes``).
    Returns the :class:`SuiteResult` that ``suite_results.json`` / ``.md`` hold.
    """
    if episodes_per_task < 1:
        raise UserError(f"episodes_per_task must be >= 1, got {episodes_per_task}.")
    out = Path(out_dir)
    n = num_envs or min(episodes_per_task, env_cfg.num_envs)
    results = []
    tasks = suite_tasks(env_cfg.id)
    for k, task in enumerate(tasks, 1):
        cfg = task_env(env_cfg, task.id)
        shown = EpisodeProgress(episodes_per_task, f"task {k}/{len(tasks)} {task.id}") if progress else None
        stats = evaluate_policy(policy, cfg, episodes_per_task, seed=seed, num_envs=n, deterministic=deterministic, device=device,
                                progress=shown)
        film = _video(policy, cfg, out, task.id, seed, deterministic, device, video_envs) if video else None
        rate = stats["eval/success_rate"]
        results.append(
            TaskResult(
                id=task.id,
                instruction=task.instruction,
                episodes=stats["eval/episodes"],
                successes=None if rate is None else int(round(rate * stats["eval/episodes"])),
                success_rate=rate,
                episode_return=stats["eval/episode_return"],
                episode_length=stats["eval/episode_length"],
                video=film,
            )
        )
    rates = [t.success_rate for t in results if t.success_rate is not None]
    mean = float(np.mean(rates)) if rates and len(rates) == len(results) else None
    result = SuiteResult(env_cfg.id, episodes_per_task, seed, results, mean)
    result.write(out)
    return result


def _video(
    policy: Policy, cfg: EnvConfig, out: Path, task_id: str, seed: int, deterministic: bool, device: torch.device | str, envs: int
) -> str | None:
    """Film the task; the path of its mp4 relative to ``out``, or None."""
    video_cfg = _family(task_id).for_video(dataclasses.replace(cfg, num_envs=envs))
    staging = out / "videos" / f".{_file_name(task_id)}"
    path = record_video(policy, video_cfg, staging, seed, deterministic, device, num_envs=envs)
    if path is None or not path.is_file():
        if path is not None:
            warnings.warn(f"no video for {task_id}: the rollout produced no frame", stacklevel=2)
        return None
    final = out / "videos" / f"{_file_name(task_id)}.mp4"
    os.replace(path, final)
    staging.rmdir()
    return final.relative_to(out).as_posix()
