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
* TrainerWorker (``workers.trainer`` data-parallel ranks; the rollout sends every rank the whole
  batch on key ``rank``): the algorithm (``algo.name``) derives advantages and updates the
  policy; rank 0's weights, with a version number, go to every rollout rank through the
  :class:`WeightSyncer` before the next iteration. A rollout tags its batch with the version it used; the trainer
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
from embodied.errors import EnvError, UserError
from embodied.offload import Offloader
from embodied.rl import TrajectoryBatch
from embodied.runtime import Channel, Worker
from embodied.runtime.distributed import (
    BACKENDS,
    SINGLE,
    DataParallel,
    Rendezvous,
    build_parallel,
    join_process_group,
    node_address,
)
from embodied.runtime.weights import WeightPayload, WeightSyncer, export_tensors
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


Pinnings = Pinning | tuple[Pinning, ...]
"""One pinning for every rank of a group, or one per rank (a layout's ranks own different cores)."""


def own(pinning: Pinnings, rank: int) -> Pinning:
    """The pinning of ``rank`` among ``pinning``."""
    return pinning[rank] if isinstance(pinning, tuple) else pinning


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
    """Steps ``env.num_envs`` envs split into ``num_chunks`` independently stepped chunks (a
    ``streams`` plan: ``split`` ranks step one configured worker's ``env.num_envs`` envs between them)."""

    def __init__(self, cfg: EmbodiedConfig, num_chunks: int, pinning: Pinnings | None = None, grouped: bool = False,
                 split: int = 1) -> None:
        self.cfg = cfg
        self.grouped = grouped
        self.envs: list[Any] = []
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads), split)

    def configure(self, num_chunks: int, pinning: Pinnings, split: int = 1) -> None:
        """(Re)build the chunks' envs for a plan: ``num_chunks`` chunks, each stepping its envs in
        ``len(pinning.cores)`` processes pinned to those cores. Episodes restart. With ``split``
        ranks per configured env worker (a ``streams`` plan: one rank per stream) rank r steps part
        ``r % split`` of worker ``r // split``'s envs: an env keeps its index and seed whatever the split."""
        self.close()
        pinning = own(pinning, self.rank)
        pinning.apply()
        cfg = self.cfg
        worker, part = divmod(self.rank, split)  # the configured env worker this rank stands for, and its part
        parts = chunk_sizes(cfg.env.num_envs, split)
        base = sum(parts[:part])  # this rank's first env within the configured worker's
        self.num_chunks = num_chunks
        self.sizes = chunk_sizes(parts[part], num_chunks)
        offsets = [base + sum(self.sizes[:c]) for c in range(num_chunks)]  # first env of each chunk in the worker
        self.first = [worker * cfg.env.num_envs + o for o in offsets]  # ... over all env workers
        self.seeds = [cfg.seed + 1000 * worker + o for o in offsets]
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
        """Run ``num_steps`` decisions of every chunk; returns the episodes that finished (grouped:
        each env's first, the rollouts GRPO compares), the seconds spent simulating, the env steps
        taken and the episodes ``env.nonfinite=drop`` ended (whose last step is not counted). Grouped (GRPO): every chunk first resets its envs
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
        # grouped: the iteration's rollouts are each env's first episode; the ones that start after it
        # (auto-reset) are cut short by the next iteration's reset and trained on by nobody
        first = [np.ones(env.num_envs, bool) if self.grouped else None for env in self.envs]
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
                episodes.extend(res.episodes.finished(among=first[c]))
                if first[c] is not None:
                    first[c] &= ~to_numpy(res.episodes.done).astype(bool)
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
        pinning: Pinnings | None = None, record_values: bool = True, episodic: bool = False, offload: bool = False,
    ) -> None:
        """``record_values``: record the critic's values (critic-based algorithms). ``episodic``:
        each iteration needs one episode per env (GRPO): a chunk stops stepping once every env's
        first episode has ended, and its batch is padded with invalid decisions. ``offload``: see
        :meth:`configure`."""
        self.cfg = cfg
        self.episodic = episodic
        self.device = resolve_device(cfg.workers.rollout_device)
        self.policy = build_policy(cfg.policy, observation_space, action_space).to(self.device).eval()
        self.syncer = WeightSyncer()
        self.version = -1
        self.rng = RngStream(cfg.seed + 7919 * (self.rank + 1), self.device)
        self.record_values, self.action_space = record_values, action_space
        self.offloader = Offloader(self.policy)
        self.onload_s = 0.0
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads), offload)

    def configure(self, num_chunks: int, pinning: Pinnings, offload: bool = False) -> None:
        """Serve the keys of ``num_chunks`` chunks per env worker, pinned as ``pinning`` says.
        With ``offload`` (a plan that colocates the rollout with the trainer) the policy's weights
        leave the device after each collection and come back with the next weights."""
        own(pinning, self.rank).apply()
        self.offload_between_phases = offload
        if not offload and self.offloader.is_offloaded:
            self.offloader.onload()
        total_keys = self.cfg.workers.env * num_chunks
        self.keys = [k for k in range(total_keys) if k % self.world_size == self.rank]
        self.recorders = {k: TrajectoryRecorder(self.policy, self.device, self.record_values, self.action_space, self.rng)
                          for k in self.keys}

    def load_weights(self, payload: WeightPayload) -> int:
        if self.offloader.is_offloaded:  # the rollout's phase begins
            self.onload_s = self.offloader.onload().seconds
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
        for trainer_rank in range(traj_channel.num_ranks):  # every data-parallel trainer rank trains on all of it
            traj_channel.put(trainer_rank, batch)
        out = {"infer_s": infer_s, "version": self.version}
        if self.offload_between_phases:  # the rollout's phase ends: its weights leave the device
            out.update(onload_s=self.onload_s, offload_s=self.offloader.offload().seconds)
        return out


class TrainerWorker(Worker):
    """Holds the trainable policy, its optimizer and the algorithm; trains on collected batches.

    ``workers.trainer=N`` ranks are data parallel (:mod:`embodied.runtime.distributed`): after
    :meth:`rendezvous` on rank 0 and :meth:`join` on every rank they form a process group; each
    receives the whole batch, derives the same samples and shuffles, and trains on its block of
    every minibatch, gradients summed over ranks. Rank 0 speaks for the group: its weights go to
    the rollouts, its state into checkpoints (whole tensors, gathered under FSDP), so a run
    resumes onto any number of ranks.
    """

    def __init__(
        self, cfg: EmbodiedConfig, observation_space: Any, action_space: Any, pinning: Pinnings | None = None,
        offload: bool = False, micro_batch_size: int | None = None,
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
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)  # minibatch shuffles (alike on every rank)
        self.syncer = WeightSyncer()
        self.version = 0
        self.parallel: DataParallel = SINGLE
        self.rendezvous_: Rendezvous | None = None
        self.offloader = Offloader(self.policy, self.optimizer)
        self.configure(pinning or Pinning(None, cfg.workers.trainer_threads), offload, micro_batch_size)

    # --- the process group of the ranks ------------------------------------------------------------
    def rendezvous(self) -> tuple[str, int]:
        """(Rank 0) Open the store the ranks meet at; its ``(host, port)`` for :meth:`join`."""
        self.rendezvous_ = Rendezvous(node_address(), self.world_size, self.cfg.cluster.timeout_s)
        return self.rendezvous_.address

    def join(self, host: str, port: int) -> str:
        """Join the ranks' process group at ``host:port`` (every rank at once; gloo on CPU, NCCL on
        CUDA; every collective bounded by ``cluster.timeout_s``) and share the model as
        ``workers.trainer_strategy`` says. Returns the strategy's description."""
        join_process_group(host, port, self.rank, self.world_size, BACKENDS[self.device.type], self.cfg.cluster.timeout_s)
        self._check_offload(self.cfg.workers.trainer_strategy, self.offload_between_phases)
        self.parallel = build_parallel(self.cfg.workers.trainer_strategy, self.policy, self.device)
        if self.parallel.shards_optimizer():  # FSDP replaced the parameters: a new optimizer over the shards
            self.optimizer = build_optimizer(self.policy.parameters(), self.cfg.algo)
            self.offloader = Offloader(self.policy, self.optimizer)
        return self.parallel.describe()

    @staticmethod
    def _check_offload(strategy: str, offload: bool) -> None:
        if offload and strategy == "fsdp":
            raise UserError("workers.trainer_strategy=fsdp keeps the trainer's shards on its devices: offloading them "
                            "between phases is not supported. Drop trainer from plan.offload, or use "
                            "workers.trainer_strategy=ddp.")

    def configure(self, pinning: Pinnings, offload: bool, micro_batch_size: int | None = None) -> None:
        """Pin the trainer; with ``offload`` its weights, gradients and optimizer state leave the
        device between training phases (context switching for colocated plans). Each forward and
        backward pass takes at most ``micro_batch_size`` samples of this rank (``algo.micro_batch_size``
        when set, else the plan's ``train_microbatch`` over the ranks; None: whole blocks)."""
        own(pinning, self.rank).apply()
        self.algorithm = build_algorithm(dataclasses.replace(self.cfg.algo, micro_batch_size=micro_batch_size))
        self._check_offload(self.parallel.strategy, offload)
        self.offload_between_phases = offload
        if offload and not self.offloader.is_offloaded:
            self.offloader.offload()
        elif not offload and self.offloader.is_offloaded:
            self.offloader.onload()

    # --- weights and state -------------------------------------------------------------------------
    def export_weights(self) -> WeightPayload | None:
        """The weights the rollout needs (trainable ones only when the rest is frozen), versioned:
        rank 0's (the ranks hold the same weights); None on the other ranks. Every rank takes
        part (FSDP gathers the shards)."""
        if self.parallel.strategy != "fsdp":
            return self.syncer.export(self.policy, self.version) if self.rank == 0 else None
        names = set(self.syncer.tensors(self.policy))
        tensors = self.parallel.full_state(self.policy, names)
        if tensors is None:
            return None
        return export_tensors(tensors, self.version, trainable_only=len(names) < len(self.policy.state_dict()))

    def state(self) -> dict[str, Any] | None:
        """Everything a checkpoint needs (rank 0; None on the others, which take part under FSDP):
        the whole tensors that training changes, the optimizer state, version, and the shuffle
        generator's state; the same whatever the number of ranks."""
        names = set(self.syncer.tensors(self.policy))
        model = self.parallel.full_state(self.policy, names)
        optimizer = self.parallel.optimizer_state(self.policy, self.optimizer)
        if self.rank != 0:
            return None
        assert model is not None
        return {
            "model": {k: v.detach().cpu() for k, v in model.items()},
            "optimizer": optimizer,
            "version": self.version,
            "generator": self.generator.get_state(),
        }

    def load_state(self, model: dict[str, torch.Tensor], optimizer: dict[str, Any] | None, version: int,
                   generator: torch.Tensor | None = None) -> None:
        """Continue from a checkpoint (every rank loads the same whole state)."""
        missing, unexpected = self.parallel.load(self.policy, self.optimizer, model, optimizer)
        trainable = set(self.syncer.tensors(self.policy))
        if unexpected or trainable & set(missing):
            raise ValueError(f"checkpoint does not fit the policy: missing {sorted(trainable & set(missing))}, "
                             f"unexpected {sorted(unexpected)}")
        if generator is not None:
            self.generator.set_state(generator)
        self.version = version

    # --- training ----------------------------------------------------------------------------------
    def train(self, traj_channel: Channel, num_batches: int, lr: float) -> dict[str, float]:
        """Train on the ``num_batches`` batches of one collection (every rank receives all of them,
        on its own key of ``traj_channel``)."""
        batches: list[TrajectoryBatch] = traj_channel.get_batch(self.rank, num_batches)
        versions = sorted({b.version for b in batches})
        lag = self.version - versions[0]
        if len(versions) > 1 or not 0 <= lag <= self.cfg.algo.staleness:
            raise RuntimeError(
                f"stale trajectories: rollout used weights version(s) {versions}, the trainer is at "
                f"version {self.version} and algo.staleness={self.cfg.algo.staleness}; weight sync did not "
                "reach every rollout rank"
            )
        stats = self.update(TrajectoryBatch.concat(batches), lr)
        stats["weights/lag"] = float(lag)
        return stats

    def update(self, batch: TrajectoryBatch, lr: float) -> dict[str, float]:
        """One update of the algorithm on ``batch`` (on every rank at once), with the onload
        before and the offload after it when the trainer context-switches."""
        t0 = time.perf_counter()
        switch: dict[str, float] = {}
        if self.offloader.is_offloaded:
            moved = self.offloader.onload()
            switch = {"offload/onload_s": moved.seconds, "offload/bytes": float(moved.bytes_moved)}
        self.policy.train()
        stats = self.algorithm.update(self.policy, self.optimizer, batch, lr, generator=self.generator,
                                      reference=self.reference, device=self.device, parallel=self.parallel)
        self.version += 1
        if self.offload_between_phases:
            self.parallel.release()  # DDP's gradient buckets leave the device too
            switch["offload/offload_s"] = self.offloader.offload().seconds
        stats.update(switch)
        stats["time/train_s"] = time.perf_counter() - t0
        return stats
