"""The workers of the reasoning flow: RolloutWorker -> RewardWorker -> TrainerWorker.

Message protocol of one iteration with k chunks (each chunk a set of whole prompts, so whole GRPO
groups), which the planner's ``reasoning`` task graph models:

* RolloutWorker rank r generates ``algo.group_size`` responses to every prompt of its chunks
  (``c % ranks == r``), one batched ``generate`` per chunk, and puts each chunk on the
  ``generated`` channel (key c) as soon as it is generated.
* RewardWorker rank r takes its chunks (``c % ranks == r``) in order, runs the verifiers, and puts
  each scored chunk (a :class:`~embodied.rl.TrajectoryBatch`) on the ``scored`` channel.
* TrainerWorker takes the chunks in order c = 0 .. k-1. With ``algo.minibatch_mix=groups`` it
  trains each minibatch (whole prompts, ``data.train_batch_size / algo.num_minibatches`` of them)
  as soon as its chunks are in: the first epoch streams. Later epochs (``algo.epochs`` > 1) run
  over the whole batch, its responses shuffled across groups. With ``shuffled`` every epoch runs
  over the whole batch that way (TRL's minibatches), once every chunk is in. The minibatches are
  the same whatever the chunking, so the plan never changes the math. Its weights reach the
  rollout through the :class:`~embodied.runtime.weights.WeightSyncer` before the next iteration.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from embodied.algorithms import build_algorithm
from embodied.rl import TrajectoryBatch, should_stop_early
from embodied.runtime import Channel, Cluster, RankResources, Worker, WorkerGroup
from embodied.runtime.weights import WeightPayload
from embodied.seeding import RngStream
from pipelines.collect import resolve_device
from embodied.threads import thread_env
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.data import PromptRecord
from pipelines.reasoning.prompts import PromptChunk
from pipelines.reasoning.rollout import ROLLOUT_BACKENDS
from pipelines.reasoning.samples import GeneratedChunk, ScoredChunk, iteration_metrics, score_chunk
from pipelines.reasoning.verifiers import RewardFunction
from pipelines.onpolicy.workers import Pinning
from pipelines.onpolicy.workers import TrainerWorker as EmbodiedTrainerWorker


class RolloutWorker(Worker):
    """Generates the responses of its chunks with a rollout backend (``workers.rollout_backend``)."""

    def __init__(self, cfg: ReasoningConfig, pinning: Pinning | None = None) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.workers.rollout_device)
        self.backend = ROLLOUT_BACKENDS.get(cfg.workers.rollout_backend)(cfg, self.device)
        self.rng = RngStream(cfg.seed + 7919 * (self.rank + 1), self.device)  # this rank's sampling
        self.version = -1
        self.eval_reward = RewardFunction(dataclasses.replace(cfg.reward, overlong_buffer_len=0, mask_truncated=False))
        self.configure(pinning or Pinning(None, cfg.workers.rollout_threads))

    def configure(self, pinning: Pinning) -> None:
        pinning.apply()

    def load_weights(self, payload: WeightPayload) -> int:
        self.version = self.backend.load_weights(payload)
        return self.version

    def generate(self, chunks: list[PromptChunk], generated: Channel) -> dict[str, Any]:
        """Generate this rank's chunks in order, putting each on ``generated`` (key: chunk index)
        as soon as it is done. Returns the seconds spent generating and the tokens generated."""
        if self.version < 0:
            raise RuntimeError("generate() before load_weights(): the rollout has no policy weights")
        group, width = self.cfg.algo.group_size, self.cfg.data.max_prompt_length
        generate_s, tokens = 0.0, 0
        for chunk in chunks:
            if chunk.index % self.world_size != self.rank:
                continue
            t0 = time.perf_counter()
            with self.rng:
                gen = self.backend.generate([d.record.prompt for d in chunk.draws], samples=group)
            seconds = time.perf_counter() - t0
            generated.put(chunk.index, GeneratedChunk.of(chunk, gen, group, width, self.backend.pad_token_id,
                                                         self.version, seconds))
            generate_s += seconds
            tokens += int(gen.response_mask.sum())
        return {"generate_s": generate_s, "response_tokens": tokens, "version": self.version}

    def evaluate(self, records: list[PromptRecord], samples: int, batch_size: int, seed: int) -> dict[str, float]:
        """Held-out accuracy of the loaded weights: greedy (``eval/greedy_acc``) and, with
        ``samples`` > 0, the mean accuracy of that many sampled responses per problem
        (``eval/sampled_acc``, pass@1) and whether any was right (``eval/pass@N``)."""
        t0 = time.perf_counter()
        greedy = self._correct(records, 1, True, batch_size)
        out = {"eval/problems": float(len(records)), "eval/greedy_acc": float(greedy.mean())}
        if samples:
            with RngStream(seed, self.device):  # the same draws at every evaluation of a run
                sampled = self._correct(records, samples, False, batch_size).reshape(len(records), samples)
            out["eval/sampled_acc"] = float(sampled.mean())
            out[f"eval/pass@{samples}"] = float(sampled.any(axis=1).mean())
        out["eval/time_s"] = time.perf_counter() - t0
        return out

    def _correct(self, records: list[PromptRecord], samples: int, greedy: bool, batch_size: int) -> np.ndarray:
        """(len(records) * samples,) bool, prompt-major: which responses are right."""
        per_call = max(1, batch_size // samples)
        correct: list[bool] = []
        for begin in range(0, len(records), per_call):
            part = records[begin : begin + per_call]
            gen = self.backend.generate([r.prompt for r in part], samples=samples, greedy=greedy)
            golds = [r.ground_truth for r in part for _ in range(samples)]
            sources = [r.data_source for r in part for _ in range(samples)]
            correct.extend(res.acc for res in self.eval_reward(gen.texts, golds, sources).results)
        return np.asarray(correct, dtype=bool)

    def close(self) -> None:
        self.eval_reward.close()


class RewardWorker(Worker):
    """Runs the verifiers on generated chunks (``reward.*``; math-verify in its own process, so any
    thread of any worker may call it)."""

    def __init__(self, cfg: ReasoningConfig, pinning: Pinning | None = None) -> None:
        self.reward = RewardFunction(cfg.reward)
        (pinning or Pinning(None, 1)).apply()

    def configure(self, pinning: Pinning) -> None:
        pinning.apply()

    def score(self, num_chunks: int, generated: Channel, scored: Channel) -> dict[str, float]:
        """Score this rank's chunks in order as they arrive; each goes on ``scored`` at once."""
        reward_s = 0.0
        for index in range(num_chunks):
            if index % self.world_size != self.rank:
                continue
            chunk = score_chunk(generated.get(index), self.reward)
            scored.put(index, chunk)
            reward_s += chunk.reward_s
        return {"reward_s": reward_s}

    def close(self) -> None:
        self.reward.close()


