"""The workers of the embodied PPO macro flow: EnvWorker -> RolloutWorker -> TrainerWorker.

Message protocol per iteration (k = env micro-chunks per env worker, T = rollout steps), on which
the planner's simulation of a timeline is based:

* EnvWorker rank e, chunk c (key ``e * k + c``): sends the current observation, then T times
  receives actions, steps the chunk's envs and sends the step's :class:`EnvOutput`. While chunk c
  waits for its actions, chunk c+1 is simulated: that is the pipelining.
* RolloutWorker: for each of the T+1 outputs of each chunk it owns, records the reward/done of the
  previous transition (bootstrapping truncated episodes from the value of their final
  observation), and for the first T acts and sends actions back. It then sends the finished
  trajectory batch (T, B) to the trainer.
* TrainerWorker: computes GAE and runs the PPO epochs; its weights, with a version number, are
  loaded into every rollout rank before the next iteration. A rollout tags its trajectories with
  the version it used; the trainer refuses stale ones.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.offload import Offloader
from embodied.runtime import Channel, Worker
from embodied.seeding import seed_everything
from envs.base import Obs, to_numpy
from envs.registry import make_vec_env
from pipelines.config import TrainConfig
from pipelines.ppo import bootstrap_scale, bootstraps, chunk_transition, ppo_update
from scheduler import chunk_sizes
from policies.registry import build_policy

OBS_KEY = "obs"


@dataclass
class EnvOutput:
    """One message from an env chunk to the rollout. ``reward`` etc. are None for the first
    observation of an iteration (no transition led to it). With action chunks (C > 1) ``reward``,
    ``terminated``, ``truncated`` and ``valid`` are the chunk's per-step (B, C) arrays."""

    obs: Obs
    reward: np.ndarray | None = None
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    final_obs: Obs | None = None
    valid: np.ndarray | None = None


class BlockRoute:
    """Channel route for keys ``rank * block + chunk`` owned by ``rank`` (picklable)."""

    def __init__(self, block: int) -> None:
        self.block = block

    def __call__(self, key: int, num_ranks: int) -> int:
        return key // self.block


@dataclass(frozen=True)
class Pinning:
    """Where a worker runs on this machine: the CPU cores it is pinned to (None: not pinned) and
    its torch threads. Env workers give their env processes one core each."""

    cores: tuple[int, ...] | None = None
    threads: int = 1

    def apply(self) -> None:
        if self.cores is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, self.cores)  # MultiprocessVecEnv gives its env processes this affinity
        torch.set_num_threads(max(1, self.threads))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def to_torch(obs: Obs, device: torch.device) -> dict[str, torch.Tensor]:
    """Tensors on ``device`` sharing memory with the arrays where possible. Arrays that arrive
    through Ray's object store are read-only; they are only ever read here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {k: torch.as_tensor(v, device=device) for k, v in obs.items()}


class EnvWorker(Worker):
    """Steps ``env.num_envs`` envs split into ``num_chunks`` independently stepped chunks."""

    def __init__(self, cfg: TrainConfig, num_chunks: int, pinning: Pinning | None = None) -> None:
        self.cfg = cfg
        self.envs: list[Any] = []
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads))

    def configure(self, num_chunks: int, pinning: Pinning) -> None:
        """(Re)build the chunks' envs for a plan: ``num_chunks`` chunks, each stepping its envs in
        ``len(pinning.cores)`` processes pinned to those cores. Episodes restart."""
        self.close()
        pinning.apply()
        cfg = self.cfg
        self.num_chunks = num_chunks
        self.sizes = chunk_sizes(cfg.env.num_envs, num_chunks)
        base_seed = cfg.seed + 1000 * self.rank
        procs = len(pinning.cores) if pinning.cores is not None else cfg.env.num_procs
        self.envs = []
        first = 0
        for size in self.sizes:
            env_cfg = dataclasses.replace(cfg.env, num_envs=size, num_procs=min(procs, size) if procs else 0)
            self.envs.append(make_vec_env(env_cfg, seed=base_seed + first))
            first += size
        self.seeds = [base_seed + sum(self.sizes[:c]) for c in range(num_chunks)]
        self.obs: list[Obs | None] = [None] * num_chunks

    def spaces(self) -> tuple[Any, Any]:
        return self.envs[0].observation_space, self.envs[0].action_space

    def interact(self, num_steps: int, obs_channel: Channel, action_channel: Channel) -> dict[str, Any]:
        """Run ``num_steps`` decisions of every chunk (one env step each, or an action chunk of
        ``policy.action_chunk`` steps through ``chunk_step``); returns the episodes that finished,
        the seconds spent simulating and the env steps taken."""
        episodes: list[dict[str, float]] = []
        sim_s = 0.0
        env_steps = 0
        chunked = self.cfg.policy.action_chunk > 1
        keys = [self.rank * self.num_chunks + c for c in range(self.num_chunks)]
        for c, env in enumerate(self.envs):
            if self.obs[c] is None:
                t0 = time.perf_counter()
                self.obs[c] = env.reset(seed=self.seeds[c])
                sim_s += time.perf_counter() - t0
            obs_channel.put(keys[c], EnvOutput(self.obs[c]))
        for _ in range(num_steps):
            for c, env in enumerate(self.envs):
                actions = action_channel.get(keys[c])
                t0 = time.perf_counter()
                res = env.chunk_step(actions) if chunked else env.step(actions)
                sim_s += time.perf_counter() - t0
                if chunked:
                    valid = to_numpy(res.valid).astype(bool)
                    env_steps += int(valid.sum())
                    out = EnvOutput(res.obs, to_numpy(res.rewards), to_numpy(res.terminated), to_numpy(res.truncated),
                                    res.final_obs, valid)
                else:
                    env_steps += env.num_envs
                    out = EnvOutput(res.obs, to_numpy(res.reward), to_numpy(res.terminated), to_numpy(res.truncated), res.final_obs)
                self.obs[c] = res.obs
                episodes.extend(res.episodes.finished())
                obs_channel.put(keys[c], out)
        return {"episodes": episodes, "sim_s": sim_s, "env_steps": env_steps}

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


class _Trajectory:
    """Per-chunk buffers of one iteration, time-major."""

    def __init__(self) -> None:
        self.obs: list[Obs] = []
        self.actions: list[np.ndarray] = []
        self.logprobs: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.rewards: list[np.ndarray] = []
        self.terminated: list[np.ndarray] = []
        self.truncated: list[np.ndarray] = []
        self.final_values: list[np.ndarray] = []
        self.last_values: np.ndarray | None = None

    def stacked(self) -> dict[str, Any]:
        return {
            "obs": {k: np.stack([o[k] for o in self.obs]) for k in self.obs[0]},  # (T, Bc, ...)
            "actions": np.stack(self.actions),
            "logprobs": np.stack(self.logprobs),
            "values": np.stack(self.values),
            "rewards": np.stack(self.rewards),
            "terminated": np.stack(self.terminated),
            "truncated": np.stack(self.truncated),
            "final_values": np.stack(self.final_values),
            "last_values": self.last_values,
        }


def concat_batches(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate trajectory batches along the env axis (axis 1 of (T, B, ...); axis 0 of last_values)."""
    out: dict[str, Any] = {}
    for k, v in batches[0].items():
        if isinstance(v, dict):
            out[k] = {kk: np.concatenate([b[k][kk] for b in batches], axis=1) for kk in v}
        elif k == "last_values":
            out[k] = np.concatenate([b[k] for b in batches], axis=0)
        else:
            out[k] = np.concatenate([b[k] for b in batches], axis=1)
    return out


