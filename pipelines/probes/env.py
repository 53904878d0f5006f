"""The env probe: a chunk's ``VecEnv.step`` at several chunk sizes and process counts, pinned to
the cores it prices, with the policy's inference between steps (:func:`probe_env`), in this process
or in an :class:`EnvProbeWorker`; a simulator's GPU memory per shape (:func:`env_memory_gib`)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch

from embodied.profiler import Probe
from embodied.runtime import Channel, Cluster, RankResources, Worker, WorkerGroup, WorkerTimeout
from envs.base import random_actions
from embodied.threads import thread_env
from envs.multiprocess import MultiprocessVecEnv
from envs.registry import make_vec_env
from pipelines.collect import EnvOutput, env_output, to_torch, with_instructions
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.modes import simulator_device
from policies.registry import build_policy
from pipelines.probes.common import _probe_sizes
from pipelines.probes.transfer import Echo


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
