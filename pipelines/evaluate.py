"""Evaluation: run a policy for N episodes and report return and success.

:func:`run_episodes` runs the episodes (one row per episode), :func:`summarize` turns the rows into
``eval/*`` metrics, :func:`evaluate_policy` does both, and :func:`record_video` films one episode
of a few envs. :class:`EpisodeProgress` shows how many episodes are done while they run: a live bar
on a terminal, plain ``[eval]`` log lines otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.base import to_numpy
from envs.config import EnvConfig
from envs.registry import make_vec_env
from envs.video import NoFrames, record_episodes
from pipelines.collect import to_torch, with_instructions
from policies.base import Policy

LOG = logging.getLogger("embodied.eval")


class EpisodeProgress:
    """Episodes done of ``total`` (for ``label``: a task, an env id): ``update(done)`` as episodes
    finish, ``close()`` at the end. On a terminal a live bar; otherwise an ``[eval]`` line when the
    first episode ends, every ``log_every_s`` seconds and at the end (the terminal and the log)."""

    def __init__(self, total: int, label: str, mode: str = "auto", log_every_s: float = 10.0) -> None:
        self.total, self.label, self.log_every_s = total, label, log_every_s
        self.mode = ("bar" if sys.stderr.isatty() else "lines") if mode == "auto" else mode
        self.t0 = time.monotonic()
        self.done = 0
        self._last_line: float | None = None
        self._bar = None
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn(f"[bold]eval[/bold] {label}"), BarColumn(), MofNCompleteColumn(), TextColumn("episodes"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True))
            self._task = self._bar.add_task("eval", total=total)
            self._bar.start()

    def update(self, done: int) -> None:
        if done == self.done:
            return
        self.done = done
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        elapsed = time.monotonic() - self.t0
        if self._last_line is None or elapsed - self._last_line >= self.log_every_s or done >= self.total:
            self._last_line = elapsed
            eta = elapsed / done * (self.total - done)
            LOG.info(f"[eval] {self.label}: {done}/{self.total} episodes ({100 * done / self.total:.0f}%) | "
                     f"elapsed {elapsed:.0f}s | ETA {eta:.0f}s")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@torch.no_grad()
def evaluate_policy(
    policy: Policy,
    env_cfg: EnvConfig,
    episodes: int,
    seed: int,
    num_envs: int | None = None,
    deterministic: bool = True,
    device: torch.device | str = "cpu",
    video_dir: str | Path | None = None,
    progress: EpisodeProgress | None = None,
) -> dict[str, Any]:
    """Run ``episodes`` episodes (:func:`run_episodes`) and :func:`summarize` them; with
    ``video_dir``, then film one episode there (:func:`record_video`)."""
    rows = run_episodes(policy, env_cfg, episodes, seed, num_envs, deterministic, device, progress)
    if video_dir is not None:
        record_video(policy, env_cfg, Path(video_dir), seed, deterministic, device)
    return summarize(rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``eval/episode_return`` (and its std), ``eval/episode_length``, ``eval/success_rate``
    (success at the episode's end, from ``info["success"]``; None when the env has no success
    signal) and ``eval/episodes`` of :func:`run_episodes`' rows."""
    returns = [r["return"] for r in rows]
    successes = [r["success"] for r in rows if "success" in r]
    return {
        "eval/episode_return": float(np.mean(returns)),
        "eval/episode_return_std": float(np.std(returns)),
        "eval/episode_length": float(np.mean([r["length"] for r in rows])),
        "eval/success_rate": float(np.mean(successes)) if successes else None,
        "eval/episodes": len(rows),
    }


