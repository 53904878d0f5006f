"""Profiling probes of the embodied workflow: measure the real components for the planner.

    profile = profile_embodied(cfg, cluster)     # measured, cached per env, policy and hardware

On CPU every core is a device: a component placed on cores {0} runs pinned there (``sched_setaffinity``,
inherited by its env processes) with as many torch threads as cores. With ``workers.trainer=N`` the
trainer's probe is one rank's share of the update plus an all-reduce of its gradients at the
measured cost of a message. Probes measure what the workers run: a chunk's ``VecEnv.step`` at
several chunk sizes and process counts (with the policy's inference between steps, as in the
pipeline), the policy's inference at several batch sizes and thread counts, the trainer's update
(the configured algorithm) per minibatch, a message between two Ray workers, and one
offload/onload of the trainer's state. What the planner is asked and how its answer is read is
:mod:`pipelines.onpolicy.planning`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch

from embodied.config import to_dict
from embodied.offload import Offloader
from embodied.profiler import Probe, cache_key, hardware_fingerprint, load_cached, store_cached, time_call
from embodied.runtime import Channel, Cluster, RankResources, Worker, WorkerGroup, WorkerTimeout, wait_all
from envs.base import random_actions, to_numpy
from embodied.threads import thread_env
from envs.multiprocess import MultiprocessVecEnv
from envs.registry import make_vec_env
from embodied.algorithms import build_algorithm, build_optimizer
from embodied.rl import TrajectoryBatch, is_text
from embodied.runtime.distributed import SINGLE, DataParallel
from pipelines.collect import EnvOutput, TrajectoryRecorder, env_output, resolve_device, to_torch, with_instructions
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.chunks import Pinning
from pipelines.onpolicy.workers import RolloutWorker
from pipelines.onpolicy.modes import simulator_device
from pipelines.onpolicy.planning import macro_flow_of, resources_of
from policies.registry import build_policy
from embodied.runtime.weights import WeightSyncer
from scheduler import WEIGHT_SYNC, ComponentProfile, CostModel, Profile, fit_cost_model

MIB = 2**20
MIN_THREAD_SCALING = 0.3
"""Fitted parallel efficiency below which a worker's extra cores get no torch threads (more threads
only spin and contend for small models). The probes' fits follow the same rule
(:func:`fit_threads`), so a component priced as one thread runs as one."""


def _setup_key(cfg: EmbodiedConfig, backend: str) -> dict[str, Any]:
    """What a profile depends on (besides the hardware)."""
    return {
        # probes never spin; failure handling and timeouts do not change what a step costs
        "env": {k: v for k, v in to_dict(dataclasses.replace(cfg.env, num_procs=0, worker_spin_us=0)).items()
                if k not in ("nonfinite", "timeout_s", "start_timeout_s")},
        "policy": to_dict(cfg.policy),
        "minibatch": macro_flow_of(cfg).train_minibatch,
        "backend": backend,
        "trainer": {"ranks": cfg.workers.trainer, "device": cfg.workers.trainer_device,
                    "probe_minibatches": trainer_probe_sizes(cfg)},
        "rollout_device": cfg.workers.rollout_device,
        "env_threads": cfg.workers.rollout_threads,  # the thread variables env workers (and the env probe) get
        "rollout_decisions": rollout_probe_decisions(cfg),
        # 11: an episodic algorithm's trainer probe also times small minibatches; 10: env shapes
        # pinned to their cores (one process may span several), rollout passes of T decisions; 9: on
        # Ray the rollout is probed in a RolloutWorker fed over channels; 8: the rollout probe records
        # through the TrajectoryRecorder, the env probe includes its message's assembly, a
        # weight-sync probe; 7: trainer ranks and devices; 6: the trainer component is named "trainer"
        "version": 11,
    }


def _probe_sizes(n: int) -> list[int]:
    return sorted({n, max(1, math.ceil(n / 2)), max(1, math.ceil(n / 4))})


def _tile(obs: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """A batch of ``size`` observations made of the rows of ``obs`` (instructions included)."""
    idx = np.arange(size) % next(iter(obs.values())).shape[0]
    return {k: np.ascontiguousarray(v[idx] if is_text(v) else to_numpy(v)[idx]) for k, v in obs.items()}


def _obs_mib_per_env(obs: dict[str, Any]) -> float:
    return sum((v[0].nbytes if is_text(v) else to_numpy(v)[0].nbytes) for v in obs.values()) / MIB


#: Untimed and timed env steps per probed shape.
ENV_PROBE_WARMUP, ENV_PROBE_REPEATS = 3, 8


@dataclasses.dataclass
class ShapeMeasurement:
    """One probed shape of the env probe: the median seconds per step (or chunk), whether the env
    runs processes, and, for the first shape measured, its reset observation (instructions
    included) and spaces."""

    seconds: float
    multiprocess: bool
    obs: dict[str, np.ndarray] | None = None
    observation_space: Any = None
    action_space: Any = None
    outputs: list[EnvOutput] = dataclasses.field(default_factory=list)
    """What the env sent its rollout after each step of this shape (one process shapes only): the
    rollout probe records its decisions from these, as the rollout worker does."""
    device_memory_gib: float = 0.0
    """Peak GPU memory the env held while it was built and stepped (a simulator on CUDA: torch's
    and JAX's allocators on its device); 0 for a simulator on the CPU."""


def simulator_memory_gib(device: str) -> float:
    """Peak GiB allocated on ``device`` since :func:`reset_simulator_memory`: torch's allocator
    (ManiSkill on CUDA, a batched adapter's buffers) plus JAX's where JAX is loaded (MJX); 0 on
    the CPU. JAX's preallocated pool is not counted, only what its arrays hold at the peak."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return 0.0
    index = torch.device(device).index or 0
    peak = torch.cuda.max_memory_allocated(index)
    jax = sys.modules.get("jax")
    if jax is not None:
        for d in jax.devices():
            if d.platform == "gpu" and d.id == index:
                peak += (d.memory_stats() or {}).get("peak_bytes_in_use", 0)
    return peak / 2**30


def reset_simulator_memory(device: str) -> None:
    """Start :func:`simulator_memory_gib`'s peak from what is allocated now (torch's; JAX keeps
    its own peak, which a new env process starts from zero)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(torch.device(device).index or 0)


