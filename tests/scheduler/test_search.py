"""plan(): agreement with a brute-force search, hand-checked choices, feasibility and errors."""

import dataclasses
import math
from itertools import combinations, product

import pytest

from scheduler import (
    MODES,
    Plan,
    PlanningError,
    Resources,
    MacroFlow,
    memory_violations,
    peak_memory_gib,
    plan,
    predict,
    sequential_plan,
    simulate,
)
from tests.scheduler.profiles import component, profile, random_instance


# ----------------------------------------------------------------------------- brute force


def _is_full_class(devices, eligible_classes):
    return any(devices == cls.indices for cls in eligible_classes)


def _pairwise_disjoint(sets):
    return all(not set(a) & set(b) for a, b in combinations(sets, 2))


def _modes_of(placement, spec, full):
    """The modes whose definition the placement satisfies (the definitions, not the enumerators)."""
    shared = [c for c in spec.components if c in spec.hybrid_shared]
    others = [c for c in spec.components if c not in spec.hybrid_shared]
    checks = {
        "colocated": all(_is_full_class(placement[c], full[c]) for c in spec.components),
        "disaggregated": _pairwise_disjoint([placement[c] for c in spec.components])
        or (len(others) > 1 and len({placement[c] for c in others}) == 1
            and _pairwise_disjoint([placement[others[0]], *(placement[c] for c in shared)])),
        "hybrid": all(_is_full_class(placement[c], full[c]) for c in shared)
        and _pairwise_disjoint([placement[c] for c in others]),
        # the pool components together on all (>= 2) cores of a CPU class, the rest on full classes
        "shared": bool(spec.pool) and len({placement[c] for c in spec.pool}) == 1
        and len(placement[spec.pool[0]]) > 1 and all(_is_full_class(placement[c], full[c]) for c in spec.components)
        and all(k.kind == "cpu" for k in full[spec.pool[0]] if k.indices == placement[spec.pool[0]]),
    }
    checks["streams"] = checks["shared"]  # the same placement, cut into streams
    return [m for m in MODES if checks[m]]


def brute_force_best_s(workflow, prof, resources, max_chunks):
    """Min predicted time over every placement of every mode (any device subsets within one class,
    idle devices allowed), every chunk count, every offload set and every micro-batch candidate."""
    spec = workflow.spec
    eligible = {
        c: [cls for cls in resources.classes() if prof[c].device_kind in (None, cls.kind)] for c in spec.components
    }
    subsets = {
        c: [s for cls in eligible[c] for size in range(1, len(cls.indices) + 1) for s in combinations(cls.indices, size)]
        for c in spec.components
    }
    best = math.inf
    for assignment in product(*(subsets[c] for c in spec.components)):
        placement = dict(zip(spec.components, assignment))
        modes = _modes_of(placement, spec, eligible)
        if not modes:
            continue
        for k in range(1, min(spec.chunk_total(workflow), max_chunks) + 1):
            shapes = [(modes[0], 1)] if modes[0] not in ("shared", "streams") else []
            if "shared" in modes:  # any number of lanes up to the pool's cores and the chunks
                shapes += [("shared", n) for n in range(2, min(k, len(placement[spec.pool[0]])) + 1)]
            if "streams" in modes and 2 <= k <= len(placement[spec.pool[0]]):  # one stream per chunk
                shapes += [("streams", k)]
            for mode, lanes in shapes:
                for size in range(len(spec.components) + 1):
                    for offload in combinations(spec.components, size):
                        for microbatch in spec.microbatch_candidates(workflow):
                            for sharing in _gpu_sharings(placement, spec, resources, mode):
                                candidate = Plan(mode, placement, k, microbatch, offload, math.nan, lanes, sharing)
                                if memory_violations(candidate, prof, workflow, resources):
                                    continue
                                best = min(best, predict(candidate, prof, workflow, resources)[0])
    return best


