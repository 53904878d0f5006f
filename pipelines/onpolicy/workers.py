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
* StreamWorker (a ``streams`` plan, one rank per stream): an EnvWorker's and a RolloutWorker's
  halves (:class:`EnvChunks`, :class:`Inference`) in one process, taking turns on the stream's
  chunk with no channel between them; it sends its batch to the trainer as a RolloutWorker does.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


class EnvChunks:
    """The env side of a rank: ``env.num_envs`` envs split into ``num_chunks`` independently stepped
    chunks (a ``streams`` plan: ``split`` ranks step one configured worker's ``env.num_envs`` envs
    between them). A plain object: :class:`EnvWorker` steps it through channels, a
    :class:`StreamWorker` in its own process. An env's failure names its index over all env workers."""

    def __init__(self, cfg: EmbodiedConfig, grouped: bool = False) -> None:
        self.cfg = cfg
        self.grouped = grouped
        self.envs: list[Any] = []

    def configure(self, rank: int, num_chunks: int, pinning: Pinning, split: int = 1) -> None:
        """(Re)build the chunks' envs of rank ``rank`` for a plan: ``num_chunks`` chunks, each stepping
        its envs in ``len(pinning.cores)`` processes pinned to those cores. Episodes restart. With
        ``split`` ranks per configured env worker (a ``streams`` plan: one rank per stream) rank r
        steps part ``r % split`` of worker ``r // split``'s envs: an env keeps its index and seed
        whatever the split."""
        self.close()
        pinning.apply()
        cfg = self.cfg
        worker, part = divmod(rank, split)  # the configured env worker this rank stands for, and its part
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

    @contextmanager
    def _naming(self, c: int) -> Iterator[None]:
        """A chunk's VecEnv counts its envs from 0: an :class:`EnvError` names the env over all env workers."""
        try:
            yield
        except EnvError as err:
            if "env_index" in err.where:
                err.where["env_index"] += self.first[c]
            raise

    def start(self, c: int, iteration: int) -> EnvOutput:
        """Chunk ``c``'s first observation of an iteration (chunk 0 starts the iteration's tallies).
        Grouped (GRPO): the chunk's envs are reset in groups (see :func:`group_seeds`); else an
        episode goes on from the last iteration."""
        if c == 0:
            self.episodes: list[dict[str, float]] = []
            self.sim_s, self.env_steps, self.nonfinite = 0.0, 0, 0
            self.decisions = [0] * self.num_chunks
            # grouped: the iteration's rollouts are each env's first episode; the ones that start after
            # it (auto-reset) are cut short by the next iteration's reset and trained on by nobody
            self.first_episode = [np.ones(env.num_envs, bool) if self.grouped else None for env in self.envs]
        env = self.envs[c]
        group_ids = None
        with self._naming(c):
            t0 = time.perf_counter()
            if self.grouped:
                seeds, group_ids = group_seeds(self.cfg, self.first[c], env.num_envs, iteration)
                self.obs[c] = env.reset(seed=seeds)
            elif self.obs[c] is None:
                self.obs[c] = env.reset(seed=self.seeds[c])
            self.sim_s += time.perf_counter() - t0
        return EnvOutput(with_instructions(self.obs[c], self.instructions[c]), group_ids=group_ids)

    def step(self, c: int, actions: np.ndarray) -> EnvOutput:
        """Step chunk ``c`` with one decision's ``actions`` (an action chunk for chunk policies)."""
        env = self.envs[c]
        with self._naming(c):
            t0 = time.perf_counter()
            res = env.chunk_step(actions) if self.cfg.policy.action_chunk > 1 else env.step(actions)
            self.sim_s += time.perf_counter() - t0
        self.decisions[c] += 1
        out = env_output(res, self.instructions[c])
        dropped = res.info.get(NONFINITE_INFO_KEY)
        lost = 0 if dropped is None else int(to_numpy(dropped).sum())
        self.nonfinite += lost
        self.env_steps += int(out.valid.sum()) - lost  # a dropped episode's last step is not a real one
        self.obs[c] = res.obs
        first = self.first_episode[c]
        self.episodes.extend(res.episodes.finished(among=first))
        if first is not None:
            first &= ~to_numpy(res.episodes.done).astype(bool)
        return out

    def tallies(self) -> dict[str, Any]:
        """The iteration so far: the episodes that finished (grouped: each env's first, the rollouts
        GRPO compares), the seconds spent simulating, the env steps taken, the episodes
        ``env.nonfinite=drop`` ended (whose last step is not counted) and the decisions each chunk
        took (fewer than asked where the rollout stopped it)."""
        return {"episodes": self.episodes, "sim_s": self.sim_s, "env_steps": self.env_steps,
                "nonfinite_episodes": self.nonfinite, "decisions": self.decisions}

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