@contextmanager
def pinned_to(cores: int) -> Iterator[None]:
    """This process (and the processes it starts) on the first ``cores`` of the cores it may use,
    then back on all of them; nothing where the OS cannot pin."""
    if not hasattr(os, "sched_getaffinity"):
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(allowed)[:max(1, cores)])
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


class EnvProbe:
    """Measures one shape ``(batch, processes, cores)`` of the env probe at a time (see
    :func:`probe_env`): in this process, or inside an :class:`EnvProbeWorker` whose calls the
    driver bounds."""

    def __init__(self, cfg: EmbodiedConfig) -> None:
        self.cfg = cfg
        self.policy: Any = None  # infers between steps, as the rollout does

    def measure(self, b: int, procs: int, cores: int | None = None) -> ShapeMeasurement:
        """``b`` envs in ``procs`` processes, pinned to ``cores`` cores (default: ``procs``), as an
        env worker placed on that many cores runs them: a simulator's helper threads (a renderer's
        queue, a physics pool) run on the cores the worker has, not on an idle neighbour."""
        cfg = self.cfg
        # No spin-waiting in env processes: in the pipeline a policy runs between steps and the
        # processes block (what the prediction must cost).
        env_cfg = dataclasses.replace(cfg.env, num_envs=b, num_procs=procs, worker_spin_us=0)
        with pinned_to(cores or procs):
            device = simulator_device(cfg)
            reset_simulator_memory(device)
            measured = self._measure(env_cfg, b, procs)
            return dataclasses.replace(measured, device_memory_gib=simulator_memory_gib(device))

    def _measure(self, env_cfg: Any, b: int, procs: int) -> ShapeMeasurement:
        cfg = self.cfg
        env = make_vec_env(env_cfg, seed=cfg.seed)
        try:
            instructions = None if env.instructions is None else np.asarray(env.instructions, dtype=str)
            obs = with_instructions(env.reset(seed=cfg.seed), instructions)
            first = self.policy is None
            if first:
                self.policy = build_policy(cfg.policy, env.observation_space, env.action_space).eval()
            policy = self.policy
            rng = np.random.default_rng(0)
            space = env.action_space
            chunk = cfg.policy.action_chunk  # a worker's call: one step, or chunk_step of C actions
            lead = (b,) if chunk == 1 else (b, chunk)

            outputs: list[EnvOutput] = []

            def step() -> float:
                """Seconds of one env step and its message to the rollout (what the env worker
                does per call); then the policy's turn, untimed."""
                actions = random_actions(space, lead, rng)
                t0 = time.perf_counter()
                result = env.step(actions) if chunk == 1 else env.chunk_step(actions)
                out = env_output(result, instructions)
                seconds = time.perf_counter() - t0
                outputs.append(out)
                with torch.no_grad():
                    policy.act(to_torch(out.obs, torch.device("cpu")))
                return seconds

            for _ in range(ENV_PROBE_WARMUP):
                step()
            seconds = float(np.median([step() for _ in range(ENV_PROBE_REPEATS)]))
            multiprocess = isinstance(env, MultiprocessVecEnv)
            kept = [] if procs > 1 else outputs
            if first:
                return ShapeMeasurement(seconds, multiprocess, obs, env.observation_space, env.action_space, kept)
            return ShapeMeasurement(seconds, multiprocess, outputs=kept)
        finally:
            env.close()


class Echo:
    """Bounces channel messages back: measures the cost of one message between two workers
    (:func:`probe_transfer`)."""

    def bounce(self, inbox: Channel, outbox: Channel, count: int) -> None:
        for _ in range(count):
            outbox.put(0, inbox.get(0))

    def serve(self, inbox: Channel, outbox: Channel, payload: np.ndarray, count: int) -> float:
        t0 = time.perf_counter()
        for _ in range(count):
            outbox.put(0, payload)
            inbox.get(0)
        return (time.perf_counter() - t0) / (2 * count)


