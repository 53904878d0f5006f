"""Evaluation: run a policy for N episodes and report return and success."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.base import to_numpy
from envs.config import EnvConfig
from envs.registry import make_vec_env
from envs.video import record_episodes
from pipelines.collect import to_torch, with_instructions
from policies.base import Policy


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
) -> dict[str, Any]:
    """Run ``episodes`` episodes (each env runs its share, so short episodes are not favoured).

    Returns ``eval/episode_return``, ``eval/episode_length`` and ``eval/success_rate`` (success at
    the episode's end, from ``info["success"]``; None when the env has no success signal).
    """
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
                    rows.extend(r for r in _episode_row(res.episodes, i))
                    done_count[i] += 1
            obs = res.obs
    finally:
        env.close()
    if video_dir is not None:
        record_video(policy, env_cfg, Path(video_dir), seed, deterministic, device)
    returns = [r["return"] for r in rows]
    successes = [r["success"] for r in rows if "success" in r]
    return {
        "eval/episode_return": float(np.mean(returns)),
        "eval/episode_return_std": float(np.std(returns)),
        "eval/episode_length": float(np.mean([r["length"] for r in rows])),
        "eval/success_rate": float(np.mean(successes)) if successes else None,
        "eval/episodes": len(rows),
    }


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


def _episode_row(stats, i: int) -> list[dict[str, float]]:
    row = {"return": float(stats.episode_return[i]), "length": int(stats.length[i])}
    if stats.success is not None:
        row["success"] = float(stats.success[i])
    return [row]


VIDEO_ENVS = 4


@torch.no_grad()
def record_video(
    policy: Policy, env_cfg: EnvConfig, video_dir: Path, seed: int, deterministic: bool, device: torch.device | str,
    num_envs: int = VIDEO_ENVS,
) -> Path | None:
    """One episode of ``num_envs`` envs as ``<video_dir>/eval.mp4`` (a grid with each env's return and
    success drawn on it). Separate from the evaluation so that the evaluation never pays for
    rendering; None, with a warning, when the env cannot render. Never more envs than the
    evaluation's (``env_cfg.num_envs``)."""
    num_envs = min(num_envs, env_cfg.num_envs)
    cfg = dataclasses.replace(env_cfg, num_envs=num_envs)
    try:
        env = make_vec_env(cfg, seed=seed)
    except Exception as err:  # a missing renderer must not cost the user the evaluation
        warnings.warn(f"no evaluation video: {err}", stacklevel=2)
        return None
    try:
        return record_episodes(env, Actor(policy, env, device, deterministic), video_dir, name="eval", num_episodes=1,
                               seed=seed, max_envs=num_envs)
    except Exception as err:
        warnings.warn(f"no evaluation video: {err}", stacklevel=2)
        return None
    finally:
        env.close()