class EnvWorker(Worker):
    """Steps its :class:`EnvChunks` with the actions that arrive over a channel."""

    def __init__(self, cfg: EmbodiedConfig, num_chunks: int, pinning: Pinnings | None = None, grouped: bool = False,
                 split: int = 1) -> None:
        self.chunks = EnvChunks(cfg, grouped)
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads), split)

    def configure(self, num_chunks: int, pinning: Pinnings, split: int = 1) -> None:
        """Rebuild the envs for a plan (:meth:`EnvChunks.configure`)."""
        self.chunks.configure(self.rank, num_chunks, own(pinning, self.rank), split)

    def spaces(self) -> tuple[Any, Any]:
        return self.chunks.spaces()

    def interact(self, num_steps: int, obs_channel: Channel, action_channel: Channel, iteration: int = 0) -> dict[str, Any]:
        """Run ``num_steps`` decisions of every chunk, pipelined: each chunk sends its observation
        and steps when its actions arrive (None: the rollout needs no more steps of the chunk);
        returns :meth:`EnvChunks.tallies`."""
        chunks = self.chunks
        keys = [self.rank * chunks.num_chunks + c for c in range(chunks.num_chunks)]
        for c in range(chunks.num_chunks):
            obs_channel.put(keys[c], chunks.start(c, iteration))
        active = list(range(chunks.num_chunks))
        for _ in range(num_steps):
            for c in list(active):
                actions = action_channel.get(keys[c])
                if actions is None:  # the rollout needs no more steps of this chunk (GRPO: episodes over)
                    active.remove(c)
                    continue
                obs_channel.put(keys[c], chunks.step(c, actions))
        return chunks.tallies()

    def close(self) -> None:
        self.chunks.close()


class Inference:
    """The rollout side of a rank: the policy at the synced weights, recording one
    :class:`TrajectoryRecorder` per chunk key it serves. A plain object: :class:`RolloutWorker`
    serves it over channels, a :class:`StreamWorker` in its own process.

    ``record_values``: record the critic's values (critic-based algorithms). ``episodic``: each
    iteration needs one episode per env (GRPO): a chunk stops stepping once every env's first
    episode has ended, and its batch is padded with invalid decisions.
    """

    def __init__(self, cfg: EmbodiedConfig, observation_space: Any, action_space: Any, rank: int,
                 record_values: bool = True, episodic: bool = False) -> None:
        self.cfg = cfg
        self.episodic = episodic
        self.device = resolve_device(cfg.workers.rollout_device)
        self.policy = build_policy(cfg.policy, observation_space, action_space).to(self.device).eval()
        self.syncer = WeightSyncer()
        self.version = -1
        self.rng = RngStream(cfg.seed + 7919 * (rank + 1), self.device)
        self.record_values, self.action_space = record_values, action_space
        self.offloader = Offloader(self.policy)
        self.onload_s = 0.0
        self.offload_between_phases = False
        self.keys: list[int] = []

    def configure(self, keys: list[int], offload: bool = False) -> None:
        """Serve chunk ``keys``. With ``offload`` (a plan that colocates the rollout with the
        trainer) the policy's weights leave the device after each collection and come back with
        the next weights."""
        self.offload_between_phases = offload
        if not offload and self.offloader.is_offloaded:
            self.offloader.onload()
        self.keys = list(keys)
        self.recorders = {k: TrajectoryRecorder(self.policy, self.device, self.record_values, self.action_space, self.rng)
                          for k in self.keys}

    def load_weights(self, payload: WeightPayload) -> int:
        if self.offloader.is_offloaded:  # the rollout's phase begins
            self.onload_s = self.offloader.onload().seconds
        self.version = self.syncer.load(self.policy, payload)
        return self.version

    def begin(self) -> None:
        """A collection begins."""
        if self.version < 0:
            raise RuntimeError("generate() before load_weights(): the rollout has no policy weights")
        self.infer_s = 0.0

    def decide(self, key: int, out: EnvOutput, t: int, num_steps: int) -> np.ndarray | None:
        """Record chunk ``key``'s env output of decision ``t`` (its first observation at t = 0) and
        return the env actions of decision ``t``; None after the last decision, or when the chunk
        needs no more steps (episodic: its first episodes are all over)."""
        with self.timed():
            rec = self.recorders[key]
            if t == 0:
                rec.begin(out)
            else:
                rec.observe(out)
            if t < num_steps and not (self.episodic and rec.first_episodes_done()):
                return rec.act()
            return None

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Count the block's seconds as the rollout's (``infer_s``): its inference and recording,
        and sending their results where a channel takes them."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.infer_s += time.perf_counter() - t0

    def finish(self, num_steps: int) -> TrajectoryBatch:
        """The collection's batch over every served chunk (``num_steps`` decisions, padded)."""
        with self.timed():
            return TrajectoryBatch.concat([self.recorders[k].finish(self.version, num_steps) for k in self.keys])

    def end(self) -> dict[str, Any]:
        """The collection ends: seconds of inference, the weights' version; with offloading the
        weights leave the device (and the seconds of both moves)."""
        out: dict[str, Any] = {"infer_s": self.infer_s, "version": self.version}
        if self.offload_between_phases:
            out.update(onload_s=self.onload_s, offload_s=self.offloader.offload().seconds)
        return out