class EnvReplay:
    """The env side of the rollout probe (Ray backend): sends recorded env outputs and takes the
    actions back over the channels, as an :class:`~pipelines.onpolicy.workers.EnvWorker` does, without
    simulating; then takes the rollout's batch off its channel."""

    def replay(self, outputs: list[EnvOutput], steps: int, obs_channel: Channel, action_channel: Channel,
               traj_channel: Channel) -> None:
        obs_channel.put(0, EnvOutput(outputs[0].obs, group_ids=outputs[0].group_ids))
        for t in range(steps):
            action_channel.get(0)
            obs_channel.put(0, outputs[(t + 1) % len(outputs)])
        traj_channel.get(0)


class EnvProbeWorker(Worker, EnvReplay, Echo):
    """Runs the env probe in a worker process, so that an env whose constructor, reset or step
    hangs during profiling is a timeout of one call (``cluster.timeout_s`` per probed shape), and
    is killed with the worker, instead of a driver that hangs. The same process then plays the
    env side of the rollout probe (:class:`EnvReplay`) and one end of the message probe
    (:class:`Echo`): a worker process costs seconds to start (Python, torch, the project), and
    profiling on Ray starts two instead of five."""

    def __init__(self, cfg: EmbodiedConfig) -> None:
        torch.set_num_threads(1)
        self.probe = EnvProbe(cfg)

    def measure(self, b: int, procs: int, cores: int) -> ShapeMeasurement:
        return self.probe.measure(b, procs, cores)


def probe_env(
    cfg: EmbodiedConfig, cores: int, log: Callable[[str], None] = print,
    measure: Callable[[int, int, int], ShapeMeasurement] | None = None,
) -> tuple[Probe, dict[str, np.ndarray], Any, Any, Any, list[EnvOutput], tuple[float, float]]:
    """Time one VecEnv.step at chunk sizes N, N/2, N/4 (one process, one core) and N over all cores.

    The env probe of ``profile_embodied``, usable on its own. With ``N = cfg.env.num_envs``, each
    shape ``(batch, processes, cores)`` is stepped ``ENV_PROBE_WARMUP`` times untimed, then
    ``ENV_PROBE_REPEATS`` times timed, pinned to its cores (as a worker placed on them runs); the
    probe's sample ``(batch, cores, seconds)`` is the median seconds per step (or per chunk with
    ``policy.action_chunk > 1``). With ``cores > 1`` the last shape is N envs on
    ``min(cores, N)`` cores: in that many processes when the configured backend runs processes,
    else in one process, whose simulator may still use a second core (a renderer's queue thread,
    a physics pool); the fit's scaling exponent says how much.

    Between two timed steps the policy infers on the step's observation, as the rollout does in
    the pipeline: env processes that idle between steps wake slower than ones stepped back to back.
    Env processes never spin-wait here (``worker_spin_us=0``).

    ``measure(batch, processes, cores)`` measures one shape (default: :meth:`EnvProbe.measure` in
    this process; ``profile_embodied`` runs it in an :class:`EnvProbeWorker`).

    Returns ``(probe, obs, observation_space, action_space, policy, outputs, memory)``: the ``Probe("env")``,
    the reset observation of the first (smallest) probed batch (instructions included,
    ``(ceil(N/4), ...)`` per key), the env's spaces, an inference-mode policy built from
    ``cfg.policy``, and the env outputs of the largest one-process one-core batch in step order
    (what :func:`_probe_rollout` records from), and ``(memory_gib, memory_per_item_gib)`` of a
    simulator on a GPU (:func:`env_memory_gib`; zeros on the CPU). ``log`` receives one line per
    probed shape.
    """
    measure = measure or EnvProbe(cfg).measure
    probe = Probe("env")
    n = cfg.env.num_envs
    obs_sample = action_space = obs_space = None
    policy = None
    outputs: list[EnvOutput] = []
    unit = "step" if cfg.policy.action_chunk == 1 else "chunk"
    m: ShapeMeasurement | None = None
    memory: list[tuple[int, float]] = []  # (batch, peak GPU GiB) of each one-process shape
    for b in _probe_sizes(n):  # one process on one core, growing batches
        m = measure(b, 1, 1)
        memory.append((b, m.device_memory_gib))
        if obs_sample is None:
            obs_sample, obs_space, action_space = m.obs, m.observation_space, m.action_space
            policy = build_policy(cfg.policy, obs_space, action_space).eval()
        outputs = m.outputs or outputs  # the last, the largest batch's
        probe.add(b, 1, m.seconds)
        log(f"  env     batch {b:>4} on 1 core(s): {m.seconds * 1e3:8.2f} ms/{unit}")
    if cores > 1 and n > 1:  # N envs on the cores a worker may get: processes of their own, or one
        assert m is not None
        spread = min(cores, n)
        procs = spread if m.multiprocess else 1
        probe.add(n, spread, measure(n, procs, spread).seconds)
        log(f"  env     batch {n:>4} on {spread} core(s), {procs} process(es): {probe.samples[-1][2] * 1e3:8.2f} ms/{unit}")
    return probe, obs_sample, obs_space, action_space, policy, outputs, env_memory_gib(memory)


