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

One module per probe: :mod:`~pipelines.probes.env`, :mod:`~pipelines.probes.rollout`,
:mod:`~pipelines.probes.trainer` (and the weight sync), :mod:`~pipelines.probes.transfer` (a
message between workers); :mod:`~pipelines.probes.profile` runs them all into a cached profile,
:mod:`~pipelines.probes.common` holds what they share. Every name is re-exported here.
"""

from __future__ import annotations

from pipelines.probes.common import (  # noqa: F401
    MIB,
    MIN_THREAD_SCALING,
    _probe_sizes,
    fit_threads,
)
from pipelines.probes.transfer import (  # noqa: F401
    Echo,
    EchoWorker,
    probe_transfer,
)
from pipelines.probes.env import (  # noqa: F401
    ENV_PROBE_WARMUP,
    ENV_PROBE_REPEATS,
    ShapeMeasurement,
    simulator_memory_gib,
    reset_simulator_memory,
    pinned_to,
    EnvProbe,
    EnvReplay,
    EnvProbeWorker,
    probe_env,
    env_memory_gib,
    env_probe_group,
    _probe_env_in_a_worker,
)
from pipelines.probes.rollout import (  # noqa: F401
    ROLLOUT_PROBE_DECISIONS,
    rollout_probe_decisions,
    _tile_rows,
    tile_output,
    record_seconds_per_call,
    _rollout_probe,
    _probe_rollout,
    ProbeRolloutWorker,
    rollout_probe_group,
    _probe_rollout_in_a_worker,
)
from pipelines.probes.trainer import (  # noqa: F401
    _tile,
    TRAINER_PROBE_MINIBATCHES,
    EPISODIC_PROBE_SHARE,
    trainer_probe_sizes,
    ShardProbe,
    allreduce_s,
    _probe_trainer,
    synthetic_batch,
    probe_weight_sync,
)
from pipelines.probes.profile import (  # noqa: F401
    _setup_key,
    _obs_mib_per_env,
    PROFILE_STEPS,
    ProfileProgress,
    profile_embodied,
    store_profile,
)
