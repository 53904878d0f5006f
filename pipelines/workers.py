"""The workers of the embodied macro flow: EnvWorker -> RolloutWorker -> TrainerWorker.

Message protocol per iteration (k = env micro-chunks per env worker, T = decisions), on which the
planner's simulation of a timeline is based:

* EnvWorker rank e, chunk c (key ``e * k + c``): sends the chunk's current observation (after a
  reset in groups for GRPO, with the group ids), then T times receives actions, steps the chunk's
  envs (one step, or ``chunk_step`` for action chunks) and sends an :class:`EnvOutput`. While chunk
  c waits for its actions, chunk c+1 is simulated: that is the pipelining.
* RolloutWorker: records each of its chunks with a :class:`TrajectoryRecorder` (acts on the first
  T observations, completes each decision with the env's output) and sends the chunk's
  :class:`TrajectoryBatch` (facts only) to the trainer.
* TrainerWorker: the algorithm (``algo.name``) derives advantages and updates the policy; its
  weights, with a version number, go to every rollout rank through the :class:`WeightSyncer`
  before the next iteration. A rollout tags its batch with the version it used; the trainer
  refuses stale ones.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.algorithms import build_algorithm, build_optimizer
from embodied.errors import EnvError
from embodied.offload import Offloader
from embodied.rl import TrajectoryBatch
from embodied.runtime import Channel, Worker
from embodied.runtime.weights import WeightPayload, WeightSyncer
from embodied.seeding import RngStream, seed_everything
from envs.base import to_numpy
from envs.nonfinite import NONFINITE_INFO_KEY
from envs.registry import make_vec_env
from pipelines.collect import EnvOutput, TrajectoryRecorder, env_output, resolve_device, with_instructions
from pipelines.config import EmbodiedConfig
from policies.registry import build_policy
from scheduler import chunk_sizes


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


def group_seeds(cfg: EmbodiedConfig, first_env: int, count: int, iteration: int) -> tuple[list[int], np.ndarray]:
    """Reset seeds and group ids of envs ``first_env .. first_env + count - 1`` (global indices over
    all env workers) for a grouped iteration: the envs of a group (``algo.group_size`` consecutive
    envs) share one seed, so they start from one initial state; every iteration draws new ones."""
    G = cfg.algo.group_size
    groups_total = cfg.workers.env * cfg.env.num_envs // G
    ids = (first_env + np.arange(count)) // G
    seeds = [cfg.seed + 1_000_003 + iteration * groups_total + int(g) for g in ids]
    return seeds, ids.astype(np.int64)


class EnvWorker(Worker):
    """Steps ``env.num_envs`` envs split into ``num_chunks`` independently stepped chunks."""

    def __init__(self, cfg: EmbodiedConfig, num_chunks: int, pinning: Pinning | None = None, grouped: bool = False) -> None:
        self.cfg = cfg
        self.grouped = grouped
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
        offsets = [sum(self.sizes[:c]) for c in range(num_chunks)]  # first env of each chunk in this worker
        self.first = [self.rank * cfg.env.num_envs + o for o in offsets]  # ... over all env workers
        self.seeds = [cfg.seed + 1000 * self.rank + o for o in offsets]
        procs = len(pinning.cores) if pinning.cores is not None else cfg.env.num_procs
        self.envs = []
        self.instructions: list[np.ndarray | None] = []
        for size, seed in zip(self.sizes, self.seeds):
            env_cfg = dataclasses.replace(cfg.env, num_envs=size, num_procs=min(procs, size) if procs else 0)
            env = make_vec_env(env_cfg, seed=seed)
            self.envs.append(env)
            self.instructions.append(None if env.instructions is None else np.asarray(env.instructions, dtype=str))
        self.obs: list[Any] = [None] * num_chunks

    def spaces(self) -> tuple[Any, Any]:
        return self.envs[0].observation_space, self.envs[0].action_space

    def interact(self, num_steps: int, obs_channel: Channel, action_channel: Channel, iteration: int = 0) -> dict[str, Any]:
        """Run ``num_steps`` decisions of every chunk; returns the episodes that finished, the
        seconds spent simulating, the env steps taken and the episodes ``env.nonfinite=drop``
        ended (whose last step is not counted). Grouped (GRPO): every chunk first resets its envs
        in groups (see :func:`group_seeds`). An env's failure names its index over all env workers."""
        self._current_chunk = 0
        try:
            return self._interact(num_steps, obs_channel, action_channel, iteration)
        except EnvError as err:  # a chunk's VecEnv counts its envs from 0: name the env over all env workers
            if "env_index" in err.where:
                err.where["env_index"] += self.first[self._current_chunk]
            raise

    def _interact(self, num_steps: int, obs_channel: Channel, action_channel: Channel, iteration: int) -> dict[str, Any]:
        episodes: list[dict[str, float]] = []
        sim_s = 0.0
        env_steps = 0
        nonfinite = 0
        chunked = self.cfg.policy.action_chunk > 1
        keys = [self.rank * self.num_chunks + c for c in range(self.num_chunks)]
        for c, env in enumerate(self.envs):
            self._current_chunk = c
            group_ids = None
            if self.grouped:
                seeds, group_ids = group_seeds(self.cfg, self.first[c], env.num_envs, iteration)
                t0 = time.perf_counter()
                self.obs[c] = env.reset(seed=seeds)
                sim_s += time.perf_counter() - t0
            elif self.obs[c] is None:
                t0 = time.perf_counter()
                self.obs[c] = env.reset(seed=self.seeds[c])
                sim_s += time.perf_counter() - t0
            obs_channel.put(keys[c], EnvOutput(with_instructions(self.obs[c], self.instructions[c]), group_ids=group_ids))
        active = list(range(self.num_chunks))
        for _ in range(num_steps):
            for c in list(active):
                env = self.envs[c]
                actions = action_channel.get(keys[c])
                if actions is None:  # the rollout needs no more steps of this chunk (GRPO: episodes over)
                    active.remove(c)
                    continue
                self._current_chunk = c
                t0 = time.perf_counter()
                res = env.chunk_step(actions) if chunked else env.step(actions)
                sim_s += time.perf_counter() - t0
                out = env_output(res, self.instructions[c])
                dropped = res.info.get(NONFINITE_INFO_KEY)
                lost = 0 if dropped is None else int(to_numpy(dropped).sum())
                nonfinite += lost
                env_steps += int(out.valid.sum()) - lost  # a dropped episode's last step is not a real one
                self.obs[c] = res.obs
                episodes.extend(res.episodes.finished())
                obs_channel.put(keys[c], out)
        return {"episodes": episodes, "sim_s": sim_s, "env_steps": env_steps, "nonfinite_episodes": nonfinite}

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