def _gpu_sharings(placement, spec, resources, mode):
    """Both GPU sharings where the env is on GPUs that hold the rollout (outside the CPU-pool modes),
    switch where they hold only the trainer, else none."""
    if "env" not in placement or any(resources.devices[d].kind != "gpu" for d in placement["env"]):
        return [None]
    others = [c for c in placement if c != "env" and set(placement[c]) & set(placement["env"])]
    if not others:
        return [None]
    if placement["rollout"] == placement["env"] and mode not in ("shared", "streams"):
        return ["switch", "overlap"]
    return ["switch"]


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("kind", ["embodied", "reasoning"])
def test_plan_agrees_with_brute_force(seed, kind):
    workflow, prof, resources = random_instance(seed, kind)
    expected = brute_force_best_s(workflow, prof, resources, max_chunks=3)
    if math.isinf(expected):
        with pytest.raises(PlanningError):
            plan(workflow, prof, resources, max_chunks=3)
        return
    result = plan(workflow, prof, resources, max_chunks=3)
    assert result.best.predicted_iteration_s == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert result.best_timeline.makespan_s == pytest.approx(expected, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------- properties


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind", ["embodied", "reasoning"])
def test_candidates_fit_in_memory_and_are_ranked(seed, kind):
    workflow, prof, resources = random_instance(seed + 100, kind)
    try:
        result = plan(workflow, prof, resources, max_chunks=4)
    except PlanningError:
        return
    times = [round(p.predicted_iteration_s, 9) for p, _ in result.candidates]  # ties within 1 ns
    assert times == sorted(times)
    for candidate, timeline in result.candidates:
        assert memory_violations(candidate, prof, workflow, resources) == []
        peak = peak_memory_gib(candidate, prof, workflow, resources)
        assert all(peak[d] <= resources.devices[d].memory_gib + 1e-9 for d in peak)
        assert timeline.makespan_s == candidate.predicted_iteration_s
        assert candidate.mode in MODES


def test_plan_is_deterministic():
    workflow, prof, resources = random_instance(7)
    first, second = plan(workflow, prof, resources), plan(workflow, prof, resources)
    assert [p.to_dict() for p, _ in first.candidates] == [p.to_dict() for p, _ in second.candidates]
    assert first.table() == second.table()


# --------------------------------------------------------------------------- hand-checked


def _tight_one_device_profile():
    return profile(
        component("env", per_item_s=0.25, memory_gib=4.0, offload_s=0.1, onload_s=0.2),
        component("rollout", per_item_s=0.25, memory_gib=4.0, offload_s=0.3, onload_s=0.4),
        component("trainer", fixed_s=2.0, memory_gib=8.0, offload_s=0.5, onload_s=0.6),
    )


def test_offloads_exactly_what_memory_requires():
    workflow = MacroFlow.embodied(num_envs=4, rollout_steps=2)
    # 10 GiB: rollout phase holds env 4 + rollout 4 (+ trainer 8 unless offloaded); train phase holds
    # trainer 8 (+ env, rollout unless offloaded): everything must offload. Time as in the simulator's
    # hand case: 5 s rollout phase (3 rollout + 2 env calls) + 2 s train + 2.1 s of switches = 9.1 s.
    tight = plan(workflow, _tight_one_device_profile(), Resources.cpu_cores(1, 10.0))
    assert tight.best.offload == ("env", "rollout", "trainer")
    assert tight.best.predicted_iteration_s == pytest.approx(9.1)
    # 16 GiB holds all three: no offloading, 7 s.
    roomy = plan(workflow, _tight_one_device_profile(), Resources.cpu_cores(1, 16.0))
    assert roomy.best.offload == ()
    assert roomy.best.predicted_iteration_s == pytest.approx(7.0)
    assert roomy.best.num_chunks == 1  # chunking on one device only ties; fewer chunks win ties


def test_train_microbatch_is_the_largest_that_fits():
    # trainer: 1 GiB + 0.5 GiB/sample on a 5 GiB device -> at most 8 samples per call.
    # Candidates for 4 envs x 8 steps = 32 samples: 32, 16, 8, 4, 2, 1 -> 8.
    prof = profile(component("env", per_item_s=0.1), component("rollout", per_item_s=0.1),
                   component("trainer", fixed_s=1.0, memory_gib=1.0, memory_per_item_gib=0.5))
    result = plan(MacroFlow.embodied(num_envs=4, rollout_steps=8), prof, Resources.cpu_cores(1, 5.0))
    assert result.best.train_microbatch == 8
    # 9 rollout calls (8 steps + bootstrap) and 8 env calls of 0.4 s = 6.8 s; trainer 32 / 8 = 4 calls of 1 s
    assert result.best.predicted_iteration_s == pytest.approx(6.8 + 4.0)


def test_reasoning_plan_with_hand_made_profile():
    # 4 prompts x 2 samples on 3 CPU cores, no scaling over devices, 0.1 s per message.
    # disaggregated (rollout:0 reward:1 trainer:2), by hand:
    #   k=1: rollout [0,2.5] reward [2.6,3.6] trainer [3.7,5.2] weight-sync message -> 5.3
    #   k=2: see test_reasoning_streams_micro_batches_by_hand -> 4.8
    #   k=3: chunks of 4,2,2 samples; rollout ends 1.5, 2.5, 3.5; reward ends 2.1, 2.85, 3.85;
    #        trainer [2.2,3.2] [3.2,3.95] [3.95,4.7] -> 4.8 (a tie: fewer chunks win)
    #   colocated k=1: 2.5 + 1.0 + 1.5 = 5.0 on all three cores, no messages.
    #   disaggregated k=1 with rollout and reward sharing cores 0-1 (no message between them):
    #        rollout [0,2.5] reward [2.5,3.5] trainer [3.6,5.1] weight sync message -> 5.2
    prof = profile(component("rollout", 0.5, 0.25, 0.0), component("reward", 0.0, 0.125, 0.0),
                   component("trainer", 0.5, 0.125, 0.0), latency_s=0.1)
    workflow, resources = MacroFlow.reasoning(num_prompts=4, group_size=2), Resources.cpu_cores(3, 8.0)
    result = plan(workflow, prof, resources)
    assert (result.best.mode, result.best.num_chunks) == ("disaggregated", 2)
    assert result.best.placement == {"rollout": (0,), "reward": (1,), "trainer": (2,)}
    assert result.best.predicted_iteration_s == pytest.approx(4.8)
    forced = {k: plan(workflow, prof, resources, force_mode="disaggregated", force_chunks=k).best.predicted_iteration_s
              for k in (1, 3)}
    assert forced == pytest.approx({1: 5.2, 3: 4.8})
    assert sequential_plan(workflow, resources, prof).predicted_iteration_s == pytest.approx(5.0)
    assert result.best.train_microbatch == 8


def test_plan_prefers_pipelining_when_overlap_pays():
    # env on CPU cores only, rollout and trainer on a GPU: chunking overlaps simulation and inference.
    prof = profile(component("env", 0.01, 0.01, device_kind="cpu"), component("rollout", 0.01, 0.01, device_kind="gpu"),
                   component("trainer", 1.0, 0.0, device_kind="gpu"))
    resources = Resources.gpus(1, 80.0) + Resources.cpu_cores(2, 4.0)
    result = plan(MacroFlow.embodied(num_envs=64, rollout_steps=10), prof, resources)
    baseline = sequential_plan(MacroFlow.embodied(num_envs=64, rollout_steps=10), resources, prof)
    assert result.best.num_chunks > 1
    assert result.best.predicted_iteration_s < baseline.predicted_iteration_s
    assert result.best.placement["env"] == (1, 2) and result.best.placement["rollout"] == (0,)


# --------------------------------------------------------------------------- baseline, errors


def test_sequential_plan_without_profile_is_conservative():
    baseline = sequential_plan(MacroFlow.embodied(num_envs=8, rollout_steps=4), Resources.gpus(2, 80.0))
    assert baseline.mode == "colocated" and baseline.num_chunks == 1
    assert baseline.placement == {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}
    assert baseline.offload == ("env", "rollout", "trainer")
    assert math.isnan(baseline.predicted_iteration_s)


def test_planning_error_names_the_component_and_device():
    prof = profile(component("env", 0.1), component("rollout", 0.1), component("trainer", 1.0, memory_gib=100.0))
    with pytest.raises(PlanningError, match=r"'trainer'.*gpu0.*80 GiB"):
        plan(MacroFlow.embodied(num_envs=4, rollout_steps=2), prof, Resources.gpus(2, 80.0))


def test_planning_error_when_one_phase_does_not_fit():
    # env and rollout run in the same phase and cannot offload each other away.
    prof = profile(component("env", 0.1, memory_gib=6.0), component("rollout", 0.1, memory_gib=6.0),
                   component("trainer", 1.0, memory_gib=1.0))
    with pytest.raises(PlanningError, match=r"device 0 \(cpu0.*phase 'rollout'.*env 6 \+ rollout 6"):
        plan(MacroFlow.embodied(num_envs=4, rollout_steps=2), prof, Resources.cpu_cores(1, 10.0))


def test_planning_error_for_missing_device_kind_and_component():
    workflow = MacroFlow.embodied(num_envs=4, rollout_steps=2)
    gpu_only = profile(component("env"), component("rollout", device_kind="gpu"), component("trainer"))
    with pytest.raises(PlanningError, match="'rollout' needs gpu devices"):
        plan(workflow, gpu_only, Resources.cpu_cores(2, 8.0))
    with pytest.raises(PlanningError, match=r"lacks component\(s\) \['trainer'\]"):
        plan(workflow, profile(component("env"), component("rollout")), Resources.cpu_cores(2, 8.0))
    with pytest.raises(PlanningError, match="no disaggregated placement"):  # one core: nothing to split
        plan(workflow, profile(component("env"), component("rollout"), component("trainer")),
             Resources.cpu_cores(1, 8.0), force_mode="disaggregated")


def test_force_arguments_are_validated():
    workflow, prof, resources = random_instance(3)
    with pytest.raises(ValueError, match="force_mode"):
        plan(workflow, prof, resources, force_mode="pipelined")
    with pytest.raises(ValueError, match="force_chunks"):
        plan(workflow, prof, resources, force_chunks=workflow.num_envs + 1)


def test_table_rows_and_text():
    workflow, prof, resources = random_instance(5)
    result = plan(workflow, prof, resources, keep=5)
    rows = result.table()
    assert len(rows) == len(result.candidates) <= 5
    mode, chunks, placement, predicted_s, utilization = rows[0]
    assert (mode, chunks, predicted_s) == (result.best.mode, result.best.num_chunks, result.best.predicted_iteration_s)
    assert "trainer:" in placement and 0.0 <= utilization <= 1.0
    text = result.format_table()
    assert text.splitlines()[0].split() == ["mode", "chunks", "placement", "predicted_s", "mean_util"]


def test_overlapped_training_moves_the_trainer_to_its_own_core():
    # training (1.6 s; a second core does not speed it up) dominates collection (<= 0.55 s): with one
    # step of staleness the trainer gets a core of its own and runs beside the collection on the other.
    prof = profile(component("env", 0.0, 0.1, 0.0), component("rollout", 0.05, 0.0, 0.0),
                   component("trainer", 0.0, 0.4, 0.0))
    resources = Resources.cpu_cores(2, 8.0)
    sync = plan(MacroFlow.embodied(2, 2), prof, resources).best
    overlap = plan(MacroFlow.embodied(2, 2, train_overlap=True), prof, resources).best
    # collection at best two streams, one env each on its own core (0.05 + 0.1 + 0.05 + 0.1 + 0.05 s), then training
    assert sync.mode == "streams" and sync.predicted_iteration_s == pytest.approx(0.35 + 1.6)
    assert overlap.mode == "disaggregated"
    assert overlap.placement == {"env": (0,), "rollout": (0,), "trainer": (1,)}
    assert overlap.predicted_iteration_s == pytest.approx(1.6)


def test_streams_two_cores_by_hand_and_chosen_when_fastest():
    # 2 envs, 1 step; env 0.25 s and rollout 0.5 s per env, neither faster on more cores; trainer 0.5 s.
    # Two streams (chunk c's env and rollout ranks on core c, taking turns), side by side:
    #   core c: rollout t0 c [0, .5]  env t0 c [.5, .75]  rollout t1 c [.75, 1.25]
    #   trainer on both cores [1.25, 1.75]
    # Shared 2 lanes takes 2.0 s (tests/scheduler/test_simulate.py), hybrid 2 chunks 2.5 s.
    prof = profile(component("env", per_item_s=0.25, exponent=0.0), component("rollout", per_item_s=0.5, exponent=0.0),
                   component("trainer", fixed_s=0.5))
    workflow, resources = MacroFlow.embodied(num_envs=2, rollout_steps=1), Resources.cpu_cores(2, 8.0)
    pool = {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}
    streams = Plan("streams", pool, 2, None, (), math.nan, lanes=2)
    timeline = simulate(streams, prof, workflow, resources)
    times = {s.label: (s.start_s, s.end_s) for s in timeline.spans}
    for c in (0, 1):
        assert times[f"rollout t0 c{c}"] == (0.0, 0.5) and times[f"env t0 c{c}"] == (0.5, 0.75)
        assert times[f"rollout t1 c{c}"] == (0.75, 1.25)
        assert {s.device for s in timeline.spans if s.chunk == c} == {c}  # a stream stays on its core
    assert times["trainer epoch 0"] == (1.25, 1.75) and timeline.makespan_s == 1.75
    best = plan(workflow, prof, resources).best
    assert (best.mode, best.num_chunks, best.lanes) == ("streams", 2, 2)
    assert best.predicted_iteration_s == pytest.approx(1.75)
    # a stream's env and policy share one process: its actions and observations cost nothing, while
    # the trajectories to the trainer and the weights back pay a cross-process message (0.1 s each)
    slow = dataclasses.replace(prof, transfer_latency_s=0.1, cross_process_messages=True)
    timeline = simulate(streams, slow, workflow, resources)
    times = {s.label: (s.start_s, s.end_s) for s in timeline.spans}
    assert times["env t0 c0"] == (0.5, 0.75) and times["rollout t1 c0"] == (0.75, 1.25)
    assert timeline.makespan_s == pytest.approx(1.75 + 2 * 0.1)
    # a colocated plan on the same cores pays for every hop: its env and rollout are processes of their own
    colocated = Plan("colocated", pool, 2, None, (), math.nan)
    assert simulate(colocated, slow, workflow, resources).makespan_s > simulate(colocated, prof, workflow, resources).makespan_s + 3 * 0.1


def test_streams_plans_are_validated():
    pool = {"env": (0, 1, 2), "rollout": (0, 1, 2), "trainer": (0, 1, 2)}
    with pytest.raises(ValueError, match="one chunk per stream"):
        Plan("streams", pool, 3, None, (), math.nan, lanes=2)
    with pytest.raises(ValueError, match="lanes"):
        Plan("streams", pool, 1, None, (), math.nan, lanes=1)
    assert Plan("streams", pool, 2, None, (), math.nan, lanes=2).stream_devices("env") == ((0, 1), (2,))
    assert Plan("streams", pool, 2, None, (), math.nan, lanes=2).placement_str().endswith("streams=2")
    with pytest.raises(ValueError, match="only a streams plan"):
        Plan("colocated", pool, 2, None, (), math.nan).stream_devices("env")
    with pytest.raises(ValueError, match="exceeds the pool"):
        simulate(Plan("streams", {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}, 3, None, (), math.nan, lanes=3),
                 profile(component("env"), component("rollout"), component("trainer")),
                 MacroFlow.embodied(num_envs=3, rollout_steps=1), Resources.cpu_cores(2, 8.0))


# ------------------------------------------------------------------ a GPU simulator sharing its GPU


def _gpu_sim(switch_s, contention):
    prof = profile(component("env", per_item_s=0.5, device_kind="gpu"),
                   component("rollout", per_item_s=0.5, device_kind="gpu"),
                   component("trainer", fixed_s=1.0, device_kind="gpu"))
    return dataclasses.replace(prof, gpu_switch_s=switch_s, gpu_contention=contention)


@pytest.mark.parametrize("switch_s, contention, chosen, predicted_s", [
    (0.1, 1.5, "overlap", 3.5),   # the hand-computed timelines of test_simulate: 3.5 s vs 4.5 s
    (0.0, 2.0, "switch", 4.0),    # no gain from overlapping: the tie goes to the simpler switch
    (0.0, 1.9, "overlap", 3.9),   # overlap 0.5 + 2 x 0.95 + 0.5 + 1 = 3.9 beats switch's 4.0
])
def test_the_planner_chooses_how_a_gpu_simulator_shares_its_gpu_from_the_profile(switch_s, contention, chosen, predicted_s):
    workflow = MacroFlow.embodied(num_envs=2, rollout_steps=1, train_epochs=1)
    result = plan(workflow, _gpu_sim(switch_s, contention), Resources.gpus(1, 80.0), force_chunks=2)
    assert {p.gpu_sharing for p, _ in result.candidates} == {"switch", "overlap"}
    assert result.best.gpu_sharing == chosen
    assert result.best.predicted_iteration_s == pytest.approx(predicted_s)
    assert f"gpu={chosen}" in result.format_table()


def test_cpu_plans_have_no_gpu_sharing():
    workflow = MacroFlow.embodied(num_envs=2, rollout_steps=1, train_epochs=1)
    prof = _gpu_sim(0.1, 1.5)
    prof = dataclasses.replace(prof, components={n: dataclasses.replace(c, device_kind=None) for n, c in prof.components.items()})
    result = plan(workflow, prof, Resources.cpu_cores(2, 16.0))
    assert all(p.gpu_sharing is None for p, _ in result.candidates)
