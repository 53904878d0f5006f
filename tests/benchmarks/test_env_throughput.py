"""The env-throughput benchmark's reference loops: ``raw xP`` and ``raw xP lockstep`` are what our
env workers are measured against, so they must measure what they claim."""

from __future__ import annotations

import pytest

from benchmarks.env_throughput import Workload, raw_gymnasium, raw_procs_variant
from envs.config import EnvConfig

K = 3  # envs per process


def pendulum() -> Workload:
    # A cheap continuous-action env: the loops only need something to step.
    return Workload("pendulum", EnvConfig(id="Pendulum-v1", obs_mode="state", max_episode_steps=20), K, 0.2, raw_gymnasium)


@pytest.mark.timeout(120)
def test_lockstep_processes_step_the_same_batches_and_end_together() -> None:
    """In lockstep every process does the same number of batch steps in a window (so the total is
    a multiple of procs * K), with a spinning barrier (a core each) and a blocking one (more
    processes than cores), windows after windows; two lockstep groups alive at once must not
    share their barrier's memory (a freed block on the multiprocessing heap gets reused)."""
    workload = pendulum()
    groups = [
        raw_procs_variant(workload, 1, K, procs=2, cores=2, lockstep=True),  # spins
        raw_procs_variant(workload, 1, K, procs=3, cores=2, lockstep=True),  # blocks
        raw_procs_variant(workload, 1, K, procs=2, cores=2),  # free-running
    ]
    try:
        assert [g.name for g in groups] == ["raw x2 lockstep", "raw x3 lockstep", "raw x2"]
        for _ in range(3):
            for group in groups:
                result = group.window(0.2)  # type: ignore[misc]
                assert result["steps"] > 0 and result["steps_per_s"] > 0
                if "lockstep" in group.name:
                    assert result["steps"] % (group.procs * K) == 0, (group.name, result)
    finally:
        for group in groups:
            group.close()


@pytest.mark.timeout(60)
def test_free_running_processes_run_the_whole_window() -> None:
    variant = raw_procs_variant(pendulum(), 1, K, procs=2, cores=2)
    try:
        short, long = variant.window(0.1), variant.window(0.4)  # type: ignore[misc]
        assert long["steps"] > 2 * short["steps"]  # steps grow with the window: the loops ran it
        assert 0 < long["steps_per_cpu_s"] < float("inf")
    finally:
        variant.close()
