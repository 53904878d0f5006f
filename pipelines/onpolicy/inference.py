"""The rollout side of a rank: the policy at the synced weights, recording the chunks it serves.

:class:`Inference` is a plain object. A :class:`~pipelines.onpolicy.workers.RolloutWorker` serves
it over channels, a :class:`~pipelines.onpolicy.workers.StreamWorker` in its own process; both send
the collection's batch to the trainer with :func:`send_batch`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from embodied.offload import Offloader
from embodied.rl import TrajectoryBatch
from embodied.runtime import Channel
from embodied.runtime.weights import WeightPayload, WeightSyncer
from embodied.seeding import RngStream
from pipelines.collect import EnvOutput, TrajectoryRecorder, resolve_device
from pipelines.config import EmbodiedConfig
from policies.registry import build_policy


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

    def begin(self, num_steps: int) -> None:
        """A collection of ``num_steps`` decisions per served chunk begins."""
        if self.version < 0:
            raise RuntimeError("generate() before load_weights(): the rollout has no policy weights")
        self.infer_s = 0.0
        self.infer_spans: list[tuple[float, float]] = []  # (start_s, end_s) of every decision
        self.num_steps = num_steps
        self.taken = dict.fromkeys(self.keys, 0)  # env outputs recorded per chunk key

    def decide(self, key: int, out: EnvOutput) -> np.ndarray | None:
        """Record chunk ``key``'s next env output (its first observation, then each step's) and
        return the env actions of its next decision; None after the last decision, or when the
        chunk needs no more steps (episodic: its first episodes are all over)."""
        with self.timed(span=True):
            rec, t = self.recorders[key], self.taken[key]
            self.taken[key] = t + 1
            if t == 0:
                rec.begin(out)
            else:
                rec.observe(out)
            if t < self.num_steps and not (self.episodic and rec.first_episodes_done()):
                return rec.act()
            return None

    @contextmanager
    def timed(self, span: bool = False) -> Iterator[None]:
        """Count the block's seconds as the rollout's (``infer_s``): its inference and recording,
        and sending their results where a channel takes them; ``span``: the block is a decision,
        whose ``(start_s, end_s)`` goes to ``infer_spans`` (:mod:`pipelines.onpolicy.spans`)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self.infer_s += t1 - t0
            if span:
                self.infer_spans.append((t0, t1))

    def finish(self) -> TrajectoryBatch:
        """The collection's batch over every served chunk (its decisions, padded to the collection's)."""
        with self.timed():
            return TrajectoryBatch.concat([self.recorders[k].finish(self.version, self.num_steps) for k in self.keys])

    def end(self) -> dict[str, Any]:
        """The collection ends: seconds of inference, the spans of the decisions, the weights'
        version; with offloading the weights leave the device (and the seconds of both moves)."""
        out: dict[str, Any] = {"infer_s": self.infer_s, "infer_spans": self.infer_spans, "version": self.version}
        if self.offload_between_phases:
            out.update(onload_s=self.onload_s, offload_s=self.offloader.offload().seconds)
        return out


def send_batch(traj_channel: Channel, batch: TrajectoryBatch) -> None:
    """Every data-parallel trainer rank trains on all of the batch (on its own key)."""
    for trainer_rank in range(traj_channel.num_ranks):
        traj_channel.put(trainer_rank, batch)