def env_memory_gib(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """``(memory_gib, memory_per_item_gib)`` of the env from ``(batch, peak GiB)`` samples: the
    per-env slope between the smallest and the largest batch (never negative), the rest static."""
    if not samples or all(gib <= 0 for _, gib in samples):
        return 0.0, 0.0
    (b0, m0), (b1, m1) = min(samples), max(samples)
    per_item = max(0.0, (m1 - m0) / (b1 - b0)) if b1 > b0 else 0.0
    return max(0.0, m1 - per_item * b1), per_item


def env_probe_group(cfg: EmbodiedConfig, cluster: Cluster) -> WorkerGroup:
    """The :class:`EnvProbeWorker` of profiling on Ray, with the thread variables an env worker of
    the pipeline gets (a renderer's threads among them)."""
    threads = thread_env(cfg.workers.rollout_threads)
    return WorkerGroup(cluster, EnvProbeWorker, 1, cfg, name="profile-env", resources=RankResources(0.01, env_vars=threads))


def _probe_env_in_a_worker(cfg: EmbodiedConfig, group: WorkerGroup, cores: int, log) -> tuple[Probe, Any, Any, Any, Any, list[EnvOutput], tuple[float, float]]:
    """:func:`probe_env` with every shape measured in ``group``'s :class:`EnvProbeWorker` (Ray
    backend): each call waits at most ``cluster.timeout_s``, so an env that hangs while being
    profiled ends the run with a timeout naming the env and the key."""

    def measure(b: int, procs: int, on: int) -> ShapeMeasurement:
        try:
            return group.remote.measure(b, procs, on).result()
        except WorkerTimeout as err:
            seconds = group.timeout_s
            raise WorkerTimeout(
                err.group, err.rank, err.method,
                f"profiling env {cfg.env.id}: the env probe (build {b} env(s) in {procs} process(es) on {on} core(s), reset with seed "
                f"{cfg.seed}, {ENV_PROBE_WARMUP + ENV_PROBE_REPEATS} steps) got no answer within {seconds:g} s "
                "(cluster.timeout_s): the env's constructor, reset or step may hang. Its log says where; raise "
                "cluster.timeout_s if the env is just that slow, or skip profiling with plan.profile=false",
                where={k: v for k, v in err.where.items() if k not in ("group", "rank")},
            ) from None

    return probe_env(cfg, cores, log, measure)


#: Most decisions the rollout probe records per timed pass (from the env probe's outputs, cycled).
ROLLOUT_PROBE_DECISIONS = 32


def rollout_probe_decisions(cfg: EmbodiedConfig) -> int:
    """Decisions per timed pass of the rollout probe: an iteration's ``T`` (at most
    :data:`ROLLOUT_PROBE_DECISIONS`). A pass's seconds per call average its T decisions and the
    bootstrap call after them (values only, cheaper than a decision), as the iteration's T + 1
    calls do; a shorter pass would weigh the cheap call more than the pipeline does."""
    return max(1, min(macro_flow_of(cfg).rollout_steps, ROLLOUT_PROBE_DECISIONS))


def _tile_rows(x: Any, size: int) -> Any:
    """``x`` (an array, a dict of arrays, or None) with ``size`` rows, cycled from its rows."""
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: _tile_rows(v, size) for k, v in x.items()}
    x = np.asarray(x) if is_text(x) else to_numpy(x)
    return np.ascontiguousarray(x[np.arange(size) % x.shape[0]])


def tile_output(out: EnvOutput, size: int) -> EnvOutput:
    """An env output for ``size`` envs made of the rows of ``out``."""
    return EnvOutput(**{f.name: _tile_rows(getattr(out, f.name), size) for f in dataclasses.fields(EnvOutput)})


def record_seconds_per_call(recorder: TrajectoryRecorder, outputs: list[EnvOutput], decisions: int) -> float:
    """Seconds per rollout call of recording ``decisions`` decisions from ``outputs`` (cycled), as
    the rollout worker does per chunk: ``begin``, then ``act`` + ``observe`` per decision, then
    ``finish`` (the last call's bootstrap values and the batch). The ``decisions + 1`` calls of
    the planner's chain share the total; a decision is the median of its timed ones, so a
    disturbed call does not move it."""
    recorder.begin(EnvOutput(outputs[0].obs))
    per_decision = []
    for t in range(decisions):
        t0 = time.perf_counter()
        recorder.act()
        recorder.observe(outputs[(t + 1) % len(outputs)])
        per_decision.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    recorder.finish(0)
    finish_s = time.perf_counter() - t0
    return (decisions * float(np.median(per_decision)) + finish_s) / (decisions + 1)


