"""Demonstrations as transitions for RLPD, as the replay buffer stores them: an expert's episodes
(``demos.expert``) stepped in the run's env, successful ones only by default, or the episodes of
ManiSkill trajectory files (``demos.path``, e.g. ``embodied demos PickCube-v1 obs_mode=state``).

    demos = demonstrations(cfg)          # Transitions (N, 1, ...): the episodes one after another

The expert is a scripted function of a batch of observations or a trained policy's run dir
(:func:`pipelines.demonstrations.load_expert`, the warm start's experts). The episodes start from
seeds apart from training's and evaluation's.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import numpy as np

from embodied.errors import UserError
from embodied.rl.replay import Transitions
from envs.base import to_numpy
from envs.registry import make_vec_env
from pipelines.demonstrations import load_expert
from pipelines.offpolicy.config import OffPolicyConfig

LOG = logging.getLogger("embodied")
DEMO_SEED_OFFSET = 20_000_000  # demonstration episodes start from seeds apart from training's and evaluation's


def demonstrations(cfg: OffPolicyConfig, log: Callable[[str], None] = LOG.info) -> Transitions:
    """The run's demonstrations: read from ``demos.path``, or recorded from ``demos.expert``."""
    return read_demonstrations(cfg, log) if cfg.demos.path else record_demonstrations(cfg, log)


def read_demonstrations(cfg: OffPolicyConfig, log: Callable[[str], None] = LOG.info) -> Transitions:
    """At most ``demos.episodes`` episodes of each file of ``demos.path``: observation t, action t,
    the recorded reward, termination and truncation of step t, and observation t + 1."""
    import h5py
    from mani_skill.trajectory.dataset import load_h5_data

    from pipelines.demos import episode_observations, read_meta

    control_mode = cfg.env.kwargs.get("control_mode")
    steps: list[dict[str, Any]] = []
    episodes = 0
    for path in cfg.demos.path or []:
        meta = read_meta(path)
        if meta.env_id != cfg.env.id or meta.obs_mode != "state" or (control_mode and meta.control_mode != control_mode):
            raise UserError(f"demos.path {path} holds {meta.env_id} with obs_mode={meta.obs_mode}, control_mode="
                            f"{meta.control_mode}; this run trains {cfg.env.id} from state with control_mode={control_mode} "
                            f"(record them with `embodied demos {cfg.env.id} obs_mode=state`)")
        with h5py.File(meta.path, "r") as h5:
            for entry in meta.episodes[:cfg.demos.episodes]:
                traj = load_h5_data(h5[f"traj_{entry['episode_id']}"])
                state = episode_observations(traj["obs"], "state")["state"]  # (T + 1, D)
                for t in range(len(traj["actions"])):
                    steps.append({"obs": {"state": state[t]}, "actions": np.asarray(traj["actions"][t], np.float32),
                                  "rewards": np.float32(traj["rewards"][t]), "next_obs": {"state": state[t + 1]},
                                  "terminated": bool(traj["terminated"][t]), "truncated": bool(traj["truncated"][t])})
                episodes += 1
    log(f"[offpolicy] demonstrations: {episodes} episodes, {len(steps)} transitions from {', '.join(cfg.demos.path or [])}")
    return _as_transitions(steps, ["state"])


def record_demonstrations(cfg: OffPolicyConfig, log: Callable[[str], None] = LOG.info) -> Transitions:
    """``demos.episodes`` episodes of ``demos.expert`` (at most ``demos.max_attempts`` tried) as
    transitions, time-major with one env column: the kept episodes one after another."""
    d = cfg.demos
    assert d.expert is not None
    env = make_vec_env(dataclasses.replace(cfg.env, num_envs=d.num_envs), seed=cfg.seed + DEMO_SEED_OFFSET)
    try:
        expert = load_expert(d.expert, env.observation_space, env.action_space, cfg.env.id)
        keys = list(env.observation_space.spaces)
        low, high = env.action_space.low, env.action_space.high
        obs = {k: to_numpy(v) for k, v in env.reset(seed=cfg.seed + DEMO_SEED_OFFSET).items()}
        running: list[list[dict[str, Any]]] = [[] for _ in range(d.num_envs)]
        kept: list[list[dict[str, Any]]] = []
        attempts, limit = 0, d.max_attempts or 4 * d.episodes
        while len(kept) < d.episodes and attempts < limit:
            actions = np.clip(np.asarray(expert(obs), dtype=np.float32), low, high)
            res = env.step(actions)
            next_obs = {k: to_numpy(res.obs[k]) for k in keys}
            term, trunc = to_numpy(res.terminated).astype(bool), to_numpy(res.truncated).astype(bool)
            reward = to_numpy(res.reward).astype(np.float32)
            final = None if res.final_obs is None else {k: to_numpy(res.final_obs[k]) for k in keys}
            for i in range(d.num_envs):
                done = term[i] or trunc[i]
                after = final if done and final is not None else next_obs
                running[i].append({"obs": {k: obs[k][i] for k in keys}, "actions": actions[i], "rewards": reward[i],
                                   "next_obs": {k: after[k][i] for k in keys}, "terminated": term[i], "truncated": trunc[i]})
                if done:
                    attempts += 1
                    success = res.episodes.success
                    if not d.successful_only or success is None or bool(to_numpy(success)[i]):
                        kept.append(running[i])
                    running[i] = []
            obs = next_obs
    finally:
        env.close()
    if not kept:
        raise UserError(f"demos.expert={d.expert!r} finished none of its {attempts} episodes successfully on {cfg.env.id}: "
                        "RLPD has no demonstrations (a better expert, or demos.successful_only=false)")
    kept = kept[:d.episodes]
    steps = [s for episode in kept for s in episode]
    log(f"[offpolicy] demonstrations: {len(kept)} of {attempts} episodes kept, {len(steps)} transitions ({d.expert})")
    return _as_transitions(steps, keys)


def _as_transitions(steps: list[dict[str, Any]], keys: list[str]) -> Transitions:
    """Steps one after another as Transitions of one env column, (N, 1, ...)."""
    column = lambda name: np.stack([s[name] for s in steps])[:, None]  # noqa: E731  (N,) -> (N, 1)
    return Transitions(obs={k: np.stack([s["obs"][k] for s in steps])[:, None] for k in keys}, actions=column("actions"),
                       rewards=column("rewards"), next_obs={k: np.stack([s["next_obs"][k] for s in steps])[:, None] for k in keys},
                       terminated=column("terminated"), truncated=column("truncated"))
