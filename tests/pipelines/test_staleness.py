"""algo.staleness: on-policy by default; with 1 the trainer updates on the previous batch while the
next one is collected, never on a batch more than one weight version old."""

from __future__ import annotations

import pytest

from embodied.config import apply_overrides
from embodied.errors import ConfigError
from embodied.runtime import Cluster, ClusterConfig, WorkerError
from pipelines.config import TrainConfig
from pipelines.embodied_ppo import EmbodiedPPO


def _algo(*overrides: str) -> EmbodiedPPO:
    cfg = apply_overrides(TrainConfig, {}, [
        "env.id=CartPole-v1", "env.num_envs=4", "env.backend=inprocess", "algo.rollout_steps=8",
        "algo.total_env_steps=160", "plan.profile=false", "cluster.backend=local", *overrides,
    ])
    return EmbodiedPPO(cfg, run=None)


def _iterations(algo: EmbodiedPPO, n: int) -> list[dict]:
    rows = []
    with Cluster(algo.cfg.cluster) as cluster:
        algo.plan(cluster, log=lambda *_: None)
        algo._build(cluster)
        for _ in range(n):
            rows.append(algo.iterate())
    return rows


def test_on_policy_trains_every_batch_with_the_weights_that_collected_it():
    rows = _iterations(_algo(), 3)
    assert [r["weights/lag"] for r in rows] == [0.0, 0.0, 0.0]
    assert [r["weights/version"] for r in rows] == [0, 1, 2]


def test_staleness_one_trains_the_previous_batch_beside_the_next_collection():
    algo = _algo("algo.staleness=1")
    rows = _iterations(algo, algo.total_iterations)  # 160 / 32 = 5 iterations
    assert "losses/policy" not in rows[0]  # the first iteration only collects
    # the first update is on-policy (the weights have not moved yet); later ones are one version behind
    assert [r["weights/lag"] for r in rows[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert [r["weights/version"] for r in rows] == [0, 0, 1, 2, 3]  # the rollout runs one version behind
    assert not algo._pending  # the last iteration trained on its own batch too: nothing left untrained
    assert all(r["time/overlap_wait_s"] is not None for r in rows)


def test_trainer_refuses_trajectories_older_than_the_staleness_allows():
    algo = _algo("algo.staleness=1")
    with Cluster(algo.cfg.cluster) as cluster:
        algo.plan(cluster, log=lambda *_: None)
        algo._build(cluster)
        algo.iterate()
        state = algo.trainer.call("state").result()
        algo.trainer.call("load_state", state["model"], state["optimizer"], state["version"] + 2).wait()
        with pytest.raises(WorkerError, match=r"stale trajectories: rollout used weights version\(s\) \[0\].*version 2"):
            algo._train_call().result()


def test_staleness_beyond_one_is_a_config_error():
    with pytest.raises(ConfigError, match="algo.staleness must be 0"):
        _algo("algo.staleness=2")
