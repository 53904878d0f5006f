"""A ``streams`` plan at run time: one stream rank (env and policy in one process) per stream, and
switching to and from it between iterations (as calibration and re-planning do) rebuilds the ranks
it changes."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.config import apply_overrides
from embodied.rl import TrajectoryBatch
from embodied.runtime import Channel, Cluster, ClusterConfig, Worker, WorkerGroup, wait_all
from embodied.runtime.weights import WeightSyncer
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.runner import Runner
from pipelines.onpolicy.workers import BlockRoute, EnvWorker, RolloutWorker, StreamWorker
from policies.registry import build_policy
from scheduler import Plan
from tests.pipelines.batches import assert_same_batch

POOL = {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}


def test_switching_to_streams_and_back_rebuilds_the_env_and_rollout_ranks():
    """streams -> colocated -> streams: the env and rollout workers give way to one stream worker
    per stream and come back; every env steps in every plan and new ranks get the latest weights."""
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
            ranks = {"stream": 2, "trainer": 1} if plan.mode == "streams" else {"env": 1, "rollout": 1, "trainer": 1}
            where = workflow.locations()
            assert {group: len(rows_) for group, rows_ in where.items()} == ranks
            assert len({r["pid"] for rows_ in where.values() for r in rows_}) == sum(ranks.values())
    assert [r["plan/mode"] for r in rows[1:]] == ["streams", "colocated", "streams"]
    assert [r["env_steps"] for r in rows] == [32, 64, 96, 128]  # every env steps in every plan
    assert [r["weights/version"] for r in rows] == [0, 1, 2, 3]  # new rollout ranks got the latest weights


def test_training_beside_the_next_collection_survives_switching_the_number_of_ranks():
    """algo.staleness=1: a collection's batches (one per stream, or one from the rollout rank) are
    trained on in the next iteration, after the plan may have changed how many ranks collect: the
    trainer takes exactly that collection's batches, never one of the next (a stale version)."""
    cfg = apply_overrides(EmbodiedConfig, {}, [
        "env.id=CartPole-v1", "env.num_envs=4", "env.backend=inprocess", "algo.rollout_steps=8", "algo.staleness=1",
        "algo.total_env_steps=1000", "plan.profile=false", "cluster.backend=ray", "cluster.num_cpus=2",
        "workers.env_cpus=0.5", "workers.rollout_cpus=0.5", "workers.trainer_cpus=0.5",
    ])
    workflow = EmbodiedWorkflow(cfg)
    runner = Runner(cfg, None, workflow)
    plans = [Plan("streams", POOL, 2, None, (), math.nan, lanes=2), Plan("colocated", POOL, 2, None, (), math.nan),
             Plan("colocated", POOL, 2, None, (), math.nan), Plan("streams", POOL, 2, None, (), math.nan, lanes=2)]
    with Cluster(cfg.cluster) as cluster:
        runner.start(cluster)
        rows = [runner.step()]  # the first collection: nothing to train on yet
        for plan in plans:
            workflow.switch(workflow.layout_of(plan))
            rows.append(runner.step())
    assert "time/train_s" not in rows[0]
    # each trained on the collection before it, made with the weights one update back (the first: none back)
    assert [r["weights/lag"] for r in rows[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert [r["weights/version"] for r in rows] == [0, 0, 1, 2, 3]


class Trainer(Worker):
    """Receives the collection's batches, as a trainer rank does."""

    def take(self, channel: Channel, n: int) -> list[TrajectoryBatch]:
        return channel.get_batch(0, n)


def collected(cfg: EmbodiedConfig, fused: bool) -> list[TrajectoryBatch]:
    """One collection of 2 streams at the same weights: by 2 stream workers (env and policy in one
    process each), or by 2 env ranks that split the envs and 2 rollout ranks, through channels."""
    T, grouped = cfg.algo.rollout_steps, cfg.algo.name == "grpo"
    with Cluster(ClusterConfig(backend="local")) as cluster:
        trainer = WorkerGroup(cluster, Trainer, 1, name="trainer")
        traj = Channel("trajectories", trainer)
        if fused:
            stream = WorkerGroup(cluster, StreamWorker, 2, cfg, 1, None, True, grouped, name="stream")
            obs_space, action_space = stream.on(0).spaces().result()
        else:
            env = WorkerGroup(cluster, EnvWorker, 2, cfg, 1, None, grouped, 2, name="env")
            obs_space, action_space = env.on(0).spaces().result()
            rollout = WorkerGroup(cluster, RolloutWorker, 2, cfg, obs_space, action_space, 2, None, True, grouped, name="rollout")
        torch.manual_seed(0)
        payload = WeightSyncer().export(build_policy(cfg.policy, obs_space, action_space), 5)
        if fused:
            stream.remote.load_weights(payload).wait()
            stream.remote.collect(T, traj, 0).wait()
            stream.remote.close().wait()
        else:
            rollout.remote.load_weights(payload).wait()
            obs, act = Channel("observations", rollout), Channel("actions", env, route=BlockRoute(1))
            wait_all(env.remote.interact(T, obs, act, 0), rollout.remote.generate(T, obs, act, traj))
            env.remote.close().wait()
        batches = trainer.remote.take(traj, 2).result()
    return sorted(batches, key=lambda b: float(b.obs["state"][0, 0, 0]))  # arrival order varies


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_a_stream_worker_collects_what_separate_env_and_rollout_ranks_collect(algo):
    """Fusing a stream's env and policy into one process changes where they run, not what they
    do: the same envs from the same seeds, the same sampling streams, the same batches."""
    cfg = apply_overrides(EmbodiedConfig, {}, [
        "env.id=HalfCheetah-v5", "env.num_envs=6", "env.backend=inprocess", "env.max_episode_steps=4",
        "algo.rollout_steps=6", f"algo.name={algo}", "algo.group_size=3", "algo.outcome=return",
    ])
    fused, separate = collected(cfg, fused=True), collected(cfg, fused=False)
    assert len(fused) == len(separate) == 2
    for a, b in zip(fused, separate):
        assert a.version == b.version == 5
        assert_same_batch(a, b)
    if algo == "grpo":  # the groups were reset from their shared seeds, episodes ended and padded
        assert sorted(b.group_ids.tolist() for b in fused) == [[0, 0, 0], [1, 1, 1]]
        assert not all(b.valid.all() for b in fused)
