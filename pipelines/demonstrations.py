"""Demonstrations for behaviour cloning: an expert's episodes, recorded as the policy sees them.

    expert = load_expert("envs.adapters.color_reach:expert", env)      # or a run dir of a trained policy
    demos = collect_demonstrations(env, expert, episodes=64, chunk=4)

Shapes: N frames (decisions), C = the policy's action chunk, A = action dim. ``demos.obs`` holds
every observation key of the env (images, ``state``, the instruction under ``INSTRUCTION_KEY``)
as (N, ...) arrays; ``demos.actions`` the expert's next C actions from each frame, (N, C, A)
float32 ((N, A) when C = 1), within the frame's episode (the episode's last action repeats past
its end, as chunked imitation learning pads); ``demos.episode`` (N,) the frame's episode number.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from embodied.errors import UserError
from embodied.rl import is_text
from envs.base import VecEnv, to_numpy
from pipelines.collect import to_torch, with_instructions

#: An expert: a batch of observations (numpy, instructions included) -> env actions (N, A).
Expert = Callable[[dict[str, Any]], np.ndarray]


@dataclass
class Demonstrations:
    """Frames of kept episodes (see the module docstring)."""

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    episode: np.ndarray
    attempted: int
    """Episodes the expert ran (kept or not)."""
    succeeded: int | None
    """Of those, the ones that ended in success (None: the env has no success signal)."""

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def episodes(self) -> int:
        return int(len(np.unique(self.episode)))

    def select(self, rows: np.ndarray) -> dict[str, Any]:
        """Observations of ``rows`` (a numpy index array)."""
        return {k: v[rows] for k, v in self.obs.items()}


def load_expert(spec: str, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, env_id: str) -> Expert:
    """The expert ``spec`` names: ``package.module:function`` or a run dir (see
    ``warmstart.expert``). A run dir's policy is built from its ``config.yaml``, loaded from its
    latest checkpoint and acts deterministically on this env's ``state`` observation."""
    path = Path(spec).expanduser()
    if path.exists():
        return _policy_expert(path, observation_space, action_space, env_id)
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise UserError(f"warmstart.expert={spec!r} is neither a run dir nor 'package.module:function'.")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise UserError(f"warmstart.expert={spec!r}: cannot import it ({err}).") from None
    if not callable(fn):
        raise UserError(f"warmstart.expert={spec!r} is not a function of a batch of observations.")
    return fn


def _policy_expert(run: Path, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, env_id: str) -> Expert:
    from embodied.checkpoint import find_checkpoint, load_checkpoint
    from embodied.config import build_config, load_yaml
    from pipelines.workflow import schema_of
    from policies.registry import build_policy

    ckpt = find_checkpoint(run)
    run_dir = ckpt.parent.parent
    data = load_yaml(run_dir / "config.yaml")
    cfg = build_config(schema_of(data), {**data, "resume": None})
    if cfg.env.id != env_id:
        raise UserError(f"warmstart.expert={str(run)!r} was trained on {cfg.env.id}, the warm start runs {env_id}.")
    if "state" not in observation_space.spaces:
        raise UserError(f"the expert of {str(run)!r} acts on a 'state' observation; set env.obs_mode=state+rgb.")
    if cfg.policy.action_chunk != 1:
        raise UserError(f"the expert of {str(run)!r} predicts action chunks; demonstrations need one action per step.")
    space = gym.spaces.Dict({"state": observation_space["state"]})
    policy = build_policy(cfg.policy, space, action_space).eval()
    model, _, _ = load_checkpoint(ckpt)
    try:
        missing, unexpected = policy.load_state_dict(model, strict=False)
    except RuntimeError as err:  # shapes: the expert saw another state
        raise UserError(f"the expert of {str(run)!r} does not fit this env's state {observation_space['state']}: {err}") from None
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not fit the expert's policy: missing {missing[:5]}, unexpected {unexpected[:5]}.")

    @torch.no_grad()
    def act(obs: dict[str, Any]) -> np.ndarray:
        out = policy.act(to_torch({"state": obs["state"]}, torch.device("cpu")), deterministic=True)
        return (out.env_actions if out.env_actions is not None else out.actions).cpu().numpy()

    return act


