"""M2Flow for the reasoning workflow: the plan from a hand-made profile against a schedule worked
out by hand, the chunk counts the runtime can execute as planned, re-planning factors, and the
measured profile with its cache."""

from __future__ import annotations

import pytest

from embodied.config import apply_overrides
from embodied.runtime import Cluster, ClusterConfig
from pipelines.reasoning.config import ReasoningConfig
from embodied.profiler import Probe
from pipelines.probes import MIN_THREAD_SCALING
from pipelines.reasoning.planning import (
    chunk_choices,
    measured_factors,
    per_minibatch,
    plan_reasoning,
    probe_layouts,
    profile_reasoning,
)
from pipelines.reasoning.workflow import ReasoningWorkflow
from pipelines.workflow import Layout
from scheduler import ComponentProfile, CostModel, Profile, Resources, sequential_plan
from tests.pipelines.reasoning.tiny import tiny_config


def build(*overrides: str) -> ReasoningConfig:
    return apply_overrides(ReasoningConfig, {}, ["data.train_batch_size=4", "algo.group_size=2", "algo.num_minibatches=2",
                                                 "cluster.num_cpus=2", *overrides])


def hand_made() -> Profile:
    """Nothing scales over cores; 0.1 s per message between different cores, free on the same ones.
    rollout 0.5 s + 0.25 s/response, reward 0.125 s/response, trainer 0.25 s/response."""
    def component(name: str, fixed: float, per_item: float) -> ComponentProfile:
        return ComponentProfile(name, CostModel(fixed, per_item, 0.0))

    return Profile({c.name: c for c in (component("rollout", 0.5, 0.25), component("reward", 0.0, 0.125),
                                        component("trainer", 0.0, 0.25))}, transfer_latency_s=0.1)


def test_plan_from_a_hand_made_profile_matches_the_schedule_by_hand() -> None:
    # 4 prompts x 2 responses = 8 on 2 cores; 2 minibatches -> chunk counts 1 and 2.
    # colocated, 1 chunk:  rollout 2.5 + reward 1.0 + trainer 2.0 on both cores            = 5.5
    # colocated, 2 chunks: rollout 1.5, reward 0.5, rollout 1.5, reward 0.5; then 2 x 1.0  = 6.0
    # disaggregated (rollout+reward: core 0, trainer: core 1), 1 chunk:
    #   rollout [0, 2.5] reward [2.5, 3.5] trainer [3.6, 5.6] weight-sync message    -> 5.7
    # disaggregated, 2 chunks: rollout [0,1.5] reward [1.5,2.0] rollout [2.0,3.5] reward [3.5,4.0]
    #   trainer c0 [2.1, 3.1] trainer c1 [4.1, 5.1] weight-sync message               -> 5.2
    # hybrid (rollout 0, reward 1, trainer both), 2 chunks: the trainer waits for both cores'
    #   generation phase: reward c1 ends 3.6; trainer [3.6, 5.6]; sync message          -> 5.7
    cfg = build()
    result = plan_reasoning(cfg, hand_made())
    best = result.best
    assert (best.mode, best.num_chunks) == ("disaggregated", 2)
    assert best.placement == {"rollout": (0,), "reward": (0,), "trainer": (1,)}
    assert best.predicted_iteration_s == pytest.approx(5.2)
    times = {(p.mode, p.num_chunks): p.predicted_iteration_s for p, _ in result.candidates}
    assert times[("colocated", 1)] == pytest.approx(5.5) and times[("colocated", 2)] == pytest.approx(6.0)
    assert times[("disaggregated", 1)] == pytest.approx(5.7) and times[("hybrid", 2)] == pytest.approx(5.7)
    spans = {s.label: (s.start_s, s.end_s) for s in result.best_timeline.spans}
    assert spans["trainer epoch 0 c0"] == pytest.approx((2.1, 3.1)) and spans["reward c1"] == pytest.approx((3.5, 4.0))
    workflow = ReasoningWorkflow(cfg).macro_flow()
    assert sequential_plan(workflow, Resources.cpu_cores(2, 8.0), hand_made()).predicted_iteration_s == pytest.approx(5.5)
    # forced settings are honoured
    forced = plan_reasoning(build("plan.mode=colocated"), hand_made()).best
    assert (forced.mode, forced.num_chunks) == ("colocated", 1)


