"""Learning from runs: measured per-call costs refine the cached profile (pipelines/learn.py)."""

from __future__ import annotations

import pytest

from embodied.config import apply_overrides
from embodied.profiler import load_cached, store_cached
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.learn import CostLearner, describe_provenance, learned_runs, refine
from pipelines.onpolicy.planning import plan_embodied
from pipelines.workflow import Layout
from scheduler import ComponentProfile, CostModel, Plan, Profile, Resources

KEY = "testkey0000000000000"


def _cfg(*overrides: str) -> EmbodiedConfig:
    return apply_overrides(EmbodiedConfig, {}, ["env.id=CartPole-v1", "env.num_envs=8", "algo.rollout_steps=16",
                                                "algo.epochs=2", "algo.num_minibatches=4", "cluster.num_cpus=2",
                                                *overrides])


def _profile() -> Profile:
    return Profile({
        "env": ComponentProfile("env", CostModel(0.0, 0.01, 0.0)),          # 10 ms per env, one process
        "rollout": ComponentProfile("rollout", CostModel(0.002, 0.0, 0.0)),  # 2 ms per call
        "trainer": ComponentProfile("trainer", CostModel(0.0, 0.001, 1.0)),  # 1 ms per sample on one core
    }, meta={"key": KEY})


def _layout() -> Layout:
    plan = Plan("hybrid", {"env": (0,), "rollout": (1,), "trainer": (0, 1)}, 2, None, (), 1.0)
    return Layout.of(plan, Resources.cpu_cores(2, 8.0))


# The layout's predictions per iteration (see test_planning's hand computation): env 1.28 s,
# rollout 0.068 s, trainer 0.128 s. Measured: env twice as slow, rollout as profiled, trainer half.
MEASURED = {"time/sim_s": 2.56, "time/infer_s": 0.068, "time/train_s": 0.064, "plan/measured_over_predicted": 1.5}


def test_refine_replaces_the_probe_then_averages_runs_by_their_iterations():
    first, weight, record = refine(_profile(), {"env": 2.0, "trainer": 0.5}, "runs/a", (2, 5), date="d1")
    assert weight == 1.0  # nothing learned before: the run's measurement replaces the probe's
    assert first["env"].cost.per_item_s == pytest.approx(0.02)
    assert first["trainer"].cost.per_item_s == pytest.approx(0.0005)
    assert first["rollout"].cost == _profile()["rollout"].cost
    assert record == {"run": "runs/a", "iterations": [2, 5], "date": "d1", "factors": {"env": 2.0, "trainer": 0.5},
                      "weight": 1.0, "replaced": {"env": CostModel(0.0, 0.01, 0.0).to_dict(),
                                                  "trainer": CostModel(0.0, 0.001, 1.0).to_dict()}}
    # a second run of 4 iterations against the first's 4: the geometric mean of the two measurements
    second, weight, _ = refine(first, {"env": 0.5}, "runs/b", (2, 5), date="d2")
    assert weight == 0.5
    assert second["env"].cost.per_item_s == pytest.approx(0.02 * 0.5**0.5)
    assert [r["run"] for r in learned_runs(second)] == ["runs/a", "runs/b"]
    assert "refined by 2 run(s) (8 iterations)" in describe_provenance(second)
    assert "not yet refined" in describe_provenance(_profile())


def test_a_runs_measured_costs_change_the_cache_and_the_next_plans_prediction(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path))
    cfg = _cfg()
    store_cached(KEY, _profile().to_dict())
    before = plan_embodied(cfg, Profile.from_dict(load_cached(KEY)))
    learner = CostLearner(EmbodiedWorkflow(cfg), enabled=True, run="runs/first", iterations=3)
    learner.start(_profile())
    outcomes = [learner.observe(i, dict(MEASURED), _layout()) for i in range(1, 6)]
    # iteration 1 is a warm-up; iterations 2-4 are measured, then the profile is refined once
    assert outcomes[:3] == [None, None, None] and outcomes[4] is None
    learned = outcomes[3]
    assert learned is not None and learned.factors == pytest.approx({"env": 2.0, "rollout": 1.0, "trainer": 0.5})
    cached = Profile.from_dict(load_cached(KEY))
    assert cached["env"].cost.per_item_s == pytest.approx(0.02)
    assert cached["trainer"].cost.per_item_s == pytest.approx(0.0005)
    (record,) = learned_runs(cached)
    assert record["run"] == "runs/first" and record["iterations"] == [2, 4]
    assert record["replaced"]["env"] == CostModel(0.0, 0.01, 0.0).to_dict()
    after = plan_embodied(cfg, cached)
    # the env is the bottleneck: twice its cost moves the next run's prediction up
    assert after.best.predicted_iteration_s > 1.3 * before.best.predicted_iteration_s


def test_learning_off_or_as_profiled_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path))
    cfg = _cfg()
    store_cached(KEY, _profile().to_dict())
    off = CostLearner(EmbodiedWorkflow(cfg), enabled=False, run="runs/off", iterations=1)
    off.start(_profile())
    assert off.observe(2, dict(MEASURED), _layout()) is None and off.finish() is None
    exact = {"time/sim_s": 1.28, "time/infer_s": 0.068, "time/train_s": 0.128, "plan/measured_over_predicted": 1.0}
    same = CostLearner(EmbodiedWorkflow(cfg), enabled=True, run="runs/same", iterations=1)
    same.start(_profile())
    assert same.observe(2, exact, _layout()) is None
    assert learned_runs(Profile.from_dict(load_cached(KEY))) == []


def test_a_short_run_learns_at_its_end(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path))
    cfg = _cfg()
    store_cached(KEY, _profile().to_dict())
    learner = CostLearner(EmbodiedWorkflow(cfg), enabled=True, run="runs/short", iterations=4)
    learner.start(_profile())
    for i in (1, 2):
        assert learner.observe(i, dict(MEASURED), _layout()) is None
    learned = learner.finish()
    assert learned is not None and learned.record["iterations"] == [2, 2]
    assert learner.finish() is None  # once per run