def _rollout_probe(cfg: EmbodiedConfig, outputs: list[EnvOutput], cores: int, log, use_threads: Callable[[int], None],
                   per_call: Callable[[list[EnvOutput], int], float], repeats: int, where: str) -> Probe:
    """The rollout's seconds per call at the chunk sizes on 1 and all cores: ``use_threads(n)``
    sets the threads, ``per_call(outputs, decisions)`` records ``decisions`` decisions from the env
    probe's outputs tiled to a chunk's batch; after a 2-decision warm-up, the median of
    ``repeats`` timed passes."""
    probe = Probe("rollout")
    for threads in sorted({1, cores}):
        use_threads(threads)
        for b in _probe_sizes(cfg.env.num_envs * cfg.workers.env):
            tiled = [tile_output(o, b) for o in outputs]
            per_call(tiled, 2)  # warm-up
            seconds = float(np.median([per_call(tiled, rollout_probe_decisions(cfg)) for _ in range(repeats)]))
            probe.add(b, threads, seconds)
            log(f"  rollout batch {b:>4} on {threads} core(s): {seconds * 1e3:8.2f} ms/call ({where})")
    return probe


def _probe_rollout(cfg: EmbodiedConfig, policy, outputs: list[EnvOutput], action_space: Any, cores: int, log) -> Probe:
    """The rollout worker's work per call at the chunk sizes on 1 and all cores, on the rollout's
    device: the policy's inference *and* recording the decision through the
    :class:`TrajectoryRecorder` the worker runs (results back on the host, values of ended
    episodes, the batch assembled at the end), on the env outputs the env probe's real steps
    produced (:func:`record_seconds_per_call`)."""
    device = resolve_device(cfg.workers.rollout_device)
    policy = policy.to(device)
    record_values = build_algorithm(cfg.algo).needs_critic

    def per_call(tiled: list[EnvOutput], decisions: int) -> float:
        return record_seconds_per_call(TrajectoryRecorder(policy, device, record_values, action_space), tiled, decisions)

    before = torch.get_num_threads()
    try:
        return _rollout_probe(cfg, outputs, cores, log, torch.set_num_threads, per_call, 1, "inference + recording")
    finally:
        torch.set_num_threads(before)


class ProbeRolloutWorker(RolloutWorker, Echo):
    """The rollout probe's :class:`~pipelines.onpolicy.workers.RolloutWorker`, which also bounces the
    message probe's messages (:class:`Echo`) back to the env probe's worker."""


def rollout_probe_group(cfg: EmbodiedConfig, cluster: Cluster, obs_space: Any, action_space: Any) -> WorkerGroup:
    """The rollout worker of profiling on Ray: a real rollout worker for one env worker."""
    record_values = build_algorithm(cfg.algo).needs_critic
    one_worker = dataclasses.replace(cfg, workers=dataclasses.replace(cfg.workers, env=1))
    return WorkerGroup(cluster, ProbeRolloutWorker, 1, one_worker, obs_space, action_space, 1, None, record_values,
                       name="profile-rollout", resources=RankResources(0.01))


def _probe_rollout_in_a_worker(cfg: EmbodiedConfig, rollout: WorkerGroup, replay: WorkerGroup, policy,
                               outputs: list[EnvOutput], cores: int, log) -> Probe:
    """:func:`_probe_rollout` as the pipeline pays it: a real :class:`~pipelines.onpolicy.workers.RolloutWorker`
    (``rollout``) in a worker process of its own, fed the env probe's outputs over the channels by
    the env probe's worker (``replay``, :class:`EnvReplay`); a call costs what the worker's
    ``infer_s`` counts (deserialized inputs, the sampling stream, recording, sending the actions).
    On this machine's default job (16 envs, an MLP) the pipeline paid ~1.4 ms a decision; the
    driver's loop had measured 0.3 ms, this probe measures 0.8 ms. CPU rollouts only: a probe
    worker holds no GPU."""
    obs_ch, act_ch, traj_ch = Channel("probe-obs", rollout), Channel("probe-act", replay), Channel("probe-traj", replay)

    def use_threads(threads: int) -> None:
        rollout.remote.configure(1, Pinning(None, threads)).wait()

    def per_call(tiled: list[EnvOutput], decisions: int) -> float:
        fed = replay.remote.replay(tiled, decisions, obs_ch, act_ch, traj_ch)
        out = rollout.remote.generate(decisions, obs_ch, act_ch, traj_ch).result()
        fed.wait()
        return float(out["infer_s"]) / (decisions + 1)

    rollout.remote.load_weights(WeightSyncer().export(policy.cpu(), 0)).wait()
    return _rollout_probe(cfg, outputs, cores, log, use_threads, per_call, 3, "in a rollout worker")


def fit_threads(probe: Probe, one_thread_devices: int = 1) -> CostModel:
    """The cost of a component probed at several thread counts, as the worker will run it: the
    fit over all samples when extra threads pay off (fitted exponent >= MIN_THREAD_SCALING, then
    the worker runs a thread per core), else the fit of the one-thread samples (``n_devices ==
    one_thread_devices``) with exponent 0: the worker runs one thread whatever cores it gets, and
    slower many-thread probes (threads that spin and contend) must not price it."""
    cost = probe.fit()
    single = [s for s in probe.samples if s[1] == one_thread_devices]
    if cost.scaling_exponent >= MIN_THREAD_SCALING or not single:
        return cost
    return fit_cost_model(single, 0.0)