class RolloutWorker(Worker):
    """Runs policy inference for the env chunks it owns and records their trajectories."""

    def __init__(
        self, cfg: EmbodiedConfig, observation_space: Any, action_space: Any, num_chunks: int,
        pinning: Pinning | None = None, record_values: bool = True, episodic: bool = False,
    ) -> None:
        """``record_values``: record the critic's values (critic-based algorithms). ``episodic``:
        each iteration needs one episode per env (GRPO): a chunk stops stepping once every env's
        first episode has ended, and its batch is padded with invalid decisions."""
        self.cfg = cfg
        self.episodic = episodic
        self.device = resolve_device(cfg.workers.rollout_device)
        self.policy = build_policy(cfg.policy, observation_space, action_space).to(self.device).eval()
        self.syncer = WeightSyncer()
        self.version = -1
        self.rng = RngStream(cfg.seed + 7919 * (self.rank + 1), self.device)
        self.record_values, self.action_space = record_values, action_space
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads))

    def configure(self, num_chunks: int, pinning: Pinning) -> None:
        """Serve the keys of ``num_chunks`` chunks per env worker, pinned as ``pinning`` says."""
        pinning.apply()
        total_keys = self.cfg.workers.env * num_chunks
        self.keys = [k for k in range(total_keys) if k % self.world_size == self.rank]
        self.recorders = {k: TrajectoryRecorder(self.policy, self.device, self.record_values, self.action_space, self.rng)
                          for k in self.keys}

    def load_weights(self, payload: WeightPayload) -> int:
        self.version = self.syncer.load(self.policy, payload)
        return self.version

    def generate(self, num_steps: int, obs_channel: Channel, action_channel: Channel, traj_channel: Channel) -> dict[str, Any]:
        if self.version < 0:
            raise RuntimeError("generate() before load_weights(): the rollout has no policy weights")
        infer_s = 0.0
        recorders = self.recorders
        active = list(self.keys)
        for t in range(num_steps + 1):
            for key in list(active):
                out: EnvOutput = obs_channel.get(key)
                t0 = time.perf_counter()
                rec = recorders[key]
                if t == 0:
                    rec.begin(out)
                else:
                    rec.observe(out)
                if t < num_steps:
                    if self.episodic and rec.first_episodes_done():
                        action_channel.put(key, None)  # stop the chunk: its episodes are all over
                        active.remove(key)
                    else:
                        action_channel.put(key, rec.act())
                infer_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = TrajectoryBatch.concat([recorders[k].finish(self.version, num_steps) for k in self.keys])
        infer_s += time.perf_counter() - t0
        traj_channel.put(0, batch)
        return {"infer_s": infer_s, "version": self.version}


