"""The workers of the embodied macro flow: EnvWorker -> RolloutWorker -> TrainerWorker.

Message protocol per iteration (k = env micro-chunks per env worker, T = decisions), on which the
planner's simulation of a timeline is based:

* EnvWorker rank e, chunk c (key ``e * k + c``): sends the chunk's current observation (after a
  reset in groups for GRPO, with the group ids), then T times receives actions, steps the chunk's
  envs (one step, or ``chunk_step`` for action chunks) and sends an :class:`EnvOutput`. While chunk
  c waits for its actions, chunk c+1 is simulated: that is the pipelining (:meth:`EnvChunks.run`).
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
import time
from typing import Any

import numpy as np
import torch

from embodied.algorithms import build_algorithm, build_optimizer
from embodied.errors import UserError
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
from embodied.seeding import seed_everything
from pipelines.collect import EnvOutput, resolve_device
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.chunks import EnvChunks, Pinning, Pinnings, own
from pipelines.onpolicy.inference import Inference, send_batch
from policies.registry import build_policy


class BlockRoute:
    """Channel route for keys ``rank * block + chunk`` owned by ``rank`` (picklable)."""

    def __init__(self, block: int) -> None:
        self.block = block

    def __call__(self, key: int, num_ranks: int) -> int:
        return key // self.block


class ChannelPolicy:
    """The rollout at the other end of two channels, as an env rank's chunks see it
    (a :class:`~pipelines.onpolicy.chunks.ChunkPolicy`): chunk c is key ``keys[c]``."""

    def __init__(self, keys: list[int], obs_channel: Channel, action_channel: Channel) -> None:
        self.keys, self.obs_channel, self.action_channel = keys, obs_channel, action_channel

    def observe(self, c: int, out: EnvOutput) -> None:
        self.obs_channel.put(self.keys[c], out)

    def actions(self, c: int) -> np.ndarray | None:
        return self.action_channel.get(self.keys[c])


class LocalPolicy:
    """The policy in the env's own process (a :class:`~pipelines.onpolicy.chunks.ChunkPolicy`):
    each env output is recorded at once and the decision's actions wait for the next step."""

    def __init__(self, keys: list[int], inference: Inference) -> None:
        self.keys, self.inference = keys, inference
        self.next: dict[int, np.ndarray | None] = {}

    def observe(self, c: int, out: EnvOutput) -> None:
        self.next[c] = self.inference.decide(self.keys[c], out)

    def actions(self, c: int) -> np.ndarray | None:
        return self.next[c]


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
        keys = [self.rank * self.chunks.num_chunks + c for c in range(self.chunks.num_chunks)]
        return self.chunks.run(num_steps, iteration, ChannelPolicy(keys, obs_channel, action_channel))

    def close(self) -> None:
        self.chunks.close()


class RolloutWorker(Worker):
    """Runs policy inference for the env chunks it owns (:class:`Inference`) over channels."""

    def __init__(
        self, cfg: EmbodiedConfig, observation_space: Any, action_space: Any, num_chunks: int,
        pinning: Pinnings | None = None, record_values: bool = True, episodic: bool = False, offload: bool = False,
        turns: bool = False,
    ) -> None:
        """``record_values``, ``episodic``: see :class:`Inference`; ``offload``, ``turns``: :meth:`configure`."""
        self.cfg = cfg
        self.inference = Inference(cfg, observation_space, action_space, self.rank, record_values, episodic)
        self.configure(num_chunks, pinning or Pinning(None, cfg.workers.rollout_threads), offload, turns)

    def configure(self, num_chunks: int, pinning: Pinnings, offload: bool = False, turns: bool = False) -> None:
        """Serve the keys of ``num_chunks`` chunks per env worker, pinned as ``pinning`` says
        (``offload``: :meth:`Inference.configure`). ``turns``: take turns with the env, never
        deciding while it steps (a ``switch`` plan's GPU shared by env and rollout; :meth:`generate`)."""
        own(pinning, self.rank).apply()
        self.num_chunks, self.turns = num_chunks, turns
        total_keys = self.cfg.workers.env * num_chunks
        self.inference.configure([k for k in range(total_keys) if k % self.world_size == self.rank], offload)

    def load_weights(self, payload: WeightPayload) -> int:
        return self.inference.load_weights(payload)

    def generate(self, num_steps: int, obs_channel: Channel, action_channel: Channel, traj_channel: Channel) -> dict[str, Any]:
        """Decide ``num_steps`` times for every served chunk, send the batch to the trainer; returns
        :meth:`Inference.end`. Pipelined, each chunk is decided for as its env output arrives (the
        env steps chunk c+1 meanwhile); taking turns (:meth:`configure`), see :meth:`_decide_in_turns`."""
        inference = self.inference
        inference.begin(num_steps)
        if self.turns:
            self._decide_in_turns(num_steps, obs_channel, action_channel)
        else:
            self._decide_pipelined(num_steps, obs_channel, action_channel)
        send_batch(traj_channel, inference.finish())
        return inference.end()

    def _decide_pipelined(self, num_steps: int, obs_channel: Channel, action_channel: Channel) -> None:
        inference = self.inference
        active = list(inference.keys)
        for t in range(num_steps + 1):
            for key in list(active):
                actions = inference.decide(key, obs_channel.get(key))
                if t < num_steps:
                    with inference.timed():  # what the pipeline pays for a decision includes sending it
                        action_channel.put(key, actions)
                    if actions is None:  # the env stops stepping the chunk
                        active.remove(key)

    def _decide_in_turns(self, num_steps: int, obs_channel: Channel, action_channel: Channel) -> None:
        """Env and rollout one at a time, the order the planner's ``switch`` timeline has: once
        every chunk's first observation is in (the env's resets are over), chunk by chunk (chunk
        c: key ``e * k + c`` of every env rank e) decide for all its keys, send their actions, and
        wait for the chunk's next env outputs before deciding for another chunk. The env steps
        only with actions, so it steps while this rank waits and waits while it decides."""
        inference, k = self.inference, self.num_chunks
        outputs = {key: obs_channel.get(key) for key in inference.keys}  # key -> its env output to decide on
        chunks = [[key for key in inference.keys if key % k == c] for c in range(k)]
        for t in range(num_steps + 1):
            for keys in chunks:
                decided = {key: inference.decide(key, outputs.pop(key)) for key in keys if key in outputs}
                if t == num_steps:
                    continue
                with inference.timed():
                    for key, actions in decided.items():
                        action_channel.put(key, actions)  # None: the env stops stepping the chunk
                for key, actions in decided.items():
                    if actions is not None:
                        outputs[key] = obs_channel.get(key)  # the env has stepped it: the turn comes back


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
        self.inference.begin(num_steps)
        tallies = self.chunks.run(num_steps, iteration, LocalPolicy(self._keys(), self.inference))
        send_batch(traj_channel, self.inference.finish())
        return {**tallies, **self.inference.end()}

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
                                      reference=self.reference, device=self.device, parallel=self.parallel,
                                      update_index=self.version)
        self.version += 1
        if self.offload_between_phases:
            self.parallel.release()  # DDP's gradient buckets leave the device too
            switch["offload/offload_s"] = self.offloader.offload().seconds
        stats.update(switch)
        stats["time/train_s"] = time.perf_counter() - t0
        return stats