def test_chunks_carry_whole_minibatches() -> None:
    assert chunk_choices(build("data.train_batch_size=12", "algo.num_minibatches=6")) == [1, 2, 3, 6]
    assert chunk_choices(build("data.train_batch_size=12", "algo.num_minibatches=6", "plan.max_chunks=4")) == [1, 2, 3]
    assert chunk_choices(build("algo.num_minibatches=1")) == [1]
    assert chunk_choices(build("algo.num_minibatches=4", "plan.chunks=2")) == [2]
    assert {p.num_chunks for p, _ in plan_reasoning(build("algo.num_minibatches=1"), hand_made()).candidates} == {1}


def test_measured_factors_by_hand() -> None:
    cfg = build()
    layout = Layout.of(plan_reasoning(cfg, hand_made()).best, Resources.cpu_cores(2, 8.0))  # disaggregated, 2 chunks
    # predicted: rollout 2 x 1.5 = 3.0 s, reward 2 x 0.5 = 1.0 s, trainer 8 x 0.25 = 2.0 s
    metrics = {"time/generate_s": 6.0, "time/reward_s": 1.0, "time/train_s": 1.0}
    assert measured_factors(cfg, hand_made(), layout, metrics) == pytest.approx({"rollout": 2.0, "reward": 1.0, "trainer": 0.5})


def test_probes_pin_the_workers_as_the_plans_do() -> None:
    # one thread: generation on core 0, the trainer on the last core (disaggregated); a thread per
    # core: all three on every core (colocated)
    assert probe_layouts(2) == {1: {"rollout": (0,), "reward": (0,), "trainer": (1,)},
                                2: {"rollout": (0, 1), "reward": (0, 1), "trainer": (0, 1)}}
    assert probe_layouts(1) == {1: {"rollout": (0,), "reward": (0,), "trainer": (0,)}}


def test_a_trainer_probed_at_one_size_costs_per_minibatch() -> None:
    one = Probe("trainer")
    one.add(8, 1, 0.2)  # one minibatch of 8
    per_minibatch(one, 8)
    assert sorted(one.samples) == [(8, 1, 0.2), (16, 1, 0.4)]
    two = Probe("trainer")
    two.add(16, 2, 0.3)  # two minibatches of 8
    per_minibatch(two, 8)
    assert sorted(two.samples) == [(8, 2, 0.15), (16, 2, 0.3)]
    both = Probe("trainer")
    both.add(8, 1, 0.2)
    both.add(16, 1, 0.5)
    per_minibatch(both, 8)
    assert len(both.samples) == 2  # two sizes measured: left as they are


@pytest.mark.slow
def test_profile_is_measured_at_the_planned_sizes_then_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config(tmp_path, "data.train_batch_size=4", "algo.num_minibatches=2", "cluster.num_cpus=2")
    prompts = ReasoningWorkflow(cfg).prepared().train
    lines: list[str] = []
    with Cluster(ClusterConfig(backend="local")) as cluster:
        first = profile_reasoning(cfg, prompts, cluster, log=lines.append)
        again = profile_reasoning(cfg, prompts, cluster, log=lines.append)
    assert again.to_dict() == first.to_dict() and "profile from cache" in lines[-1]
    probes = first.meta["probes"]
    assert sorted({size for size, _, _ in probes["rollout"]}) == [8, 16]  # 2 chunks of 8 responses, or 1 of 16
    assert sorted({threads for _, threads, _ in probes["rollout"]}) == [1, 2]
    assert sorted({size for size, _, _ in probes["trainer"]}) == [8, 16]  # one and two minibatches of 2 x 4
    assert set(first.components) == {"rollout", "reward", "trainer", "weight_sync"}
    assert first["rollout"].weights_mib > 0 and first["rollout"].memory_per_item_gib > 0
    assert all(seconds > 0 for p in probes.values() for _, _, seconds in p)
    # priced as the workers run them: a thread per core only where more threads pay off
    assert all(first[c].cost.scaling_exponent in (0.0,) or first[c].cost.scaling_exponent >= MIN_THREAD_SCALING
               for c in ("rollout", "trainer"))
    assert first["weight_sync"].cost.fixed_s >= 0 and first["trainer"].onload_s > 0
    result = plan_reasoning(cfg, first)
    assert result.best.num_chunks in (1, 2) and result.bound is not None