class TrainerWorker(Worker):
    """Holds the trainable policy, its optimizer and the algorithm; trains on collected batches."""

    def __init__(
        self, cfg: EmbodiedConfig, observation_space: Any, action_space: Any, pinning: Pinning | None = None,
        offload: bool = False,
    ) -> None:
        seed_everything(cfg.seed)
        self.cfg = cfg
        self.device = resolve_device(cfg.workers.trainer_device)
        self.policy = build_policy(cfg.policy, observation_space, action_space).to(self.device)
        self.algorithm = build_algorithm(cfg.algo)
        if self.algorithm.needs_critic and not self.policy.has_critic:
            from embodied.errors import UserError

            raise UserError(f"algo.name={cfg.algo.name} needs a critic, and policy {cfg.policy.name!r} was built without "
                            "one; use algo.name=grpo or a policy with a value head.")
        self.reference = copy.deepcopy(self.policy).eval().requires_grad_(False) if self.algorithm.needs_reference else None
        self.optimizer = build_optimizer(self.policy.parameters(), cfg.algo)
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)  # minibatch shuffles
        self.syncer = WeightSyncer()
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

    def export_weights(self) -> WeightPayload:
        """The weights the rollout needs (trainable ones only when the rest is frozen), versioned."""
        return self.syncer.export(self.policy, self.version)

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint needs: the tensors that training changes, optimizer, version,
        and the shuffle generator's state."""
        return {
            "model": {k: v.detach().cpu() for k, v in self.syncer.tensors(self.policy).items()},
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "generator": self.generator.get_state(),
        }

    def load_state(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any] | None, version: int,
                   generator: torch.Tensor | None = None) -> None:
        missing, unexpected = self.policy.load_state_dict(model, strict=False)
        trainable = set(self.syncer.tensors(self.policy))
        if unexpected or trainable & set(missing):
            raise ValueError(f"checkpoint does not fit the policy: missing {sorted(trainable & set(missing))}, "
                             f"unexpected {sorted(unexpected)}")
        if optimizer is not None:
            self.optimizer.load_state_dict(optimizer)
        if generator is not None:
            self.generator.set_state(generator)
        self.version = version

    def train(self, traj_channel: Channel, num_batches: int, lr: float) -> dict[str, float]:
        batches: list[TrajectoryBatch] = traj_channel.get_batch(0, num_batches)
        versions = sorted({b.version for b in batches})
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
        self.policy.train()
        stats = self.algorithm.update(self.policy, self.optimizer, TrajectoryBatch.concat(batches), lr,
                                      generator=self.generator, reference=self.reference, device=self.device)
        self.version += 1
        if self.offload_between_phases:
            switch["offload/offload_s"] = self.offloader.offload().seconds
        stats.update(switch)
        stats["time/train_s"] = time.perf_counter() - t0
        stats["weights/lag"] = float(lag)
        return stats
