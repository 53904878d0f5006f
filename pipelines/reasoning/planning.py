"""M2Flow for the reasoning workflow: profile rollout, reward and trainer, plan, predict.

    profile = profile_reasoning(cfg, prompts, cluster)   # measured on this machine, cached
    result = plan_reasoning(cfg, profile)                 # scheduler.plan with the reasoning kind

The planner's ``reasoning`` task graph (``scheduler/workflows.py``): per chunk c of whole prompts,
``rollout c`` generates its responses, ``reward c`` scores them and ``trainer epoch 0 c`` trains on
them as they arrive; later epochs run over the whole batch; then the weights sync. The runtime
matches it when every chunk holds whole minibatches, so the chunk counts tried are the divisors of
``algo.num_minibatches`` (up to ``plan.max_chunks``). Only the trainer offloads (the rollout
backend keeps its weights resident).

Probes, each at the sizes the plans use (k | num_minibatches chunks of n = B x G / k samples),
on one core and on all of them:

* rollout: the rollout backend's ``generate`` of n responses to real training prompts;
* reward: the verifiers on those responses (one process: no scaling over cores);
* trainer: the algorithm's update, one call per minibatch as the trainer streams them, on chunks
  of one and two minibatches of scored responses (cost per sample);
* weight sync: loading the trainer's payload into the backend; the message cost between two
  worker processes; one offload/onload of the trainer.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np
import torch

from embodied.algorithms import build_algorithm, build_optimizer
from embodied.config import to_dict
from embodied.offload import Offloader
from embodied.profiler import Probe, cache_key, hardware_fingerprint, load_cached, store_cached, time_call
from embodied.rl import TrajectoryBatch
from embodied.runtime import Cluster
from embodied.runtime.weights import WeightSyncer
from embodied.seeding import RngStream
from pipelines.planning import prefer_simple, probe_transfer
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.data import PromptRecord
from pipelines.reasoning.prompts import PromptReader, chunk_prompts
from pipelines.reasoning.rollout import ROLLOUT_BACKENDS
from pipelines.reasoning.samples import GeneratedChunk, score_chunk
from pipelines.reasoning.verifiers import RewardFunction
from pipelines.workflow import Layout, cpu_resources
from policies.registry import build_policy
from scheduler import (
    WEIGHT_SYNC,
    ComponentProfile,
    CostModel,
    PlanningError,
    PlanResult,
    Profile,
    Resources,
    Workflow,
    chunk_sizes,
    plan,
)
from scheduler.plans import MODES

MIB, GIB = 2**20, 2**30
#: components whose state may leave their devices between phases in this workflow
OFFLOADABLE = frozenset({"trainer"})


def resources_of(cfg: ReasoningConfig) -> Resources:
    return cpu_resources(cfg.cluster.num_cpus)


def workflow_of(cfg: ReasoningConfig) -> Workflow:
    """The macro flow as the planner sees it: B prompts x G responses, ``algo.epochs`` epochs."""
    return Workflow.reasoning(num_prompts=cfg.data.train_batch_size, group_size=cfg.algo.group_size,
                              train_epochs=cfg.algo.epochs)


def chunk_choices(cfg: ReasoningConfig) -> list[int]:
    """Chunk counts the runtime executes as planned: ``plan.chunks``, or every divisor of
    ``algo.num_minibatches`` up to ``plan.max_chunks`` (each chunk then carries whole minibatches)."""
    if cfg.plan.chunks is not None:
        return [cfg.plan.chunks]
    M = cfg.algo.num_minibatches
    return [k for k in range(1, min(M, cfg.plan.max_chunks) + 1) if M % k == 0]


def plan_reasoning(cfg: ReasoningConfig, profile: Profile) -> PlanResult:
    """The planner's ranked candidates over :func:`chunk_choices` (``plan.mode`` restricts the
    modes); the simplest plan within 2% of the fastest wins (:func:`pipelines.planning.prefer_simple`)."""
    workflow, resources = workflow_of(cfg), resources_of(cfg)
    mode = None if cfg.plan.mode == "auto" else cfg.plan.mode
    results, errors = [], []
    for k in chunk_choices(cfg):
        try:
            results.append(plan(workflow, profile, resources, force_mode=mode, force_chunks=k, keep=256))
        except PlanningError as err:
            errors.append(str(err))
    candidates = [(p, t) for r in results for p, t in r.candidates if set(p.offload) <= OFFLOADABLE]
    if not candidates:
        why = errors[0] if errors else "every plan that fits offloads the rollout or the reward, which this workflow cannot"
        raise PlanningError(why)
    candidates.sort(key=lambda pt: (round(pt[0].predicted_iteration_s, 9), pt[0].num_chunks, MODES.index(pt[0].mode),
                                    len(pt[0].offload)))
    merged = PlanResult(candidates[0][0], candidates[0][1], candidates, num_evaluated=sum(r.num_evaluated for r in results),
                        bound=results[0].bound)
    return prefer_simple(merged)


def predicted_component_s(cfg: ReasoningConfig, profile: Profile, layout: Layout) -> dict[str, float]:
    """Seconds each component works in one iteration under ``layout`` (the planner's costs)."""
    k = layout.num_chunks
    samples = [p * cfg.algo.group_size for p in chunk_sizes(cfg.data.train_batch_size, k)]
    cores = {c: len(layout.cores_of(c)) for c in ("rollout", "reward", "trainer")}
    rollout = sum(profile["rollout"].cost.time_s(n, cores["rollout"]) for n in samples)
    reward = sum(profile["reward"].cost.time_s(n, cores["reward"]) for n in samples)
    per_pass = sum(profile["trainer"].cost.time_s(n, cores["trainer"]) for n in samples)
    whole = profile["trainer"].cost.time_s(sum(samples), cores["trainer"])
    return {"rollout": rollout, "reward": reward, "trainer": per_pass + (cfg.algo.epochs - 1) * whole}


def measured_factors(cfg: ReasoningConfig, profile: Profile, layout: Layout, metrics: dict[str, Any]) -> dict[str, float]:
    """Measured / predicted working seconds of rollout, reward and trainer in one iteration."""
    predicted = predicted_component_s(cfg, profile, layout)
    measured = {"rollout": metrics.get("time/generate_s"), "reward": metrics.get("time/reward_s"),
                "trainer": metrics.get("time/train_s")}
    return {c: float(measured[c]) / predicted[c] for c in predicted
            if measured[c] is not None and measured[c] > 0 and predicted[c] > 0}


# ------------------------------------------------------------------------------------- profiling


def _setup_key(cfg: ReasoningConfig, backend: str) -> dict[str, Any]:
    """What a profile depends on besides the hardware."""
    algo = cfg.algo
    return {
        "policy": to_dict(cfg.policy),
        "sizes": [cfg.data.train_batch_size, algo.group_size, cfg.data.max_prompt_length, algo.num_minibatches,
                  cfg.plan.max_chunks],
        "algo": {k: getattr(algo, k) for k in ("loss_agg_mode", "use_kl_loss", "rollout_is", "micro_batch_size")},
        "reward": to_dict(cfg.reward),
        "data": [list(cfg.data.train_files), cfg.data.prompt_key],
        "rollout_backend": cfg.workers.rollout_backend,
        "backend": backend,
        "version": 1,
    }


def _sample_sizes(cfg: ReasoningConfig) -> list[int]:
    """Responses per rollout call for every chunk count the planner may choose (at least two
    sizes, so that fixed and per-sample costs separate)."""
    total = cfg.samples_per_iteration
    sizes = {max(chunk_sizes(cfg.data.train_batch_size, k)) * cfg.algo.group_size for k in chunk_choices(cfg)}
    sizes.add(max(cfg.algo.group_size, total // 2))
    return sorted(sizes)


def _threads(cores: int) -> list[int]:
    return sorted({1, cores})


def profile_reasoning(cfg: ReasoningConfig, prompts: list[PromptRecord], cluster: Cluster, force: bool = False,
                      log: Callable[[str], None] = print) -> Profile:
    """The measured profile of ``cfg``'s rollout, reward and trainer on this machine (cached per
    model, sizes and hardware). ``prompts``: training records to generate from."""
    resources = resources_of(cfg)
    cores = len(resources)
    key = cache_key(_setup_key(cfg, cluster.backend))
    if not force:
        cached = load_cached(key)
        if cached is not None:
            log(f"[m2flow] profile from cache ({key})")
            return Profile.from_dict(cached)
    log(f"[m2flow] profiling rollout, reward and trainer on {cores} cores ...")
    t_start = time.perf_counter()
    before = torch.get_num_threads()
    try:
        backend = ROLLOUT_BACKENDS.get(cfg.workers.rollout_backend)(cfg, torch.device("cpu"))
        reader = PromptReader(prompts, cfg.data.train_batch_size, cfg.seed)
        draws = reader.draws(0)
        G = cfg.algo.group_size
        rollout_probe = Probe("rollout")
        largest = None
        for size in _sample_sizes(cfg):
            chunk = chunk_prompts(draws[: size // G], 1)[0]
            for threads in _threads(cores):
                torch.set_num_threads(threads)
                rng = RngStream(cfg.seed)

                def generate() -> Any:
                    with rng:
                        return backend.generate([d.record.prompt for d in chunk.draws], samples=G)

                seconds = time_call(generate, warmup=1, repeats=3)
                rollout_probe.add(size, threads, seconds)
                log(f"  rollout {size:>5} responses on {threads} core(s): {seconds * 1e3:8.1f} ms/call")
            with RngStream(cfg.seed):
                largest = GeneratedChunk.of(chunk, backend.generate([d.record.prompt for d in chunk.draws], samples=G),
                                            G, cfg.data.max_prompt_length, backend.pad_token_id, 0, 0.0)
        assert largest is not None
        reward_probe, scored = _probe_reward(cfg, largest, log)
        trainer_probe, offload_s, onload_s, payload = _probe_trainer(cfg, scored, cores, log)
        load_s = time_call(lambda: backend.load_weights(payload), warmup=1, repeats=3)
        log(f"  weight sync: {payload.nbytes / MIB:.2f} MiB loaded in {load_s * 1e3:.1f} ms")
    finally:
        torch.set_num_threads(before)
    sample_mib = _sample_mib(largest)
    latency_s, s_per_mib = probe_transfer(cluster, sample_mib * len(largest), log)
    weights_mib = payload.nbytes / MIB
    kv_gib = backend.kv_cache_gib(cfg.data.max_prompt_length + cfg.max_new_tokens)
    profile = Profile(
        components={
            "rollout": ComponentProfile("rollout", rollout_probe.fit(), memory_gib=backend.weights_mib() / 1024,
                                        memory_per_item_gib=kv_gib, output_mib_per_item=sample_mib,
                                        weights_mib=weights_mib),
            "reward": ComponentProfile("reward", reward_probe.fit(), output_mib_per_item=8 / MIB),
            "trainer": ComponentProfile("trainer", trainer_probe.fit(), memory_gib=4 * weights_mib / 1024,
                                        offload_s=offload_s, onload_s=onload_s),
            WEIGHT_SYNC: ComponentProfile(WEIGHT_SYNC, _constant_cost(load_s)),
        },
        transfer_latency_s=latency_s,
        transfer_s_per_mib=s_per_mib,
        cross_process_messages=cluster.backend == "ray",
        meta={
            "key": key,
            "hardware": hardware_fingerprint(),
            "probes": {p.name: [list(s) for s in p.samples] for p in (rollout_probe, reward_probe, trainer_probe)},
            "profiling_s": time.perf_counter() - t_start,
        },
    )
    path = store_cached(key, profile.to_dict())
    log(f"[m2flow] profiled in {time.perf_counter() - t_start:.1f}s -> {path}")
    return profile


def _probe_reward(cfg: ReasoningConfig, chunk: GeneratedChunk, log: Callable[[str], None]) -> tuple[Probe, Any]:
    """Verifier seconds per call at the probe's sizes (one process: scaling exponent 0); returns the
    scored chunk too (the trainer probe trains on it)."""
    probe = Probe("reward", scaling_exponent=0.0)
    reward = RewardFunction(cfg.reward)
    try:
        scored = score_chunk(chunk, reward)
        for size in _sample_sizes(cfg):
            part = _take(chunk, size)
            seconds = time_call(lambda: score_chunk(part, reward), warmup=1, repeats=3)
            probe.add(size, 1, seconds)
            log(f"  reward  {size:>5} responses:             {seconds * 1e3:8.2f} ms/call")
    finally:
        reward.close()
    return probe, scored


def _take(chunk: GeneratedChunk, size: int) -> GeneratedChunk:
    """The first ``size`` responses of a chunk (whole groups when size is a multiple of G)."""
    def cut(x: Any) -> Any:
        return x[:size]

    return dataclasses.replace(
        chunk, uids=chunk.uids[: size // chunk.group_size], group_ids=cut(chunk.group_ids), ground_truths=cut(chunk.ground_truths), data_sources=cut(chunk.data_sources),
        texts=cut(chunk.texts), prompt_ids=cut(chunk.prompt_ids), prompt_mask=cut(chunk.prompt_mask),
        response_ids=cut(chunk.response_ids), logprobs=cut(chunk.logprobs), response_mask=cut(chunk.response_mask),
        truncated=cut(chunk.truncated),
    )


def _probe_trainer(cfg: ReasoningConfig, scored: Any, cores: int, log: Callable[[str], None]) -> tuple[Probe, float, float, Any]:
    """Seconds of the trainer's streamed updates (one ``update`` per minibatch) on chunks of one and
    two minibatches, per sample; one offload/onload; the weight payload of the trainer's policy."""
    probe = Probe("trainer")
    policy = build_policy(cfg.policy, None, None)
    optimizer = build_optimizer(policy.parameters(), cfg.algo)
    algorithm = build_algorithm(dataclasses.replace(cfg.algo, epochs=1, num_minibatches=1, target_kl=None))
    reference = policy if algorithm.needs_reference else None
    minibatch = cfg.data.train_batch_size // cfg.algo.num_minibatches * cfg.algo.group_size
    batch: TrajectoryBatch = scored.batch
    while batch.num_envs < 2 * minibatch:  # enough responses for two minibatches (repeats keep whole groups)
        batch = TrajectoryBatch.concat([batch, batch])
    for count in (1, 2):
        parts = [batch.select(np.arange(i * minibatch, (i + 1) * minibatch)) for i in range(count)]
        for threads in _threads(cores):
            torch.set_num_threads(threads)

            def update() -> None:
                for part in parts:
                    algorithm.update(policy, optimizer, part, cfg.algo.lr, reference=reference)

            seconds = time_call(update, warmup=1, repeats=3)
            probe.add(count * minibatch, threads, seconds)
            log(f"  trainer {count * minibatch:>5} responses on {threads} core(s): {seconds * 1e3:8.1f} ms "
                f"({count} minibatch update(s))")
    offloader = Offloader(policy, optimizer)
    offload_s = offloader.offload().seconds
    onload_s = offloader.onload().seconds
    return probe, offload_s, onload_s, WeightSyncer().export(policy, 0)


def _constant_cost(seconds: float) -> CostModel:
    return CostModel(fixed_s=seconds, per_item_s=0.0, scaling_exponent=0.0)


def _sample_mib(chunk: GeneratedChunk) -> float:
    """MiB one response takes in the rollout's message (token arrays and text)."""
    arrays = (chunk.prompt_ids, chunk.prompt_mask, chunk.response_ids, chunk.logprobs, chunk.response_mask)
    text = sum(len(t.encode()) for t in chunk.texts)
    return (sum(a.nbytes for a in arrays) + text) / len(chunk) / MIB