class RolloutWorker(Worker):
    """Runs policy inference for the env chunks it owns and assembles their trajectories."""

    def __init__(
        self, cfg: TrainConfig, observation_space: Any, action_space: Any, num_chunks: int, pinning: Pinning | None = None
    ) -> None:
        seed_everything(cfg.seed + 7919 * (self.rank + 1))
        self.cfg = cfg
        self.device = resolve_device(cfg.workers.rollout_device)
        self.policy = build_policy(cfg.policy, observation_space, action_space).to(self.device).eval()
        self.version = -1
        low = getattr(action_space, "low", None)
        self.action_low = None if low is None else np.asarray(action_space.low, np.float32)
        self.action_high = None if low is None else np.asarray(action_space.high, np.float32)
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads))

    def configure(self, num_chunks: int, pinning: Pinning) -> None:
        """Serve the keys of ``num_chunks`` chunks per env worker, pinned as ``placement`` says."""
        pinning.apply()
        total_keys = self.cfg.workers.env * num_chunks
        self.keys = [k for k in range(total_keys) if k % self.world_size == self.rank]

    def load_weights(self, payload: dict[str, Any]) -> int:
        state = {k: torch.as_tensor(np.array(v)) for k, v in payload["state"].items()}
        self.policy.load_state_dict(state)
        self.version = int(payload["version"])
        return self.version

    @torch.no_grad()
    def _values(self, obs: Obs) -> np.ndarray:
        return self.policy.value(to_torch(obs, self.device)).float().cpu().numpy()

    def _record(self, traj: _Trajectory, out: EnvOutput) -> None:
        """Complete the previous transition of this chunk with the env's reward and dones (for an
        action chunk: its discounted reward and how it ended, see :func:`chunk_transition`)."""
        assert out.reward is not None and out.terminated is not None and out.truncated is not None
        algo = self.cfg.algo
        reward, terminated, truncated = out.reward, out.terminated.astype(bool), out.truncated.astype(bool)
        steps = None
        if out.valid is not None:
            reward, terminated, truncated, steps = chunk_transition(reward, terminated, truncated, out.valid, algo.gamma)
        traj.rewards.append(reward.astype(np.float32) * algo.reward_scale)
        traj.terminated.append(terminated)
        traj.truncated.append(truncated)
        final_values = np.zeros(len(reward), np.float32)
        bootstrap = bootstraps(terminated, truncated, algo)
        if bootstrap.any() and out.final_obs is not None:
            rows = np.flatnonzero(bootstrap)
            final_values[rows] = self._values({k: v[rows] for k, v in out.final_obs.items()})
            if steps is not None:  # cut short after steps[rows] of the chunk's C steps
                final_values[rows] *= bootstrap_scale(steps[rows], out.valid.shape[1], algo.gamma)
        traj.final_values.append(final_values)

    @torch.no_grad()
    def _act(self, obs: Obs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        out = self.policy.act(to_torch(obs, self.device))
        actions = out.actions.cpu().numpy()
        env_actions = actions
        if self.action_low is not None:
            env_actions = np.clip(actions, self.action_low, self.action_high)
        return actions, env_actions, out.logprobs.float().cpu().numpy(), out.values.float().cpu().numpy()

    def generate(self, num_steps: int, obs_channel: Channel, action_channel: Channel, traj_channel: Channel) -> dict[str, Any]:
        if self.version < 0:
            raise RuntimeError("generate() before load_weights(): the rollout has no policy weights")
        infer_s = 0.0
        trajs = {k: _Trajectory() for k in self.keys}
        for t in range(num_steps + 1):
            for key in self.keys:
                out: EnvOutput = obs_channel.get(key)
                t0 = time.perf_counter()
                traj = trajs[key]
                if t > 0:
                    self._record(traj, out)
                if t < num_steps:
                    actions, env_actions, logprobs, values = self._act(out.obs)
                    action_channel.put(key, env_actions)
                    traj.obs.append(out.obs)
                    traj.actions.append(actions)
                    traj.logprobs.append(logprobs)
                    traj.values.append(values)
                else:
                    traj.last_values = self._values(out.obs)
                infer_s += time.perf_counter() - t0
        batch = concat_batches([trajs[k].stacked() for k in self.keys])
        batch["version"] = self.version
        traj_channel.put(0, batch)
        return {"infer_s": infer_s, "version": self.version}


class TrainerWorker(Worker):
    """Holds the trainable policy and its optimizer; runs PPO on the collected trajectories."""

    def __init__(
        self, cfg: TrainConfig, observation_space: Any, action_space: Any, pinning: Pinning | None = None, offload: bool = False
    ) -> None:
        seed_everything(cfg.seed)
        self.cfg = cfg
        self.device = resolve_device(cfg.workers.trainer_device)
        self.policy = build_policy(cfg.policy, observation_space, action_space).to(self.device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.algo.lr, eps=1e-5)
        self.version = 0
        self.offloader = Offloader(self.policy, self.optimizer)
        self.configure(pinning or Pinning(None, cfg.workers.trainer_threads), offload)

    def configure(self, pinning: Pinning, offload: bool) -> None:
        """Pin the trainer; with ``offload`` its weights, gradients and optimizer state leave the
        device between training phases (context switching for colocated plans)."""
        pinning.apply()
        self.offload_between_phases = offload
        if offload and not self.offloader.is_offloaded:
            self.offloader.offload()
        elif not offload and self.offloader.is_offloaded:
            self.offloader.onload()

    def export_weights(self) -> dict[str, Any]:
        """The policy weights as numpy arrays (zero-copy through Ray) with their version."""
        state = {k: v.detach().cpu().numpy() for k, v in self.policy.state_dict().items()}
        return {"version": self.version, "state": state}

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint needs: model and optimizer tensors, version."""
        return {
            "model": {k: v.detach().cpu() for k, v in self.policy.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
        }

    def load_state(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any], version: int) -> None:
        self.policy.load_state_dict(model)
        self.optimizer.load_state_dict(optimizer)
        self.version = version

    def train(self, traj_channel: Channel, num_batches: int, lr: float) -> dict[str, float]:
        batches = traj_channel.get_batch(0, num_batches)
        versions = sorted({b["version"] for b in batches})
        lag = self.version - versions[0]
        if len(versions) > 1 or not 0 <= lag <= self.cfg.algo.staleness:
            raise RuntimeError(
                f"stale trajectories: rollout used weights version(s) {versions}, the trainer is at "
                f"version {self.version} and algo.staleness={self.cfg.algo.staleness}; weight sync did not "
                "reach every rollout rank"
            )
        t0 = time.perf_counter()
        switch: dict[str, float] = {}
        if self.offloader.is_offloaded:
            moved = self.offloader.onload()
            switch = {"offload/onload_s": moved.seconds, "offload/bytes": float(moved.bytes_moved)}
        data = concat_batches([{k: v for k, v in b.items() if k != "version"} for b in batches])
        data["action_chunk"] = self.cfg.policy.action_chunk
        stats = ppo_update(self.policy, self.optimizer, data, self.cfg.algo, lr, self.device)
        self.version += 1
        if self.offload_between_phases:
            switch["offload/offload_s"] = self.offloader.offload().seconds
        stats.update(switch)
        stats["time/train_s"] = time.perf_counter() - t0
        stats["weights/lag"] = float(lag)
        return stats
