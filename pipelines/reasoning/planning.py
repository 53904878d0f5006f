"""M2Flow for the reasoning workflow: profile rollout, reward and trainer, plan, predict.

    profile = profile_reasoning(cfg, prompts, cluster)   # measured on this machine, cached
    result = plan_reasoning(cfg, profile)                 # scheduler.plan with the reasoning kind

The planner's ``reasoning`` task graph (``scheduler/flows.py``): per chunk c of whole prompts,
``rollout c`` generates its responses, ``reward c`` scores them and ``trainer epoch 0 c`` trains on
them as they arrive; later epochs run over the whole batch; then the weights sync. The runtime
matches it when every chunk holds whole minibatches, so the chunk counts tried are the divisors of
``algo.num_minibatches`` (up to ``plan.max_chunks``; only 1 with ``algo.minibatch_mix=shuffled``).
Only the trainer offloads (the rollout backend keeps its weights resident).

Probes (:func:`probe_workers`) time the workers a run builds, on their own calls, pinned as the
plans pin them: one thread each with generation on core 0 and the trainer on the last core (a
disaggregated plan), and a thread per core with all three on every core (a colocated plan, the idle
workers' processes next to the busy one); at the sizes the plans use (k | num_minibatches chunks
of n = B x G / k samples):

* rollout: the worker's ``generate`` of one chunk of n responses to real training prompts;
* reward: the worker's ``score`` of it (one process: no scaling over cores);
* trainer: the worker's ``train`` on it, one update per minibatch (chunks of whole minibatches);
* weight sync: the trainer's export and the rollout's load as the driver calls them (the message of
  the weights priced apart); the message cost between two worker processes; one offload/onload of
  the trainer through its own context switch.

Rollout and trainer are priced as their workers run them (:func:`pipelines.probes.fit_threads`:
one thread where more do not pay off).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import torch

from embodied.config import to_dict
from embodied.profiler import Probe, cache_key, load_cached
from embodied.runtime import Channel, Cluster, WorkerGroup, wait_all
from embodied.seeding import RngStream
from pipelines.onpolicy.planning import prefer_simple
from pipelines.probes import Echo, fit_threads, probe_transfer, store_profile
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.data import PromptRecord
from pipelines.reasoning.prompts import PromptDraw, PromptReader, chunk_prompts
from pipelines.reasoning.rollout import ROLLOUT_BACKENDS
from pipelines.reasoning.samples import GeneratedChunk
from pipelines.reasoning.workers import RewardWorker, RolloutWorker, TrainerWorker, start_groups
from pipelines.onpolicy.workers import Pinning
from pipelines.workflow import Layout, cpu_resources
from scheduler import (
    WEIGHT_SYNC,
    ComponentProfile,
    CostModel,
    PlanningError,
    PlanResult,
    Profile,
    Resources,
    MacroFlow,
    chunk_sizes,
    plan,
)
from scheduler.plans import MODES

MIB, GIB = 2**20, 2**30
#: components whose state may leave their devices between phases in this workflow
OFFLOADABLE = frozenset({"trainer"})


def resources_of(cfg: ReasoningConfig) -> Resources:
    return cpu_resources(cfg.cluster.num_cpus)


def macro_flow_of(cfg: ReasoningConfig) -> MacroFlow:
    """The macro flow as the planner sees it: B prompts x G responses, ``algo.epochs`` epochs."""
    return MacroFlow.reasoning(num_prompts=cfg.data.train_batch_size, group_size=cfg.algo.group_size,
                              train_epochs=cfg.algo.epochs)


def chunk_choices(cfg: ReasoningConfig) -> list[int]:
    """Chunk counts the runtime executes as planned: ``plan.chunks``, or every divisor of
    ``algo.num_minibatches`` up to ``plan.max_chunks`` (each chunk then carries whole minibatches).
    With ``algo.minibatch_mix=shuffled`` one chunk: every minibatch needs every group, so nothing
    streams to the trainer."""
    if cfg.plan.chunks is not None:
        return [cfg.plan.chunks]
    if cfg.algo.minibatch_mix == "shuffled":
        return [1]
    M = cfg.algo.num_minibatches
    return [k for k in range(1, min(M, cfg.plan.max_chunks) + 1) if M % k == 0]


def plan_reasoning(cfg: ReasoningConfig, profile: Profile) -> PlanResult:
    """The planner's ranked candidates over :func:`chunk_choices` (``plan.mode`` restricts the
    modes); the simplest plan within 2% of the fastest wins (:func:`pipelines.onpolicy.planning.prefer_simple`)."""
    workflow, resources = macro_flow_of(cfg), resources_of(cfg)
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
        # 2: the workers' own calls, pinned as the plans pin them; the weight sync as the driver calls it
        "version": 2,
    }


def _sample_sizes(cfg: ReasoningConfig) -> list[int]:
    """Responses per rollout call for every chunk count the planner may choose, the whole batch
    (whole minibatches for the trainer) and half of it (at least two sizes, so that fixed and
    per-sample costs separate)."""
    total = cfg.samples_per_iteration
    sizes = {max(chunk_sizes(cfg.data.train_batch_size, k)) * cfg.algo.group_size for k in chunk_choices(cfg)}
    sizes.update((total, max(cfg.algo.group_size, total // 2)))
    return sorted(sizes)


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
    log(f"[m2flow] profiling rollout, reward and trainer on {cores} cores (their workers' own calls) ...")
    t0 = time.perf_counter()
    # in the driver: the rollout backend's memory and the size of a response in its message
    backend = ROLLOUT_BACKENDS.get(cfg.workers.rollout_backend)(cfg, torch.device("cpu"))
    G = cfg.algo.group_size
    chunk = chunk_prompts(PromptReader(prompts, cfg.data.train_batch_size, cfg.seed).draws(0)[:1], 1)[0]
    with RngStream(cfg.seed):
        sample = GeneratedChunk.of(chunk, backend.generate([d.record.prompt for d in chunk.draws], samples=G), G,
                                   cfg.data.max_prompt_length, backend.pad_token_id, 0, 0.0)
    sample_mib = _sample_mib(sample)
    measured = probe_workers(cfg, prompts, cluster, cores, log, message_mib=sample_mib * max(_sample_sizes(cfg)))
    latency_s, s_per_mib = measured.transfer
    weights_mib = measured.weights_mib
    # the driver's two calls of a weight sync, less the message the planner prices apart
    sync_s = max(0.0, measured.sync_s - latency_s - weights_mib * s_per_mib)
    kv_gib = backend.kv_cache_gib(cfg.data.max_prompt_length + cfg.max_new_tokens)
    components = {
        "rollout": ComponentProfile("rollout", fit_threads(measured.rollout), memory_gib=backend.weights_mib() / 1024,
                                    memory_per_item_gib=kv_gib, output_mib_per_item=sample_mib, weights_mib=weights_mib),
        "reward": ComponentProfile("reward", measured.reward.fit(), output_mib_per_item=8 / MIB),
        "trainer": ComponentProfile("trainer", fit_threads(measured.trainer), memory_gib=4 * weights_mib / 1024,
                                    offload_s=measured.offload_s, onload_s=measured.onload_s),
        WEIGHT_SYNC: ComponentProfile(WEIGHT_SYNC, _constant_cost(sync_s)),
    }
    return store_profile(key, components, (latency_s, s_per_mib), cluster,
                         (measured.rollout, measured.reward, measured.trainer), t0, log)


#: Timed rounds per probed size and thread count, after one untimed round.
PROBE_REPEATS = 3


def probe_layouts(cores: int) -> dict[int, dict[str, tuple[int, ...]]]:
    """Torch threads -> the cores each worker is pinned to while probed at that many threads, as
    the plans run them: one thread each as a disaggregated plan does (generation on core 0, the
    trainer on the last core), and a thread per core with all three workers pinned to every core as
    a colocated plan does (the idle workers holding their threads next to the busy one)."""
    layouts = {1: {"rollout": (0,), "reward": (0,), "trainer": (cores - 1,)}}
    if cores > 1:
        layouts[cores] = {c: tuple(range(cores)) for c in ("rollout", "reward", "trainer")}
    return layouts


class RolloutProbeWorker(RolloutWorker, Echo):
    """The rollout worker as profiled; it also serves the message probe (:class:`Echo`) to the
    reward's worker: the two processes that pass the responses in a run."""