#: Minibatches of the trainer probe's one epoch: its per-update costs (advantages, the normalizer,
#: the shuffle) spread over them as over an iteration's minibatches.
TRAINER_PROBE_MINIBATCHES = 4
#: An episodic (grouped: GRPO) iteration ends once its episodes are over and trains on the
#: decisions they took: while the policy is young its minibatches are a small share of the
#: configured size, where an optimizer step's fixed cost outweighs its per-sample one (CartPole's
#: MLP on one core: 1.56 ms per minibatch of 32 samples, 1.96 ms of 250, 11.1 ms of 4,000). Sizes
#: of the configured minibatch and half of it alone cannot tell the fixed part (the fit put it at
#: 0 and priced such iterations' trainer at a sixth of what it took); the probe of an episodic
#: algorithm also times minibatches of this share of the configured size.
EPISODIC_PROBE_SHARE = 1 / 16


def trainer_probe_sizes(cfg: EmbodiedConfig) -> list[int]:
    """The minibatch sizes the trainer probe times: the configured one and half of it, and for an
    episodic algorithm :data:`EPISODIC_PROBE_SHARE` of it (at least one sample per rank each)."""
    mb, ranks = macro_flow_of(cfg).train_minibatch, cfg.workers.trainer
    sizes = {mb, max(ranks, mb // 2)}
    if build_algorithm(cfg.algo).grouped:
        sizes.add(max(ranks, int(mb * EPISODIC_PROBE_SHARE)))
    return sorted(sizes)


class ShardProbe(DataParallel):
    """Rank 0 of ``world_size`` data-parallel ranks, alone: its share of every minibatch and of
    the scoring, no communication (what one rank computes, for profiling)."""

    strategy = "probe"

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def gather(self, local: torch.Tensor, n: int) -> torch.Tensor:
        return torch.cat([local] * self.world_size)[:n] if len(local) else local.new_zeros((n, *local.shape[1:]))


def allreduce_s(grad_mib: float, ranks: int, latency_s: float, s_per_mib: float) -> float:
    """Seconds of one ring all-reduce of ``grad_mib`` MiB over ``ranks`` ranks: ``2 (N - 1)``
    messages of ``grad_mib / N`` MiB each, at the measured cost of one message."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * (latency_s + grad_mib / ranks * s_per_mib)


def _probe_trainer(cfg: EmbodiedConfig, policy, obs, action_space, cores: int, log,
                   message: tuple[float, float] = (0.0, 0.0)) -> tuple[Probe, float, float]:
    """Time the trainer's own update (the algorithm's ``update``: advantages, minibatch gathers,
    loss, backward, gradient clipping, optimizer step, stats) on a synthetic batch of
    TRAINER_PROBE_MINIBATCHES minibatches of each of :func:`trainer_probe_sizes` (the configured
    size, half of it, and for an episodic algorithm a small share), per minibatch, on the
    trainer's device; one offload/onload.

    With ``workers.trainer=N`` ranks the probe is one rank's share of that work (its block of each
    minibatch, on 1 and ``cores / N`` threads) plus one all-reduce of the gradients per minibatch
    at the measured cost of a ``message`` ``(latency_s, s_per_mib)``; a sample ``(batch, devices,
    seconds)`` then counts the devices of all ranks."""
    probe = Probe("trainer")
    device = resolve_device(cfg.workers.trainer_device)
    policy = policy.to(device)
    optimizer = build_optimizer(policy.parameters(), cfg.algo)
    ranks = cfg.workers.trainer
    m = TRAINER_PROBE_MINIBATCHES
    algorithm = build_algorithm(dataclasses.replace(cfg.algo, epochs=1, num_minibatches=m, target_kl=None))
    reference = policy if algorithm.needs_reference else None
    parallel = ShardProbe(ranks) if ranks > 1 else SINGLE
    grad_mib = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad) / MIB
    combine_s = allreduce_s(grad_mib, ranks, *message)
    before = torch.get_num_threads()
    try:
        for b in trainer_probe_sizes(cfg):
            batch = synthetic_batch(policy, obs, b, m, cfg.algo.group_size, algorithm.needs_critic)
            for threads in sorted({1, max(1, cores // ranks)}):
                torch.set_num_threads(threads)

                def update() -> None:
                    algorithm.update(policy, optimizer, batch, cfg.algo.lr, reference=reference, device=device,
                                     parallel=parallel)

                seconds = time_call(update, warmup=1, repeats=3) / m + combine_s
                probe.add(b, threads * ranks, seconds)
                log(f"  trainer batch {b:>4} on {threads * ranks} core(s) ({ranks} rank(s)): {seconds * 1e3:8.2f} ms/minibatch")
    finally:
        torch.set_num_threads(before)
    offloader = Offloader(policy, optimizer)
    offload_s = offloader.offload().seconds
    onload_s = offloader.onload().seconds
    return probe, offload_s, onload_s


def synthetic_batch(policy, obs: dict[str, np.ndarray], envs: int, steps: int, group_size: int, values: bool) -> TrajectoryBatch:
    """A (steps, envs) batch as a rollout would record it: observations tiled from ``obs``;
    actions, logprobs (and values) from the policy, so PPO's ratios start at 1; random rewards and
    success; every env's episode ends at the last step (so GRPO's groups of ``group_size`` envs
    have outcomes and every decision enters its loss)."""
    tiled = _tile(obs, envs)
    with torch.no_grad():
        out = policy.act(to_torch(tiled, next(policy.parameters()).device))
    rng = np.random.default_rng(0)

    def repeat(x: Any) -> np.ndarray:
        return np.repeat(np.asarray(to_numpy(x))[None], steps, axis=0)  # (steps, envs, ...)

    shape = (steps, envs, policy.action_chunk)
    ends = np.zeros(shape, bool)
    ends[-1, :, -1] = True
    return TrajectoryBatch(
        obs={k: repeat(v) for k, v in tiled.items()},
        actions=repeat(out.actions),
        logprobs=repeat(out.logprobs.float()),
        rewards=rng.normal(size=shape).astype(np.float32),
        terminated=np.zeros(shape, bool),
        truncated=ends,
        valid=np.ones(shape, bool),
        values=repeat(out.values.float()) if values else None,
        final_values=np.zeros(shape[:2], np.float32) if values else None,
        last_values=to_numpy(out.values.float()).copy() if values else None,
        action_mask=None if out.mask is None else repeat(out.mask),
        success=rng.random(shape) < 0.5,
        group_ids=np.arange(envs) // max(1, min(group_size, envs)),
    ).check()


def probe_weight_sync(trainer_policy, rollout_policy) -> float:
    """Seconds of the local half of a weight sync: the trainer's :class:`WeightSyncer` export and
    the rollout's load (the message between them is priced by the transfer probe)."""
    syncer = WeightSyncer()
    return time_call(lambda: syncer.load(rollout_policy, syncer.export(trainer_policy, 0)), warmup=1, repeats=3)