class TrainerWorker(EmbodiedTrainerWorker):
    """The trainer of the embodied flow (policy, optimizer, weight export, checkpoints, offload)
    training the runtime's GRPO algorithm object on streamed minibatches of whole groups, or on
    the whole batch in minibatches shuffled across groups (``algo.minibatch_mix``)."""

    def __init__(self, cfg: ReasoningConfig, pinning: Pinning | None = None, offload: bool = False) -> None:
        super().__init__(cfg, None, None, pinning, offload)
        algo = cfg.algo
        # The algorithm object, unchanged: with whole groups, one call per streamed minibatch (one
        # optimizer step) in the first epoch; the remaining epochs (with shuffled minibatches, all
        # of them) in one call over the whole batch, whose algo.num_minibatches minibatches are
        # shuffled across groups and whose advantages come from whole groups.
        self.streams_first_epoch = algo.minibatch_mix == "groups"
        self.minibatch_algorithm = build_algorithm(dataclasses.replace(algo, epochs=1, num_minibatches=1))
        whole_batch_epochs = algo.epochs - 1 if self.streams_first_epoch else algo.epochs
        self.epochs_algorithm = (build_algorithm(dataclasses.replace(algo, epochs=whole_batch_epochs))
                                 if whole_batch_epochs else None)
        self.minibatch_samples = cfg.data.train_batch_size // algo.num_minibatches * algo.group_size

    def train(self, scored: Channel, num_chunks: int, lr: float) -> dict[str, Any]:
        """Train on the iteration's ``num_chunks`` scored chunks: with whole groups each minibatch
        as soon as its chunks are in, with shuffled minibatches once all are in (see the module
        docstring). Returns the iteration's response statistics
        (:func:`~pipelines.reasoning.samples.iteration_metrics`), the updates' means and timings."""
        cfg = self.cfg
        switch: dict[str, float] = {}
        train_s = wait_s = 0.0
        if self.offloader.is_offloaded:
            moved = self.offloader.onload()
            switch = {"offload/onload_s": moved.seconds, "offload/bytes": float(moved.bytes_moved)}
        self.policy.train()
        chunks: list[ScoredChunk] = []
        pending: TrajectoryBatch | None = None
        updates: list[tuple[int, dict[str, float]]] = []
        steps = 0
        stopped = False  # algo.target_kl reached: the rest of the iteration's updates are skipped
        for index in range(num_chunks):
            t0 = time.perf_counter()
            chunk: ScoredChunk = scored.get(index)
            wait_s += time.perf_counter() - t0
            self._check_version(chunk.batch.version)
            chunks.append(chunk)
            if not self.streams_first_epoch:
                continue
            pending = chunk.batch if pending is None else TrajectoryBatch.concat([pending, chunk.batch])
            while pending is not None and pending.num_envs >= self.minibatch_samples:
                n = pending.num_envs
                minibatch = pending.select(np.arange(self.minibatch_samples))
                pending = pending.select(np.arange(self.minibatch_samples, n)) if n > self.minibatch_samples else None
                if stopped:
                    continue
                t0 = time.perf_counter()
                stats = self.minibatch_algorithm.update(self.policy, self.optimizer, minibatch, lr, generator=self.generator,
                                                        reference=self.reference, device=self.device)
                train_s += time.perf_counter() - t0
                updates.append((minibatch.num_envs, stats))
                steps += stats.get("losses/epochs", 0.0) > 0
                stopped = should_stop_early(stats.get("losses/approx_kl", 0.0), cfg.algo.target_kl)
        if pending is not None and pending.num_envs:
            raise RuntimeError(f"{pending.num_envs} samples left over: the chunks did not hold whole minibatches")
        passes = steps / cfg.algo.num_minibatches  # passes over the batch's tokens
        if self.epochs_algorithm is not None and not stopped:
            t0 = time.perf_counter()
            batch = TrajectoryBatch.concat([c.batch for c in chunks])
            stats = self.epochs_algorithm.update(self.policy, self.optimizer, batch, lr, generator=self.generator,
                                                 reference=self.reference, device=self.device)
            train_s += time.perf_counter() - t0
            epochs = stats.get("losses/epochs", 0.0)
            updates.append((int(batch.num_envs * epochs), stats))
            steps += int(epochs * cfg.algo.num_minibatches)
            passes += epochs
        self.version += 1
        if self.offload_between_phases:
            switch["offload/offload_s"] = self.offloader.offload().seconds
        tokens = sum(int(c.prompt_lengths.sum() + c.response_lengths.sum()) for c in chunks)
        return {
            **iteration_metrics(chunks),
            **merge_update_stats(updates),
            **switch,
            "losses/optimizer_steps": float(steps),
            "time/train_s": train_s,
            "time/train_wait_s": wait_s,
            "perf/trainer_tokens_per_s": tokens * passes / train_s if train_s > 0 else None,
            "reward_error_messages": [e for c in chunks for e in c.errors][:10],
        }

    def state(self) -> dict[str, Any]:
        """The checkpoint's tensors (see the embodied trainer); tied weights (a language model's input
        embedding and output head) become separate copies, as safetensors stores no shared memory."""
        state = super().state()
        seen: set[int] = set()
        for name, tensor in state["model"].items():
            storage = tensor.untyped_storage().data_ptr()
            if storage in seen:
                state["model"][name] = tensor.clone()
            seen.add(storage)
        return state

    def _check_version(self, version: int) -> None:
        if version != self.version:
            raise RuntimeError(f"stale responses: the rollout used weights version {version}, the trainer is at "
                               f"version {self.version}; weight sync did not reach every rollout rank")

    def score(self, batch: TrajectoryBatch) -> np.ndarray:
        """(n, K) float32: the logprobs the trainer's current weights give a batch's responses (what
        its first update's ratio compares with the rollout's), 0 outside the response mask."""
        batch = batch.to_torch(self.device)
        obs = {k: v[0] for k, v in batch.obs.items()}
        with torch.no_grad():
            return self.policy.evaluate(obs, batch.actions[0]).logprobs.float().cpu().numpy()


