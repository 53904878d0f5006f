"""algo.staleness: on-policy by default; with 1 the trainer updates on the previous batch while the
next one is collected, never on a batch more than one weight version old."""

from __future__ import annotations

import pytest

from embodied.config import apply_overrides
from embodied.errors import ConfigError
from embodied.runtime import Cluster, WorkerError
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.runner import Runner


def _runner(*overrides: str) -> Runner:
    cfg = apply_overrides(EmbodiedConfig, {}, [
        "env.id=CartPole-v1", "env.num_envs=4", "env.backend=inprocess", "algo.rollout_steps=8",
        "algo.total_env_steps=160", "plan.profile=false", "cluster.backend=local", *overrides,
    ])
    return Runner(cfg, None, EmbodiedWorkflow(cfg))


def _iterations(runner: Runner, n: int) -> list[dict]:
    with Cluster(runner.cfg.cluster) as cluster:
        runner.start(cluster)
        return [runner.step() for _ in range(n)]


def test_on_policy_trains_every_batch_with_the_weights_that_collected_it():
    rows = _iterations(_runner(), 3)
    assert [r["weights/lag"] for r in rows] == [0.0, 0.0, 0.0]
    assert [r["weights/version"] for r in rows] == [0, 1, 2]


def test_staleness_one_trains_the_previous_batch_beside_the_next_collection():
    runner = _runner("algo.staleness=1")
    rows = _iterations(runner, 5)  # 160 / 32 = 5 iterations
    assert "losses/policy" not in rows[0]  # the first iteration only collects
    # the first update is on-policy (the weights have not moved yet); later ones are one version behind
    assert [r["weights/lag"] for r in rows[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert [r["weights/version"] for r in rows] == [0, 0, 1, 2, 3]  # the rollout runs one version behind
    assert runner.workflow.trainer_state()["version"] == 5  # the last iteration trained on its own batch too
    assert all(r["time/overlap_wait_s"] is not None for r in rows)


def test_trainer_refuses_trajectories_older_than_the_staleness_allows():
    runner = _runner("algo.staleness=1")
    workflow = runner.workflow
    with Cluster(runner.cfg.cluster) as cluster:
        runner.start(cluster)
        runner.step()  # collects; its batch waits for the trainer
        state = workflow.trainer_state()
        workflow.load_trainer_state({**state, "version": state["version"] + 2})
        with pytest.raises(WorkerError, match=r"stale trajectories: rollout used weights version\(s\) \[0\].*version 2"):
            workflow.trainer.remote.train(workflow.traj_channel, 1, 1e-3).result()


def test_staleness_beyond_one_is_a_config_error():
    with pytest.raises(ConfigError, match="algo.staleness must be 0"):
        _runner("algo.staleness=2")