class EchoWorker(Worker, Echo):
    """A worker that only bounces the message probe's messages."""


def probe_transfer(cluster: Cluster, obs_mib: float, log, ends: tuple[WorkerGroup, WorkerGroup] | None = None) -> tuple[float, float]:
    """(latency_s, s_per_mib) of one channel message between two worker processes: ``ends``, two
    one-rank groups of workers that are :class:`Echo` (the first serves, the second bounces), or
    two :class:`EchoWorker` started for it."""
    if cluster.backend != "ray":
        return 0.0, 0.0
    own = [] if ends is not None else [WorkerGroup(cluster, EchoWorker, 1, name=f"profile-echo-{end}", resources=RankResources(0.01))
                                       for end in ("serve", "bounce")]
    server, bouncer = ends if ends is not None else own
    a_in, b_in = Channel("a", server), Channel("b", bouncer)
    times = {}
    big = max(1.0, obs_mib)
    try:
        for mib in (0.001, big):
            payload = np.zeros(max(1, int(mib * MIB)), np.uint8)
            count = 30 if mib < 1 else 10
            srv = server.remote.serve(a_in, b_in, payload, count)
            bnc = bouncer.remote.bounce(b_in, a_in, count)
            wait_all(srv, bnc)
            times[mib] = srv.result()
    finally:
        for group in own:
            group.shutdown()
    s_per_mib = max(0.0, (times[big] - times[0.001]) / (big - 0.001))
    latency_s = max(0.0, times[0.001])
    log(f"  message latency {latency_s * 1e3:.2f} ms, {s_per_mib * 1e3:.2f} ms/MiB")
    return latency_s, s_per_mib


#: What :func:`profile_embodied` measures, in order (its progress lines count them).
PROFILE_STEPS = ("the env", "the rollout's inference", "a message between workers", "the trainer", "the weight sync")


class ProfileProgress:
    """The progress lines of a profile: ``[m2flow] profiling i/n: WHAT (detail) ... [seconds so far]``
    as each probe starts. The probes' own measurements are indented lines (a run logs them to its
    log file only)."""

    def __init__(self, log: Callable[[str], None], steps: tuple[str, ...] = PROFILE_STEPS) -> None:
        self.log, self.steps, self.done = log, steps, 0
        self.t0 = time.perf_counter()

    def next(self, detail: str = "") -> None:
        what = self.steps[self.done]
        self.done += 1
        self.log(f"[m2flow] profiling {self.done}/{len(self.steps)}: {what}{f' ({detail})' if detail else ''} ... "
                 f"[{time.perf_counter() - self.t0:.0f}s]")


