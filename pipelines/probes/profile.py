"""The profile of the embodied workflow: every probe in turn (:data:`PROFILE_STEPS`, with
:class:`ProfileProgress` lines), fitted and cached per env, policy and hardware
(:func:`profile_embodied`, :func:`store_profile`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from embodied.config import to_dict
from embodied.profiler import Probe, cache_key, hardware_fingerprint, load_cached_profile, store_cached
from embodied.runtime import Cluster, WorkerGroup
from envs.base import to_numpy
from embodied.rl import is_text
from pipelines.collect import resolve_device
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.planning import macro_flow_of, resources_of
from policies.registry import build_policy
from scheduler import WEIGHT_SYNC, ComponentProfile, CostModel, Profile
from pipelines.probes.common import MIB, _probe_sizes, fit_threads
from pipelines.probes.env import _probe_env_in_a_worker, env_probe_group, probe_env
from pipelines.probes.rollout import _probe_rollout, _probe_rollout_in_a_worker, rollout_probe_decisions, rollout_probe_group
from pipelines.probes.transfer import probe_transfer
from pipelines.probes.trainer import _probe_trainer, probe_weight_sync, trainer_probe_sizes


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


def _obs_mib_per_env(obs: dict[str, Any]) -> float:
    return sum((v[0].nbytes if is_text(v) else to_numpy(v)[0].nbytes) for v in obs.values()) / MIB


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
        cached = load_cached_profile(key, log)
        if cached is not None:
            runs = len(cached.meta.get("learned", []))
            log(f"[m2flow] profile from cache ({key}{f', refined by {runs} run(s)' if runs else ''})")
            return cached
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
