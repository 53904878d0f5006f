"""The rollout probe: the rollout worker's inference and recording per call at several batch sizes
and thread counts, on the env probe's outputs (:func:`_probe_rollout`), or in a real rollout worker
fed over the channels (:func:`_probe_rollout_in_a_worker`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np
import torch

from embodied.profiler import Probe
from embodied.runtime import Channel, Cluster, RankResources, WorkerGroup
from envs.base import to_numpy
from embodied.algorithms import build_algorithm
from embodied.rl import is_text
from pipelines.collect import EnvOutput, TrajectoryRecorder, resolve_device
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.chunks import Pinning
from pipelines.onpolicy.workers import RolloutWorker
from pipelines.onpolicy.planning import macro_flow_of
from embodied.runtime.weights import WeightSyncer
from pipelines.probes.common import _probe_sizes
from pipelines.probes.transfer import Echo


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
