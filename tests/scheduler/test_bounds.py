"""The work-conservation lower bound: no plan is predicted faster, and it is tight where it should be."""

from __future__ import annotations

import math
import random

import pytest

from scheduler import PlanningError, Resources, MacroFlow, gap_to_bound, lower_bound, plan, sequential_plan, simulate
from tests.scheduler.profiles import component, profile, random_component, random_instance
from tests.scheduler.test_search import brute_force_best_s


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("kind", ["embodied", "reasoning"])
def test_no_plan_beats_the_bound(seed, kind):
    workflow, prof, resources = random_instance(seed, kind)
    bound = lower_bound(workflow, prof, resources)
    best = brute_force_best_s(workflow, prof, resources, max_chunks=3)
    if not math.isinf(best):
        assert best >= bound.iteration_s * (1 - 1e-12)
    try:
        result = plan(workflow, prof, resources, max_chunks=4)
    except PlanningError:
        return
    assert result.bound == bound
    for candidate, timeline in result.candidates:
        assert timeline.makespan_s >= bound.iteration_s * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_no_plan_beats_the_bound_on_a_pool_of_cores(seed):
    """CPU cores only, where shared lanes and streams run the env's and the rollout's calls side
    by side (before the bound counted that, 333 of 3,000 such instances had a plan below it)."""
    rng = random.Random(seed)
    workflow = MacroFlow.embodied(num_envs=rng.randint(2, 16), rollout_steps=rng.randint(1, 4),
                                 train_epochs=rng.randint(1, 2), train_overlap=rng.random() < 0.3)
    components = [random_component(rng, n, memory=False) for n in ("env", "rollout", "trainer")]
    prof = profile(*components, latency_s=rng.choice([0.0, 0.001]))
    resources = Resources.cpu_cores(rng.choice([2, 3, 4]), 16.0)
    bound = lower_bound(workflow, prof, resources)
    result = plan(workflow, prof, resources, max_chunks=4)
    assert any(p.mode in ("shared", "streams") for p, _ in result.candidates)
    for candidate, timeline in result.candidates:
        assert timeline.makespan_s >= bound.iteration_s * (1 - 1e-12), candidate


def test_reasoning_bound_by_hand():
    # As in test_search's hand-made reasoning case: 8 samples on 3 cores, nothing scales over cores.
    # rollout 0.5 + 8 * 0.25 = 2.5 s, reward 8 * 0.125 = 1.0 s, trainer 0.5 + 8 * 0.125 = 1.5 s at any
    # core count: 5.0 core-seconds at one core each, 5.0 / 3 cores = 1.67 s; but the rollout alone
    # takes 2.5 s, which bounds every plan (the best one takes 4.8 s).
    prof = profile(component("rollout", 0.5, 0.25, 0.0), component("reward", 0.0, 0.125, 0.0),
                   component("trainer", 0.5, 0.125, 0.0), latency_s=0.1)
    bound = lower_bound(MacroFlow.reasoning(num_prompts=4, group_size=2), prof, Resources.cpu_cores(3, 8.0))
    assert bound.work_device_s == pytest.approx({"rollout": 2.5, "reward": 1.0, "trainer": 1.5})
    assert bound.fastest_s == pytest.approx({"rollout": 2.5, "reward": 1.0, "trainer": 1.5})
    assert bound.devices == 3 and bound.iteration_s == pytest.approx(2.5) and bound.limited_by == "rollout"


def test_embodied_bound_by_hand_and_the_speedup_ceiling_it_gives():
    # 2 envs x 2 steps on 2 cores. env: one process (exponent 0), 0.1 s per env: 2 steps x 0.2 s =
    # 0.4 s at any core count, so 0.4 core-s on one core. rollout: 0.1 s per env, perfect scaling:
    # 3 calls (steps 0, 1 and the bootstrap) x 0.2 s = 0.6 s on one core, 0.3 s on two: 0.6 core-s
    # either way. trainer: 0.1 s per sample over 4 samples, perfect scaling: 0.4 core-s.
    # Work: 1.4 core-s / 2 cores = 0.7 s; slowest component alone: env 0.2 s (two streams step one
    # env each, side by side: 2 steps x 0.1 s). Bound 0.7 s.
    # Sequential (colocated, one chunk): env 0.4 + rollout 0.3 + trainer 0.2 = 0.9 s: no plan can be
    # more than 0.9 / 0.7 = 1.29x faster, whatever the chunking.
    prof = profile(component("env", 0.0, 0.1, 0.0), component("rollout", 0.0, 0.1, 1.0), component("trainer", 0.0, 0.1, 1.0))
    workflow, resources = MacroFlow.embodied(num_envs=2, rollout_steps=2), Resources.cpu_cores(2, 8.0)
    bound = lower_bound(workflow, prof, resources)
    assert bound.work_device_s == pytest.approx({"env": 0.4, "rollout": 0.6, "trainer": 0.4})
    assert bound.fastest_s == pytest.approx({"env": 0.2, "rollout": 0.3, "trainer": 0.2})
    assert bound.iteration_s == pytest.approx(0.7) and bound.limited_by == "work"
    assert sequential_plan(workflow, resources, prof).predicted_iteration_s == pytest.approx(0.9)
    assert plan(workflow, prof, resources).best.predicted_iteration_s >= 0.7