def profile_embodied(cfg: EmbodiedConfig, cluster: Cluster, force: bool = False, log=print) -> Profile:
    """The measured profile of ``cfg``'s env, policy and trainer on this machine (cached). ``log``
    gets a progress line as each probe starts (:class:`ProfileProgress`) and the probes' measurements."""
    resources = resources_of(cfg)
    cores = len(resources)
    key = cache_key(_setup_key(cfg, cluster.backend))
    if not force:
        cached = load_cached(key)
        if cached is not None:
            runs = len(cached.get("meta", {}).get("learned", []))
            log(f"[m2flow] profile from cache ({key}{f', refined by {runs} run(s)' if runs else ''})")
            return Profile.from_dict(cached)
    log(f"[m2flow] profiling env, rollout and trainer on {cores} cores ...")
    t0 = time.perf_counter()
    progress = ProfileProgress(log)
    rollout_on_cpu = resolve_device(cfg.workers.rollout_device).type == "cpu"
    groups: list[WorkerGroup] = []
    shapes = f"{len(_probe_sizes(cfg.env.num_envs)) + (cores > 1 and cfg.env.num_envs > 1)} shapes of {cfg.env.id}"
    try:
        if cluster.backend == "ray":  # a hanging env is a timeout of the worker, not a hanging driver
            progress.next(f"{shapes}, in a worker process it starts")
            groups.append(env_probe_group(cfg, cluster))
            env_probe, obs, obs_space, action_space, policy, outputs, env_gib = _probe_env_in_a_worker(cfg, groups[0], cores, log)
        else:
            progress.next(shapes)
            env_probe, obs, obs_space, action_space, policy, outputs, env_gib = probe_env(cfg, cores, log)
        if cluster.backend == "ray" and rollout_on_cpu:  # what the rollout pays in a worker process, channels included
            progress.next("in a worker process it starts")
            groups.append(rollout_probe_group(cfg, cluster, obs_space, action_space))
            rollout_probe = _probe_rollout_in_a_worker(cfg, groups[1], groups[0], policy, outputs, cores, log)
        else:
            progress.next()
            rollout_probe = _probe_rollout(cfg, policy, outputs, action_space, cores, log)
        policy = policy.cpu()
        obs_mib = _obs_mib_per_env(obs)
        # between the env probe's and the rollout probe's workers where both ran (as in the pipeline)
        ends = (groups[0], groups[1]) if len(groups) == 2 else None
        progress.next()
        latency_s, s_per_mib = probe_transfer(cluster, obs_mib * cfg.env.num_envs, log, ends)
    finally:
        for group in groups:
            group.shutdown()
    trainer_policy = build_policy(cfg.policy, obs_space, action_space)
    progress.next(f"{len(trainer_probe_sizes(cfg))} batch sizes")
    trainer_probe, offload_s, onload_s = _probe_trainer(cfg, trainer_policy, obs, action_space, cores, log,
                                                        message=(latency_s, s_per_mib))
    progress.next()
    weights_mib = sum(p.numel() * p.element_size() for p in policy.state_dict().values()) / MIB
    sync_s = probe_weight_sync(trainer_policy, policy.to(resolve_device(cfg.workers.rollout_device)))
    log(f"  weight sync: {weights_mib:.2f} MiB exported and loaded in {sync_s * 1e3:.2f} ms")
    action_mib = float(np.prod(action_space.shape or (1,))) * 4 * cfg.policy.action_chunk / MIB
    components = {
        # an env that gains less than MIN_THREAD_SCALING from more cores (one process whose helper
        # threads barely use a second core, or noise) is priced at one core's cost, whatever it gets
        # a simulator on a GPU holds its state there (0 on the CPU: the per-core check leaves it out)
        "env": ComponentProfile("env", fit_threads(env_probe), memory_gib=env_gib[0], memory_per_item_gib=env_gib[1],
                                output_mib_per_item=obs_mib),
        "rollout": ComponentProfile(
            "rollout", fit_threads(rollout_probe), memory_gib=weights_mib / 1024,
            output_mib_per_item=action_mib, weights_mib=weights_mib,
        ),
        "trainer": ComponentProfile(
            "trainer", fit_threads(trainer_probe, cfg.workers.trainer), memory_gib=4 * weights_mib / 1024, offload_s=offload_s, onload_s=onload_s,
        ),
        WEIGHT_SYNC: ComponentProfile(WEIGHT_SYNC, CostModel(fixed_s=sync_s, per_item_s=0.0, scaling_exponent=0.0)),
    }
    return store_profile(key, components, (latency_s, s_per_mib), cluster, (env_probe, rollout_probe, trainer_probe), t0, log)


def store_profile(key: str, components: dict[str, ComponentProfile], message: tuple[float, float], cluster: Cluster,
                  probes: tuple[Probe, ...], t0: float, log: Callable[[str], None]) -> Profile:
    """The :class:`Profile` of a workflow's probed ``components`` and the cost of a ``message``
    ``(latency_s, s_per_mib)``, with its provenance in ``meta`` (cache key, hardware, the probes'
    samples, profiling seconds since ``t0``, date), stored in the profile cache under ``key``."""
    profile = Profile(
        components=components,
        transfer_latency_s=message[0],
        transfer_s_per_mib=message[1],
        cross_process_messages=cluster.backend == "ray",
        meta={
            "key": key,
            "hardware": hardware_fingerprint(),
            "probes": {p.name: [list(s) for s in p.samples] for p in probes},
            "profiling_s": time.perf_counter() - t0,
            "probed_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )
    path = store_cached(key, profile.to_dict())
    log(f"[m2flow] profiled in {time.perf_counter() - t0:.1f}s -> {path}")
    return profile