class RewardProbeWorker(RewardWorker, Echo):
    """The reward worker as profiled; it also bounces the message probe's messages."""


@dataclasses.dataclass
class WorkerProbes:
    """What :func:`probe_workers` measured: samples ``(responses, threads, seconds per call)`` of the
    rollout's ``generate``, the reward's ``score`` and the trainer's ``train``; the seconds of a
    weight sync as the driver pays it, one offload and onload of the trainer, the weights' MiB, and
    ``(latency_s, s_per_mib)`` of a message from the rollout's worker to the reward's."""

    rollout: Probe
    reward: Probe
    trainer: Probe
    sync_s: float
    offload_s: float
    onload_s: float
    weights_mib: float
    transfer: tuple[float, float]


def _pinnings(layouts: dict[int, dict[str, tuple[int, ...]]], threads: int) -> dict[str, Pinning]:
    """Each worker's pinning under the probe layout of ``threads`` threads (the reward's: one thread)."""
    return {c: Pinning(placed, 1 if c == "reward" else threads) for c, placed in layouts[threads].items()}


@dataclasses.dataclass
class _ProbeRounds:
    """The profiling groups, and one round of an iteration's phases on them (:func:`probe_workers`)."""

    cfg: ReasoningConfig
    draws: list[PromptDraw]
    layouts: dict[int, dict[str, tuple[int, ...]]]
    rollout: WorkerGroup[RolloutProbeWorker]
    reward: WorkerGroup[RewardProbeWorker]
    trainer: WorkerGroup[TrainerWorker]
    rounds: int = 0

    @property
    def minibatch(self) -> int:
        """Responses per minibatch: the trainer trains on whole ones."""
        return self.cfg.data.train_batch_size // self.cfg.algo.num_minibatches * self.cfg.algo.group_size

    def configure(self, threads: int, offload: bool = False) -> None:
        placed = _pinnings(self.layouts, threads)
        wait_all(self.rollout.remote.configure(placed["rollout"]), self.reward.remote.configure(placed["reward"]),
                 self.trainer.remote.configure(placed["trainer"], offload))

    def one_round(self, size: int) -> dict[str, float]:
        """The weight sync, then ``generate``, ``score`` and (at whole minibatches) ``train`` of one
        chunk of ``size`` responses: each one's seconds, and the trainer's offload seconds."""
        self.rounds += 1
        t0 = time.perf_counter()
        weights = self.trainer.remote.export_weights()
        self.rollout.remote.load_weights(weights.handle(0)).wait()
        out = {"sync": time.perf_counter() - t0}
        generated = Channel(f"profile-generated-{self.rounds}", self.reward, phase=True, source="rollout")
        scored = Channel(f"profile-scored-{self.rounds}", self.trainer, phase=True, source="reward")
        prompts = chunk_prompts(self.draws[: size // self.cfg.algo.group_size], 1)
        gen_f = self.rollout.remote.generate(prompts, generated).as_phase()
        score_f = self.reward.remote.score(1, generated, scored).as_phase()
        out["rollout"] = sum(r["generate_s"] for r in gen_f.wait())
        out["reward"] = sum(r["reward_s"] for r in score_f.wait())
        if size % self.minibatch == 0:
            stats = self.trainer.remote.train(scored, 1, self.cfg.algo.lr).as_phase().result()
            out["trainer"] = stats["time/train_s"]
            out.update({k: v for k, v in stats.items() if k.startswith("offload/")})
        return out

    def close(self) -> None:
        for group in (self.rollout, self.reward):
            group.remote.close().wait(timeout_s=30)
        for group in (self.rollout, self.reward, self.trainer):
            group.shutdown()


def _time_sizes(rounds: _ProbeRounds, probes: dict[str, Probe], log: Callable[[str], None]) -> list[float]:
    """Per size of :func:`_sample_sizes` and thread count, the median of ``PROBE_REPEATS`` rounds
    after an untimed one, added to ``probes``; returns every timed round's weight sync seconds.
    The thread counts take turns round by round, so that load from other processes on a shared
    machine falls on both alike (their comparison decides the workers' threads)."""
    sync: list[float] = []
    for size in _sample_sizes(rounds.cfg):
        timed: dict[int, list[dict[str, float]]] = {threads: [] for threads in rounds.layouts}
        for repeat in range(PROBE_REPEATS + 1):
            for threads in sorted(rounds.layouts):
                rounds.configure(threads)
                measured = rounds.one_round(size)
                if repeat:  # the first round of each is a warm-up
                    timed[threads].append(measured)
        for threads, rounds_ in timed.items():
            for name, probe in probes.items():
                if name in rounds_[0]:
                    probe.add(size, 1 if name == "reward" else threads, statistics.median(t[name] for t in rounds_))
            sync.extend(t["sync"] for t in rounds_)
            train = f", train {probes['trainer'].samples[-1][2] * 1e3:7.1f} ms" if "trainer" in rounds_[0] else ""
            log(f"  {size:>5} responses, {threads} thread(s): generate {probes['rollout'].samples[-1][2] * 1e3:7.1f} ms, "
                f"score {probes['reward'].samples[-1][2] * 1e3:6.2f} ms{train}")
    return sync


def probe_workers(cfg: ReasoningConfig, prompts: list[PromptRecord], cluster: Cluster, cores: int,
                  log: Callable[[str], None] = print, message_mib: float = 1.0) -> WorkerProbes:
    """Time the workers a run builds (:func:`~pipelines.reasoning.workers.start_groups`) on their
    own calls, pinned as the plans pin them: per thread count of :func:`probe_layouts` and per size
    of :func:`_sample_sizes`, rounds of an iteration's phases one after the other: the weight sync
    (the trainer's export, then the rollout's load, as the driver calls them), ``generate`` of one
    chunk of that many responses, ``score`` of it, ``train`` on it (at sizes of whole minibatches).
    Each sample is the median of ``PROBE_REPEATS`` rounds after an untimed one; the thread counts
    take turns round by round (load from other processes falls on both alike). One more round
    with the trainer offloading between phases times its context switch. Then the message probe
    (:func:`~pipelines.probes.probe_transfer`, up to ``message_mib``) between the rollout's and
    the reward's workers, where each group has one rank (else between two workers started for it).

    Timing the model in the driver missed what the workers pay in a run (docs/reasoning.md)."""
    layouts = probe_layouts(cores)
    draws = PromptReader(prompts, cfg.data.train_batch_size, cfg.seed).draws(0)
    rollout, reward, trainer = start_groups(cluster, cfg, _pinnings(layouts, 1), False, prefix="profile-",
                                            rollout_cls=RolloutProbeWorker, reward_cls=RewardProbeWorker)
    rounds = _ProbeRounds(cfg, draws, layouts, rollout, reward, trainer)
    probes = {"rollout": Probe("rollout"), "reward": Probe("reward", scaling_exponent=0.0), "trainer": Probe("trainer")}
    try:
        sync = _time_sizes(rounds, probes, log)
        trainer.remote.configure(_pinnings(layouts, 1)["trainer"], True).wait()  # its context switch, as a plan offloads it
        switch = rounds.one_round(max(s for s in _sample_sizes(cfg) if s % rounds.minibatch == 0))
        payload = trainer.remote.export_weights().result()
        ends = (rollout, reward) if rollout.num_ranks == reward.num_ranks == 1 else None
        transfer = probe_transfer(cluster, message_mib, log, ends)
    finally:
        rounds.close()
    per_minibatch(probes["trainer"], rounds.minibatch)
    sync_s = statistics.median(sync)
    log(f"  weight sync: {payload.nbytes / MIB:.2f} MiB exported and loaded in {sync_s * 1e3:.1f} ms (the driver's calls)")
    return WorkerProbes(probes["rollout"], probes["reward"], probes["trainer"], sync_s,
                        switch.get("offload/offload_s", 0.0), switch.get("offload/onload_s", 0.0), payload.nbytes / MIB,
                        transfer)


def per_minibatch(probe: Probe, minibatch: int) -> None:
    """Give a trainer probe measured at one size a second one: the trainer's work is one update per
    minibatch of a chunk, so ``m`` minibatches cost ``m`` times one (``algo.num_minibatches=1``
    leaves the probe a single size of whole minibatches, and a fit needs two)."""
    if len({size for size, _, _ in probe.samples}) != 1:
        return
    for size, threads, seconds in list(probe.samples):
        m = size // minibatch
        probe.add(size // m if m > 1 else 2 * size, threads, seconds / m if m > 1 else 2 * seconds)


def _constant_cost(seconds: float) -> CostModel:
    return CostModel(fixed_s=seconds, per_item_s=0.0, scaling_exponent=0.0)


def _sample_mib(chunk: GeneratedChunk) -> float:
    """MiB one response takes in the rollout's message (token arrays and text)."""
    arrays = (chunk.prompt_ids, chunk.prompt_mask, chunk.response_ids, chunk.logprobs, chunk.response_mask)
    text = sum(len(t.encode()) for t in chunk.texts)
    return (sum(a.nbytes for a in arrays) + text) / len(chunk) / MIB