def collect_demonstrations(
    env: VecEnv, expert: Expert, episodes: int, chunk: int = 1, seed: int = 0, noise: float = 0.0,
    successful_only: bool = True, max_attempts: int | None = None,
) -> Demonstrations:
    """Run ``expert`` in ``env`` until ``episodes`` episodes are kept (see the module docstring).

    noise:           the env executes ``clip(a + noise * (high - low) / 2 * N(0, 1))`` while ``a``
                     is recorded.
    successful_only: keep only episodes that ended in success (all, without a success signal).
    max_attempts:    episodes to try at most (default ``4 * episodes``); fewer kept is a UserError.
    """
    max_attempts = max_attempts or 4 * episodes
    rng = np.random.default_rng(seed)
    instructions = None if env.instructions is None else np.asarray(env.instructions, dtype=str)
    low, high = (np.asarray(env.action_space.low, np.float32), np.asarray(env.action_space.high, np.float32))
    half_range = np.where(np.isfinite(high - low), (high - low) / 2, 1.0)
    n = env.num_envs
    frames: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    actions: list[list[np.ndarray]] = [[] for _ in range(n)]
    kept_obs: list[dict[str, Any]] = []
    kept_actions: list[np.ndarray] = []
    kept_episode: list[np.ndarray] = []
    attempted = succeeded = 0
    has_success = True
    obs = with_instructions(env.reset(seed=seed), instructions)
    while len(kept_actions) < episodes and attempted < max_attempts:
        rows = {k: v if is_text(v) else to_numpy(v) for k, v in obs.items()}
        wanted = np.asarray(expert(rows), np.float32).reshape(n, *env.action_space.shape)  # (N, A)
        executed = wanted + noise * half_range * rng.standard_normal(wanted.shape).astype(np.float32) if noise else wanted
        res = env.step(np.clip(executed, low, high))
        for i in range(n):
            frames[i].append({k: v[i] for k, v in rows.items()})
            actions[i].append(wanted[i])
        done = to_numpy(res.terminated).astype(bool) | to_numpy(res.truncated).astype(bool)
        success = res.episodes.success
        has_success = has_success and success is not None
        for i in np.flatnonzero(done):
            attempted += 1
            ok = bool(to_numpy(success)[i]) if success is not None else True
            succeeded += int(ok)
            if (ok or not successful_only) and len(kept_actions) < episodes:
                kept_obs.append({k: np.stack([f[k] for f in frames[i]]) for k in rows})
                kept_actions.append(chunks_of(np.stack(actions[i]), chunk))
                kept_episode.append(np.full(len(frames[i]), len(kept_actions) - 1))
            frames[i], actions[i] = [], []
        obs = with_instructions(res.obs, instructions)
    if len(kept_actions) < episodes:
        raise UserError(
            f"the expert kept {len(kept_actions)} of the {episodes} demonstration episodes asked for in {attempted} "
            f"attempts ({succeeded} successful); check warmstart.expert, or set warmstart.successful_only=false."
        )
    return Demonstrations(
        obs={k: np.concatenate([o[k] for o in kept_obs]) for k in kept_obs[0]},
        actions=np.concatenate(kept_actions),
        episode=np.concatenate(kept_episode),
        attempted=attempted,
        succeeded=succeeded if has_success else None,
    )


def chunks_of(actions: np.ndarray, chunk: int) -> np.ndarray:
    """An episode's actions (L, A) -> the next ``chunk`` actions from every step, (L, C, A), the
    last action repeated past the end; (L, A) unchanged when ``chunk`` is 1."""
    if chunk == 1:
        return actions
    index = np.minimum(np.arange(len(actions))[:, None] + np.arange(chunk)[None, :], len(actions) - 1)  # (L, C)
    return actions[index]