def send_batch(traj_channel: Channel, batch: TrajectoryBatch) -> None:
    """Every data-parallel trainer rank trains on all of the batch (on its own key)."""
    for trainer_rank in range(traj_channel.num_ranks):
        traj_channel.put(trainer_rank, batch)


class RolloutWorker(Worker):
    """Runs policy inference for the env chunks it owns (:class:`Inference`) over channels."""

    def __init__(
        self, cfg: EmbodiedConfig, observation_space: Any, action_space: Any, num_chunks: int,
        pinning: Pinnings | None = None, record_values: bool = True, episodic: bool = False, offload: bool = False,
    ) -> None:
        """``record_values``, ``episodic``: see :class:`Inference`; ``offload``: :meth:`configure`."""
        self.cfg = cfg
        self.inference = Inference(cfg, observation_space, action_space, self.rank, record_values, episodic)
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads), offload)

    def configure(self, num_chunks: int, pinning: Pinnings, offload: bool = False) -> None:
        """Serve the keys of ``num_chunks`` chunks per env worker, pinned as ``pinning`` says
        (``offload``: :meth:`Inference.configure`)."""
        own(pinning, self.rank).apply()
        total_keys = self.cfg.workers.env * num_chunks
        self.inference.configure([k for k in range(total_keys) if k % self.world_size == self.rank], offload)

    def load_weights(self, payload: WeightPayload) -> int:
        return self.inference.load_weights(payload)

    def generate(self, num_steps: int, obs_channel: Channel, action_channel: Channel, traj_channel: Channel) -> dict[str, Any]:
        inference = self.inference
        inference.begin()
        active = list(inference.keys)
        for t in range(num_steps + 1):
            for key in list(active):
                actions = inference.decide(key, obs_channel.get(key), t, num_steps)
                if t < num_steps:
                    with inference.timed():  # what the pipeline pays for a decision includes sending it
                        action_channel.put(key, actions)
                    if actions is None:  # the env stops stepping the chunk
                        active.remove(key)
        send_batch(traj_channel, inference.finish(num_steps))
        return inference.end()


class StreamWorker(Worker):
    """One stream of a ``streams`` plan: its env chunk and the policy that acts in it in one
    process, pinned to the stream's cores, taking turns with no message between them (an
    :class:`EnvWorker` and a :class:`RolloutWorker` would pass every observation and action
    through a channel and switch processes on the core). Rank s steps part s of the configured
    env worker's envs (each keeping its index and seed) and sends its batch to the trainer."""

    def __init__(self, cfg: EmbodiedConfig, num_chunks: int, pinning: Pinnings | None = None, record_values: bool = True,
                 grouped: bool = False, offload: bool = False) -> None:
        pinning = pinning or Pinning(None, cfg.workers.rollout_threads)
        self.cfg = cfg
        self.chunks = EnvChunks(cfg, grouped)
        self.chunks.configure(self.rank, num_chunks, own(pinning, self.rank), self.world_size)
        observation_space, action_space = self.chunks.spaces()
        self.inference = Inference(cfg, observation_space, action_space, self.rank, record_values, episodic=grouped)
        self.inference.configure(self._keys(), offload)

    def _keys(self) -> list[int]:
        return [self.rank * self.chunks.num_chunks + c for c in range(self.chunks.num_chunks)]

    def configure(self, num_chunks: int, pinning: Pinnings, offload: bool = False) -> None:
        """Rebuild the envs (episodes restart) and serve their chunks, as ``pinning`` says."""
        self.chunks.configure(self.rank, num_chunks, own(pinning, self.rank), self.world_size)
        self.inference.configure(self._keys(), offload)

    def spaces(self) -> tuple[Any, Any]:
        return self.chunks.spaces()

    def load_weights(self, payload: WeightPayload) -> int:
        return self.inference.load_weights(payload)

    def collect(self, num_steps: int, traj_channel: Channel, iteration: int = 0) -> dict[str, Any]:
        """``num_steps`` decisions of every chunk, env and policy taking turns; sends the batch to
        the trainer and returns :meth:`EnvChunks.tallies` with :meth:`Inference.end`'s."""
        chunks, inference = self.chunks, self.inference
        inference.begin()
        keys = self._keys()
        outs = [chunks.start(c, iteration) for c in range(chunks.num_chunks)]
        active = list(range(chunks.num_chunks))
        for t in range(num_steps + 1):
            for c in list(active):
                actions = inference.decide(keys[c], outs[c], t, num_steps)
                if actions is None:
                    active.remove(c)
                    continue
                outs[c] = chunks.step(c, actions)
        send_batch(traj_channel, inference.finish(num_steps))
        return {**chunks.tallies(), **inference.end()}

    def close(self) -> None:
        self.chunks.close()


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