def test_streams_run_a_one_thread_components_calls_side_by_side():
    # 8 envs x 4 steps on 2 cores; the rollout is one thread (exponent 0), 0.1 s per env: as one
    # chain 5 calls x 0.8 s = 4.0 s on any core count. Two streams run chains of 4 envs side by
    # side: 5 x 0.4 s = 2.0 s. env: 4 x 0.08 = 0.32 core-s; trainer: one call of 32 samples at
    # 1 ms each, 0.032 core-s. Work: (0.32 + 4.0 + 0.032) / 2 = 2.176 s, the bound (it was the
    # one-chain rollout's 4.0 s, and the planner's streams plan beat it).
    prof = profile(component("env", 0.0, 0.01, 0.0), component("rollout", 0.0, 0.1, 0.0), component("trainer", 0.0, 0.001, 1.0))
    workflow, resources = MacroFlow.embodied(num_envs=8, rollout_steps=4), Resources.cpu_cores(2, 8.0)
    bound = lower_bound(workflow, prof, resources)
    assert bound.fastest_s == pytest.approx({"env": 0.16, "rollout": 2.0, "trainer": 0.016})
    assert bound.iteration_s == pytest.approx(2.176) and bound.limited_by == "work"
    result = plan(workflow, prof, resources)
    assert result.best.mode == "streams" and result.best.predicted_iteration_s < 4.0
    # the streams plan reaches the bound: env and rollout alternate on each core, the trainer after
    assert result.best.predicted_iteration_s == pytest.approx(bound.iteration_s)
    assert all(timeline.makespan_s >= bound.iteration_s * (1 - 1e-12) for _, timeline in result.candidates)


def test_fixed_costs_make_one_chunk_the_cheapest_work():
    # A per-call overhead is paid once per call: the bound uses whole batches, and chunked plans
    # pay it per chunk, so the bound stays below every chunked plan.
    prof = profile(component("env", 0.05, 0.01, 0.0), component("rollout", 0.2, 0.01, 1.0), component("trainer", 0.3, 0.01, 1.0))
    workflow, resources = MacroFlow.embodied(num_envs=8, rollout_steps=4), Resources.cpu_cores(2, 8.0)
    bound = lower_bound(workflow, prof, resources)
    assert bound.work_device_s["env"] == pytest.approx(4 * (0.05 + 0.08))
    for k in (1, 2, 4, 8):
        assert plan(workflow, prof, resources, force_chunks=k).best.predicted_iteration_s >= bound.iteration_s


def test_bound_serializes():
    workflow, prof, resources = random_instance(3)
    data = lower_bound(workflow, prof, resources).to_dict()
    assert set(data) == {"iteration_s", "work_device_s", "fastest_s", "devices", "limited_by"}


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("kind", ["embodied", "reasoning"])
def test_the_gap_to_the_bound_splits_into_parts_none_of_them_negative(seed, kind):
    workflow, prof, resources = random_instance(seed, kind)
    bound = lower_bound(workflow, prof, resources)
    try:
        result = plan(workflow, prof, resources, max_chunks=4)
    except PlanningError:
        return
    for candidate, timeline in result.candidates:
        gap = gap_to_bound(timeline, bound)
        assert gap.lost_device_s == pytest.approx(timeline.makespan_s * bound.devices - sum(bound.work_device_s.values()))
        # whole calls at the most efficient device count are the least work: no plan's calls do less
        assert all(s >= -1e-9 for s in gap.excess_work_device_s.values()), (candidate, gap)
        assert all(s >= 0 for s in gap.overhead_device_s.values())
        if candidate.gpu_sharing == "overlap":
            continue  # env and rollout spans overlap on a GPU: "idle" goes negative by their overlap
        assert gap.idle_device_s >= -1e-9
        # a GPU simulator's GPUs may do up to 2 / gpu_contention of work per second: the bound
        # divides by that capacity, not by the devices
        gpu_simulator = kind == "embodied" and prof["env"].device_kind in (None, "gpu") and any(
            d.kind == "gpu" for d in resources.devices) and prof.gpu_contention < 2
        if bound.limited_by == "work" and not gpu_simulator:
            assert gap.lost_device_s / bound.devices == pytest.approx(timeline.makespan_s - bound.iteration_s)


def test_gap_to_bound_by_hand():
    # 4 envs, 1 step, 1 epoch on 2 cores. env 0.1 s per env on any core count (one process), rollout
    # 0.2 s per env on one core and 0.2 / 2**0.5 on two (exponent 0.5), two calls (the step's and the
    # bootstrap), trainer 0.1 s per sample, linear. Least work: env 0.4, rollout 1.6 (one core),
    # trainer 0.4 core-s: 2.4 over 2 cores = 1.2 s.
    prof = profile(component("env", 0.0, 0.1, 0.0), component("rollout", 0.0, 0.2, 0.5),
                   component("trainer", 0.0, 0.1, 1.0))
    workflow, resources = MacroFlow.embodied(num_envs=4, rollout_steps=1), Resources.cpu_cores(2, 8.0)
    bound = lower_bound(workflow, prof, resources)
    assert bound.iteration_s == pytest.approx(1.2) and bound.limited_by == "work"
    # Sequential on both cores, nothing idle: env 0.4 s on two cores (0.8 core-s: +0.4), rollout
    # 2 x 0.8 / 2**0.5 s on two (+1.6 * 2**0.5 - 1.6 = +0.66), trainer 0.2 s on two (0.4: +0).
    timeline = simulate(sequential_plan(workflow, resources, prof), prof, workflow, resources)
    gap = gap_to_bound(timeline, bound)
    assert gap.idle_device_s == pytest.approx(0.0, abs=1e-9) and gap.overhead_device_s == {}
    assert gap.excess_work_device_s == pytest.approx({"env": 0.4, "rollout": 1.6 * 2**0.5 - 1.6, "trainer": 0.0})
    assert gap.lost_device_s / 2 == pytest.approx(timeline.makespan_s - 1.2)
    assert gap.describe() == "rollout calls +0.33 s, env calls +0.20 s"
