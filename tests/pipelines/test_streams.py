"""A ``streams`` plan at run time: one env and one rollout rank per stream, and switching to and
from it between iterations (as calibration and re-planning do) rebuilds the ranks it changes."""

from __future__ import annotations

import math

from embodied.config import apply_overrides
from embodied.runtime import Cluster
from pipelines.config import EmbodiedConfig
from pipelines.embodied import EmbodiedWorkflow
from pipelines.runner import Runner
from scheduler import Plan

POOL = {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}


def test_switching_to_streams_and_back_rebuilds_the_env_and_rollout_ranks():
    cfg = apply_overrides(EmbodiedConfig, {}, [
        "env.id=CartPole-v1", "env.num_envs=4", "env.backend=inprocess", "algo.rollout_steps=8",
        "algo.total_env_steps=1000", "plan.profile=false", "cluster.backend=ray", "cluster.num_cpus=2",
        "workers.env_cpus=0.5", "workers.rollout_cpus=0.5", "workers.trainer_cpus=0.5",
    ])
    workflow = EmbodiedWorkflow(cfg)
    runner = Runner(cfg, None, workflow)
    plans = [Plan("streams", POOL, 2, None, (), math.nan, lanes=2), Plan("colocated", POOL, 2, None, (), math.nan),
             Plan("streams", POOL, 2, None, (), math.nan, lanes=2)]
    with Cluster(cfg.cluster) as cluster:
        runner.start(cluster)
        rows = [runner.step()]
        for plan in plans:
            workflow.switch(workflow.layout_of(plan))
            rows.append(runner.step())
            ranks = 2 if plan.mode == "streams" else 1
            assert (workflow.env.num_ranks, workflow.rollout.num_ranks) == (ranks, ranks)
            assert len({loc.pid for loc in workflow.env.locations}) == ranks
    assert [r["plan/mode"] for r in rows[1:]] == ["streams", "colocated", "streams"]
    assert [r["env_steps"] for r in rows] == [32, 64, 96, 128]  # every env steps in every plan
    assert [r["weights/version"] for r in rows] == [0, 1, 2, 3]  # new rollout ranks got the latest weights