#: update statistics that add up over an iteration's updates (the others are sample-weighted means)
_SUMMED = ("charts/samples", "losses/non_finite_steps")


def merge_update_stats(updates: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The statistics of an iteration's algorithm updates as one set: counts summed, the rest
    averaged with each update's samples as weights (``charts/lr``: the last one's)."""
    if not updates:
        return {}
    out: dict[str, float] = {}
    weights: dict[str, float] = {}
    for weight, stats in updates:
        for key, value in stats.items():
            if key in ("charts/lr", "losses/epochs") or not isinstance(value, (int, float)):
                continue
            if key in _SUMMED:
                out[key] = out.get(key, 0.0) + float(value)
            else:
                out[key] = out.get(key, 0.0) + weight * float(value)
                weights[key] = weights.get(key, 0.0) + weight
    for key, weight in weights.items():
        out[key] = out[key] / weight if weight else float("nan")
    out["charts/lr"] = float(updates[-1][1].get("charts/lr", float("nan")))
    return out


def start_groups(cluster: Cluster, cfg: ReasoningConfig, pin: dict[str, Pinning], offload_trainer: bool,
                 prefix: str = "", rollout_cls: type[RolloutWorker] = RolloutWorker,
                 reward_cls: type[RewardWorker] = RewardWorker) -> tuple[WorkerGroup, WorkerGroup, WorkerGroup]:
    """The rollout, reward and trainer groups of ``cfg`` (``workers.*`` ranks, devices and Ray CPU
    reservations), each pinned as ``pin[component]`` says: what a run builds, and what the probes
    of ``pipelines/reasoning/planning.py`` time (``prefix``: a name prefix for their groups;
    ``rollout_cls``, ``reward_cls``: subclasses of :class:`RolloutWorker` and :class:`RewardWorker`
    to start instead, as the probes do)."""
    w = cfg.workers
    gpu = lambda device: 1.0 if device.startswith("cuda") else 0.0  # noqa: E731
    rollout = WorkerGroup(cluster, rollout_cls, w.rollout, cfg, pin["rollout"], name=f"{prefix}rollout",
                          resources=RankResources(w.rollout_cpus, gpu(w.rollout_device), thread_env(w.rollout_threads)))
    reward = WorkerGroup(cluster, reward_cls, w.reward, cfg, pin["reward"], name=f"{prefix}reward",
                         resources=RankResources(w.reward_cpus, 0.0, thread_env(1)))
    trainer = WorkerGroup(cluster, TrainerWorker, 1, cfg, pin["trainer"], offload_trainer, name=f"{prefix}trainer",
                          resources=RankResources(w.trainer_cpus, gpu(w.trainer_device), thread_env(w.trainer_threads)))
    return rollout, reward, trainer
