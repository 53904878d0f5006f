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
from envs.video import VideoRecorder, frames_of
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
    recorder = None
    try:
        obs = env.reset(seed=seed)
        if video_dir is not None:
            recorder = VideoRecorder(video_dir, name="eval", max_envs=min(n, 16))
        done_count = np.zeros(n, int)
        rows: list[dict[str, float]] = []
        low = getattr(env.action_space, "low", None)
        policy.eval()
        while (done_count < quota).any():
            out = policy.act({k: torch.as_tensor(v, device=device) for k, v in obs.items()}, deterministic=deterministic)
            actions = out.actions.cpu().numpy()
            if low is not None:
                actions = np.clip(actions, env.action_space.low, env.action_space.high)
            frames = _frames(env, obs) if recorder is not None else None
            res = env.step(actions)
            if frames is not None:
                recorder.add_step(frames, res)
            elif recorder is not None:  # the env cannot render: evaluate without a video
                recorder.close()
                recorder = None
            for i in np.flatnonzero(to_numpy(res.episodes.done)):
                if done_count[i] < quota[i]:
                    rows.extend(r for r in _episode_row(res.episodes, i))
                    done_count[i] += 1
            obs = res.obs
    finally:
        if recorder is not None:
            recorder.close()
        env.close()
    returns = [r["return"] for r in rows]
    successes = [r["success"] for r in rows if "success" in r]
    return {
        "eval/episode_return": float(np.mean(returns)),
        "eval/episode_return_std": float(np.std(returns)),
        "eval/episode_length": float(np.mean([r["length"] for r in rows])),
        "eval/success_rate": float(np.mean(successes)) if successes else None,
        "eval/episodes": len(rows),
    }


def _episode_row(stats, i: int) -> list[dict[str, float]]:
    row = {"return": float(stats.episode_return[i]), "length": int(stats.length[i])}
    if stats.success is not None:
        row["success"] = float(stats.success[i])
    return [row]


def _frames(env, obs) -> np.ndarray | None:
    """The frames to record for this step, or None (with a warning) when the env cannot render."""
    try:
        return frames_of(env, obs)
    except Exception as err:  # a missing renderer must not cost the user the evaluation
        warnings.warn(f"no evaluation video: {err}", stacklevel=2)
        return None