@torch.no_grad()
def run_episodes(
    policy: Policy,
    env_cfg: EnvConfig,
    episodes: int,
    seed: int,
    num_envs: int | None = None,
    deterministic: bool = True,
    device: torch.device | str = "cpu",
    progress: EpisodeProgress | None = None,
) -> list[dict[str, Any]]:
    """Run ``episodes`` episodes (each env runs its share, so short episodes are not favoured; env
    i is reset with ``seed + i``, then auto-resets). One row per episode, in the order they
    ended: ``env`` (its env index), ``return``, ``length`` (env steps) and, when the env reports
    it, ``success`` (0.0 or 1.0). ``progress`` is told the count as episodes end."""
    n = max(1, min(num_envs or episodes, episodes))
    quota = np.array([episodes // n + (1 if i < episodes % n else 0) for i in range(n)])
    env = make_vec_env(dataclasses.replace(env_cfg, num_envs=n), seed=seed)
    try:
        act = Actor(policy, env, device, deterministic)
        obs = env.reset(seed=seed)
        done_count = np.zeros(n, int)
        rows: list[dict[str, float]] = []
        policy.eval()
        while (done_count < quota).any():
            # an action chunk (N, C, *action_shape) is applied step by step; a finished episode
            # skips the rest of its chunk
            actions = act(obs)
            res = env.chunk_step(actions) if policy.action_chunk > 1 else env.step(actions)
            for i in np.flatnonzero(to_numpy(res.episodes.done)):
                if done_count[i] < quota[i]:
                    rows.append(_episode_row(res.episodes, int(i)))
                    done_count[i] += 1
            if progress is not None:
                progress.update(len(rows))
            obs = res.obs
    finally:
        env.close()
        if progress is not None:
            progress.close()
    return rows


class Actor:
    """The env actions a policy takes in an env's observations (with the env's instructions,
    de-tokenized and clipped to the action space's bounds)."""

    def __init__(self, policy: Policy, env: Any, device: torch.device | str, deterministic: bool) -> None:
        self.policy, self.device, self.deterministic = policy, device, deterministic
        self.instructions = None if env.instructions is None else np.asarray(env.instructions, dtype=str)
        low = getattr(env.action_space, "low", None)
        self.bounds = None if low is None else (env.action_space.low, env.action_space.high)

    @torch.no_grad()
    def __call__(self, obs: Any) -> np.ndarray:
        out = self.policy.act(to_torch(with_instructions(obs, self.instructions), torch.device(self.device)),
                              deterministic=self.deterministic)
        actions = (out.env_actions if out.env_actions is not None else out.actions).cpu().numpy()
        return np.clip(actions, *self.bounds) if self.bounds is not None else actions


def _episode_row(stats, i: int) -> dict[str, Any]:
    row: dict[str, Any] = {"env": i, "return": float(stats.episode_return[i]), "length": int(stats.length[i])}
    if stats.success is not None:
        row["success"] = float(stats.success[i])
    return row


VIDEO_ENVS = 4


@torch.no_grad()
def record_video(
    policy: Policy, env_cfg: EnvConfig, video_dir: Path, seed: int, deterministic: bool, device: torch.device | str,
    num_envs: int = VIDEO_ENVS,
) -> Path | None:
    """One episode of ``num_envs`` envs as ``<video_dir>/eval.mp4`` (a grid with each env's return and
    success drawn on it). Separate from the evaluation so that the evaluation never pays for
    rendering. When the env cannot render (no renderer, ``render()`` raises) there is no video:
    a partial file is removed, one warning line says why (the traceback goes to the log only) and
    None is returned; the metrics are not affected. Never more envs than the evaluation's
    (``env_cfg.num_envs``)."""
    num_envs = min(num_envs, env_cfg.num_envs)
    cfg = dataclasses.replace(env_cfg, num_envs=num_envs)
    try:
        env = make_vec_env(cfg, seed=seed)
    except Exception as err:  # a missing renderer must not cost the user the evaluation
        _no_video(env_cfg.id, err)
        return None
    try:
        return record_episodes(env, Actor(policy, env, device, deterministic), video_dir, name="eval", num_episodes=1,
                               seed=seed, max_envs=num_envs)
    except Exception as err:  # record_episodes removed its partial mp4
        _no_video(env_cfg.id, err)
        return None
    finally:
        env.close()


def _no_video(env_id: str, err: BaseException) -> None:
    """The one terminal line of a video that is not made (the traceback in the log only)."""
    LOG.debug("no evaluation video of %s", env_id, exc_info=err)
    if isinstance(err, (NoFrames, NotImplementedError)):
        why = f"env {env_id} has no renderer (no 'rgb' observation, and render() returns nothing)"
    else:
        why = f"rendering env {env_id} failed: {type(err).__name__}: {err}"
    LOG.warning(f"no evaluation video: {why}. The evaluation's metrics are not affected.")
