"""The simulator against hand-computed timelines, and its invariants on seeded random plans."""

import dataclasses
import math
from dataclasses import replace
import random

import pytest

from scheduler import Plan, Resources, MacroFlow, chunk_sizes, simulate, task_graph
from scheduler.graph import WORK, Dep, Task
from scheduler.memory import switchable_components
from scheduler.simulate import schedule
from tests.scheduler.profiles import component, profile, random_instance

NAN = math.nan


def _plan(mode, placement, chunks, offload=(), microbatch=None):
    return Plan(mode, placement, chunks, microbatch, tuple(offload), NAN)


def _times(timeline):
    """Span label -> (start_s, end_s) (a task on several devices has one span per device, same times)."""
    return {s.label: (s.start_s, s.end_s) for s in timeline.spans}


# ------------------------------------------------------------------------------- hand-checked


def _env_rollout_profile(**trainer):
    # env and rollout take 1 s for the whole batch of 4 envs (0.25 s per env), no fixed cost.
    return profile(
        component("env", per_item_s=0.25),
        component("rollout", per_item_s=0.25),
        component("trainer", fixed_s=0.5, **trainer),
    )


DISAGGREGATED = {"env": (0,), "rollout": (1,), "trainer": (2,)}

# Per chunk the chain is rollout t0 -> env t0 -> rollout t1 -> ... -> env t(T-1) -> rollout tT
# (the last rollout computes bootstrap values): T env calls, T + 1 rollout calls.


def test_disaggregated_two_chunks_one_step_by_hand():
    # Chunks of 2 envs: every env/rollout task takes 0.5 s.
    #   dev1 rollout: t0c0 [0,.5]  t0c1 [.5,1]  t1c0 (after env t0c0 at 1.0) [1,1.5]  t1c1 (env t0c1 1.5) [1.5,2]
    #   dev0 env:     t0c0 [.5,1]  t0c1 [1,1.5]
    #   dev2 trainer:   [2, 2.5]  (one call on all 4 samples: fixed 0.5 s)
    # One chunk: rollout [0,1], env [1,2], rollout [2,3], trainer [3,3.5].
    workflow, resources = MacroFlow.embodied(num_envs=4, rollout_steps=1), Resources.cpu_cores(3, 8.0)
    timeline = simulate(_plan("disaggregated", DISAGGREGATED, 2), _env_rollout_profile(), workflow, resources)
    times = _times(timeline)
    assert times["env t0 c1"] == (1.0, 1.5)
    assert times["rollout t1 c1"] == (1.5, 2.0)
    assert times["trainer epoch 0"] == (2.0, 2.5)
    assert timeline.makespan_s == 2.5
    assert timeline.utilization == pytest.approx({0: 1.0 / 2.5, 1: 2.0 / 2.5, 2: 0.5 / 2.5})
    one_chunk = simulate(_plan("disaggregated", DISAGGREGATED, 1), _env_rollout_profile(), workflow, resources)
    assert one_chunk.makespan_s == 3.5


def test_disaggregated_two_chunks_two_steps_by_hand():
    #   rollout: t0c0 [0,.5] t0c1 [.5,1] t1c0 [1,1.5] t1c1 [1.5,2] t2c0 (env t1c0 ends 2) [2,2.5] t2c1 [2.5,3]
    #   env:     t0c0 [.5,1] t0c1 [1,1.5] t1c0 (rollout t1c0 ends 1.5) [1.5,2] t1c1 (r t1c1 ends 2) [2,2.5]
    #   trainer: [3, 3.5]. One chunk: 3 rollout + 2 env calls of 1 s + 0.5 = 5.5.
    workflow, resources = MacroFlow.embodied(num_envs=4, rollout_steps=2), Resources.cpu_cores(3, 8.0)
    timeline = simulate(_plan("disaggregated", DISAGGREGATED, 2), _env_rollout_profile(), workflow, resources)
    times = _times(timeline)
    assert times["env t1 c0"] == (1.5, 2.0)
    assert times["rollout t2 c1"] == (2.5, 3.0)
    assert timeline.makespan_s == 3.5
    one_chunk = simulate(_plan("disaggregated", DISAGGREGATED, 1), _env_rollout_profile(), workflow, resources)
    assert one_chunk.makespan_s == 5.5


def test_transfer_latency_and_size_by_hand():
    # 1 chunk, T=1, env output 2 MiB/env, rollout output 0 MiB, message cost 0.1 s + 0.05 s/MiB.
    # rollout t0 [0,1]; actions (0 MiB) 0.1 s; env [1.1,2.1]; obs 4 envs * 2 MiB = 8 MiB -> 0.5 s;
    # rollout t1 [2.6,3.6]; trajectories 4 * 1 step * (2 + 0) MiB -> 0.5 s; trainer [4.1,4.6];
    # the weight sync to dev1 is a 0 MiB message (0.1 s) with no local cost: a zero-length span at 4.7.
    prof = profile(component("env", per_item_s=0.25, output_mib_per_item=2.0), component("rollout", per_item_s=0.25),
                   component("trainer", fixed_s=0.5), latency_s=0.1, s_per_mib=0.05)
    timeline = simulate(_plan("disaggregated", DISAGGREGATED, 1), prof,
                        MacroFlow.embodied(num_envs=4, rollout_steps=1), Resources.cpu_cores(3, 8.0))
    times = _times(timeline)
    assert times["env t0 c0"] == pytest.approx((1.1, 2.1))
    assert times["rollout t1 c0"] == pytest.approx((2.6, 3.6))
    assert times["trainer epoch 0"] == pytest.approx((4.1, 4.6))
    assert timeline.makespan_s == pytest.approx(4.7)


def test_colocated_with_context_switches_by_hand():
    # One device; T=2, 1 chunk; env 1 s, rollout 1 s, trainer 2 s per call.
    # Device order: onload env .2, onload rollout .4, r0 1, e0 1, r1 1, e1 1, r2 1, offload env .1,
    # offload rollout .3, onload trainer .6, trainer 2, offload trainer .5  = 9.1 s; busy (work) 7 s.
    prof = profile(
        component("env", per_item_s=0.25, offload_s=0.1, onload_s=0.2),
        component("rollout", per_item_s=0.25, offload_s=0.3, onload_s=0.4),
        component("trainer", fixed_s=2.0, offload_s=0.5, onload_s=0.6),
    )
    placement = {"env": (0,), "rollout": (0,), "trainer": (0,)}
    timeline = simulate(_plan("colocated", placement, 1, offload=("trainer", "env", "rollout")), prof,
                        MacroFlow.embodied(num_envs=4, rollout_steps=2), Resources.cpu_cores(1, 8.0))
    times = _times(timeline)
    assert times["env t0 c0"] == pytest.approx((1.6, 2.6))
    assert times["onload trainer @0"] == pytest.approx((6.0, 6.6))
    assert timeline.makespan_s == pytest.approx(9.1)
    assert timeline.utilization[0] == pytest.approx(7.0 / 9.1)
    kinds = sorted(s.kind for s in timeline.spans if s.kind != "work")
    assert kinds == ["offload"] * 3 + ["onload"] * 3


def test_weight_sync_across_devices_by_hand():
    # As the first hand case plus a 10 MiB weight sync at 0.1 s/MiB and a 0.25 s local load on dev1:
    # trainer ends 2.5; message 1.0 s; sync [3.5, 3.75].
    prof = profile(component("env", per_item_s=0.25), component("rollout", per_item_s=0.25, weights_mib=10.0),
                   component("trainer", fixed_s=0.5), component("weight_sync", fixed_s=0.25), s_per_mib=0.1)
    timeline = simulate(_plan("disaggregated", DISAGGREGATED, 2), prof,
                        MacroFlow.embodied(num_envs=4, rollout_steps=1), Resources.cpu_cores(3, 8.0))
    sync = [s for s in timeline.spans if s.kind == "sync"]
    assert [(s.device, s.start_s, s.end_s) for s in sync] == [(1, 3.5, 3.75)]
    assert timeline.makespan_s == 3.75


def test_reasoning_streams_micro_batches_by_hand():
    # 4 prompts x 2 samples, 2 chunks of 4 samples, 0.1 s per message, no device scaling.
    # rollout 0.5 + 0.25/sample = 1.5 s/chunk: [0,1.5] [1.5,3]
    # reward 0.125/sample = 0.5 s:             [1.6,2.1] [3.1,3.6]
    # trainer 0.5 + 0.125/sample = 1.0 s:        [2.2,3.2] [3.7,4.7]
    # weight sync: free locally, 0.1 s message -> zero-length span at 4.8.
    prof = profile(component("rollout", 0.5, 0.25, 0.0), component("reward", 0.0, 0.125, 0.0),
                   component("trainer", 0.5, 0.125, 0.0), latency_s=0.1)
    placement = {"rollout": (0,), "reward": (1,), "trainer": (2,)}
    timeline = simulate(_plan("disaggregated", placement, 2), prof, MacroFlow.reasoning(num_prompts=4, group_size=2),
                        Resources.cpu_cores(3, 8.0))
    times = _times(timeline)
    assert times["reward c0"] == pytest.approx((1.6, 2.1))
    assert times["trainer epoch 0 c1"] == pytest.approx((3.7, 4.7))
    assert timeline.makespan_s == pytest.approx(4.8)


def test_chunk_sizes_partition_and_balance():
    for total in range(1, 40):
        for k in range(1, total + 1):
            sizes = chunk_sizes(total, k)
            assert len(sizes) == k and sum(sizes) == total
            assert max(sizes) - min(sizes) <= 1 and list(sizes) == sorted(sizes, reverse=True)
    with pytest.raises(ValueError):
        chunk_sizes(3, 4)


def test_tasks_use_chunk_sizes_as_batches():
    workflow = MacroFlow.embodied(num_envs=10, rollout_steps=2)
    prof = profile(component("env", per_item_s=1.0), component("rollout", per_item_s=1.0), component("trainer", 1.0))
    placement = {"env": (0,), "rollout": (0,), "trainer": (0,)}
    tasks = task_graph(_plan("colocated", placement, 4), prof, workflow, Resources.cpu_cores(1, 8.0))
    env_step0 = [t.duration_s for t in tasks if t.component == "env" and t.step == 0]
    assert env_step0 == [3.0, 3.0, 2.0, 2.0]  # chunk_sizes(10, 4), 1 s per env


# ----------------------------------------------------------------------------- invariants


def _random_plan(rng: random.Random, workflow, prof, resources):
    """Any placement (arbitrary device subsets), chunk count and offload set; memory ignored."""
    n = len(resources.devices)
    placement = {}
    for name in workflow.spec.components:
        size = rng.randint(1, n)
        placement[name] = tuple(sorted(rng.sample(range(n), size)))
    switchable = switchable_components(placement, workflow.spec.phases)
    offload = tuple(sorted(c for c in switchable if rng.random() < 0.5))
    k = rng.randint(1, workflow.spec.chunk_total(workflow))
    return _plan("hybrid", placement, k, offload, rng.choice([None, 1, 2, 4]))


def _untyped(prof):
    """The same profile without device kinds, so any random placement is valid."""
    from dataclasses import replace

    return replace(prof, components={n: replace(c, device_kind=None) for n, c in prof.components.items()})


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("kind", ["embodied", "reasoning"])
def test_dependencies_devices_and_order_are_respected(seed, kind):
    workflow, prof, resources = random_instance(seed, kind)
    prof = _untyped(prof)
    plan = _random_plan(random.Random(seed), workflow, prof, resources)
    timeline = simulate(plan, prof, workflow, resources)
    tasks = {t.name: t for t in task_graph(plan, prof, workflow, resources)}
    times = _times(timeline)

    # every task is on exactly its devices, with its duration
    for task in tasks.values():
        spans = [s for s in timeline.spans if s.label == task.name]
        assert sorted(s.device for s in spans) == sorted(task.devices)
        assert spans[0].duration_s == pytest.approx(task.duration_s)

    # a task starts after each input has ended and (across device sets) arrived
    for task in tasks.values():
        for dep in task.deps:
            arrival = times[dep.task][1]
            if tasks[dep.task].devices != task.devices:
                arrival += prof.message_s(dep.size_mib)
            assert times[task.name][0] >= arrival - 1e-12, (task.name, dep.task)

    # one span per device at a time
    by_device = {}
    for s in timeline.spans:
        by_device.setdefault(s.device, []).append(s)
    for spans in by_device.values():
        spans.sort(key=lambda s: (s.start_s, s.end_s))
        for a, b in zip(spans, spans[1:]):
            assert b.start_s >= a.end_s - 1e-12, (a.label, b.label)

    assert timeline.makespan_s == pytest.approx(max(s.end_s for s in timeline.spans))
    assert all(0.0 <= u <= 1.0 + 1e-12 for u in timeline.utilization.values())

    # every chunk 0..k-1 of the first step (or of the generation) is rolled out exactly once
    first = [t.chunk for t in tasks.values() if t.component == "rollout" and t.kind == "work" and t.step in (0, None)]
    assert sorted(first) == list(range(plan.num_chunks))


@pytest.mark.parametrize("seed", range(60))
def test_more_chunks_never_slower_without_fixed_costs_when_disaggregated(seed):
    rng = random.Random(seed)
    workflow = MacroFlow.embodied(num_envs=rng.randint(1, 12), rollout_steps=rng.randint(1, 4))
    prof = profile(
        component("env", 0.0, rng.uniform(0.01, 1.0), rng.choice([0.0, 1.0]), output_mib_per_item=rng.uniform(0, 2)),
        component("rollout", 0.0, rng.uniform(0.01, 1.0), rng.choice([0.0, 1.0]), output_mib_per_item=rng.uniform(0, 2)),
        component("trainer", rng.uniform(0.0, 1.0), rng.uniform(0.0, 0.1)),
        s_per_mib=rng.choice([0.0, 0.1]),  # size-proportional transfer is allowed; the fixed latency is 0
    )
    resources = Resources.cpu_cores(4, 8.0)
    n_env = rng.randint(1, 2)
    placement = {"env": tuple(range(n_env)), "rollout": tuple(range(n_env, 3)), "trainer": rng.choice([(3,), (0, 1, 2, 3)])}
    mode = "disaggregated" if placement["trainer"] == (3,) else "hybrid"  # env and rollout disjoint either way
    makespans = [simulate(_plan(mode, placement, k), prof, workflow, resources).makespan_s
                 for k in range(1, workflow.num_envs + 1)]
    for fewer, more in zip(makespans, makespans[1:]):
        assert more <= fewer + 1e-9


def test_simulate_rejects_invalid_plans():
    workflow = MacroFlow.embodied(num_envs=4, rollout_steps=1)
    resources = Resources.cpu_cores(2, 8.0)
    with pytest.raises(ValueError, match="exceeds"):
        simulate(_plan("colocated", {"env": (0,), "rollout": (0,), "trainer": (0,)}, 5), _env_rollout_profile(),
                 workflow, resources)
    with pytest.raises(ValueError, match="device 7"):
        simulate(_plan("colocated", {"env": (7,), "rollout": (0,), "trainer": (0,)}, 1), _env_rollout_profile(),
                 workflow, resources)
    with pytest.raises(ValueError, match="must place exactly"):
        simulate(_plan("colocated", {"env": (0,), "trainer": (0,)}, 1), _env_rollout_profile(), workflow, resources)
    gpu_trainer = profile(component("env"), component("rollout"), component("trainer", device_kind="gpu"))
    with pytest.raises(ValueError, match="needs gpu devices"):
        simulate(_plan("colocated", {"env": (0,), "rollout": (0,), "trainer": (1,)}, 1), gpu_trainer, workflow, resources)


def test_switchable_components_only_share_devices_across_phases():
    phases = MacroFlow.embodied(num_envs=2, rollout_steps=1).spec.phases
    assert switchable_components({"env": (0,), "rollout": (1,), "trainer": (0, 1)}, phases) == ("env", "rollout", "trainer")
    assert switchable_components({"env": (0,), "rollout": (0,), "trainer": (1,)}, phases) == ()


def test_cross_process_messages_pay_latency_between_colocated_components():
    # Colocated on one device, 1 chunk, T=1, latency 0.1 s, no sizes.
    # Without cross-process messages: rollout [0,1], env [1,2], rollout [2,3], trainer [3,3.5] (+ free sync).
    # With them: every message between two components costs 0.1 s:
    #   rollout [0,1]; actions -> env [1.1,2.1]; obs -> rollout [2.2,3.2]; trajectories -> trainer [3.3,3.8];
    #   weights -> the sync (no local cost) at 3.9.
    base = profile(component("env", per_item_s=0.25), component("rollout", per_item_s=0.25),
                   component("trainer", fixed_s=0.5), latency_s=0.1)
    plan = _plan("colocated", {"env": (0,), "rollout": (0,), "trainer": (0,)}, 1)
    workflow, resources = MacroFlow.embodied(num_envs=4, rollout_steps=1), Resources.cpu_cores(1, 8.0)
    assert simulate(plan, base, workflow, resources).makespan_s == pytest.approx(3.5)
    cross = type(base).from_dict({**base.to_dict(), "cross_process_messages": True})
    timeline = simulate(plan, cross, workflow, resources)
    times = _times(timeline)
    assert times["env t0 c0"] == pytest.approx((1.1, 2.1))
    assert times["trainer epoch 0"] == pytest.approx((3.3, 3.8))
    assert timeline.makespan_s == pytest.approx(3.9)


def test_train_overlap_by_hand():
    # 2 envs x 2 steps, one chunk. env: 0.1 s/env (one process) -> 0.2 s per step; rollout 0.05 s per
    # call (3 calls: 2 steps + bootstrap); trainer 0.2 s/sample on 4 samples -> 0.8 s. Messages are free.
    prof = profile(component("env", 0.0, 0.1, 0.0), component("rollout", 0.05, 0.0, 0.0),
                   component("trainer", 0.0, 0.2, 0.0))
    resources = Resources.cpu_cores(2, 8.0)
    apart = _plan("disaggregated", {"env": (0,), "rollout": (0,), "trainer": (1,)}, 1)
    shared = _plan("hybrid", {"env": (0,), "rollout": (1,), "trainer": (0, 1)}, 1)
    sync, overlap = MacroFlow.embodied(2, 2), MacroFlow.embodied(2, 2, train_overlap=True)
    # collection 0.05 + 0.2 + 0.05 + 0.2 + 0.05 = 0.55 s on core 0; training 0.8 s
    assert simulate(apart, prof, sync, resources).makespan_s == pytest.approx(0.55 + 0.8)
    timeline = simulate(apart, prof, overlap, resources)
    assert timeline.makespan_s == pytest.approx(0.8)  # training on core 1 from t=0, beside collection
    assert _times(timeline)["trainer epoch 0"] == pytest.approx((0.0, 0.8))
    # an trainer that shares the collection's devices cannot overlap: the same makespan as without
    assert simulate(shared, prof, overlap, resources).makespan_s == pytest.approx(
        simulate(shared, prof, sync, resources).makespan_s)


def test_an_episodic_iteration_trains_on_the_samples_its_episodes_took():
    """``train_samples``: the trainer's calls cover those samples, not ``num_envs * rollout_steps``."""
    prof = profile(component("env", 0.0, 0.1, 0.0), component("rollout", 0.05, 0.0, 0.0),
                   component("trainer", 0.0, 0.01, 0.0))
    plan = _plan("disaggregated", {"env": (0,), "rollout": (0,), "trainer": (1,)}, 1)
    resources = Resources.cpu_cores(2, 8.0)
    full = MacroFlow.embodied(4, 10, train_minibatch=10)
    ended_early = MacroFlow.embodied(4, 3, train_minibatch=2, train_samples=9)
    assert (full.samples, ended_early.samples) == (40, 9)
    assert _times(simulate(plan, prof, full, resources))["trainer epoch 0"][1] - \
        _times(simulate(plan, prof, full, resources))["trainer epoch 0"][0] == pytest.approx(0.4)
    times = _times(simulate(plan, prof, ended_early, resources))
    assert times["trainer epoch 0"][1] - times["trainer epoch 0"][0] == pytest.approx(0.09)  # 5 calls, 9 samples
    assert times["trainer epoch 0"][0] == pytest.approx(3 * 0.4 + 4 * 0.05)  # 3 decisions of 4 envs first
    with pytest.raises(ValueError, match="train_samples must be >= 1"):
        MacroFlow.embodied(4, 3, train_samples=0)
    with pytest.raises(ValueError, match="train_minibatch must lie in"):
        MacroFlow.embodied(4, 3, train_minibatch=10, train_samples=9)
    with pytest.raises(ValueError, match="does not use train_samples"):
        MacroFlow("reasoning", num_prompts=2, group_size=2, train_samples=3)
    assert MacroFlow.from_dict(ended_early.to_dict()) == ended_early


def test_train_overlap_is_embodied_only():
    with pytest.raises(ValueError, match="does not use train_overlap"):
        MacroFlow("reasoning", num_prompts=2, group_size=2, train_overlap=True)
    assert MacroFlow.from_dict(MacroFlow.embodied(2, 2, train_overlap=True).to_dict()).train_overlap


# ------------------------------------------------------------------- shared pool (processor sharing)


def _lane_task(name, duration_s, lane, deps=(), order=0, component="rollout"):
    return Task(name, component, (0, 1), duration_s, tuple(Dep(d) for d in deps), (0, WORK, order, 0, 0), lane=lane)


def test_lanes_share_the_pool_by_processor_sharing():
    # Three one-thread tasks on a pool of 2 cores run at 2/3 speed: C (0.5 s of work) ends at 0.75;
    # then A and B (0.5 s left each) run alone at full speed and end at 1.25 (2.5 core-s in 1.25 s on 2 cores).
    tasks = [_lane_task("A", 1.0, "a"), _lane_task("B", 1.0, "b"), _lane_task("C", 0.5, "c")]
    times = schedule(tasks, profile(component("rollout")))
    assert times["C"] == pytest.approx((0.0, 0.75))
    assert times["A"] == pytest.approx((0.0, 1.25)) and times["B"] == pytest.approx((0.0, 1.25))
    # Two threads on two cores: no slowdown; a lane runs its tasks one after the other.
    times = schedule([_lane_task("A", 1.0, "a"), _lane_task("B", 1.0, "b"), _lane_task("A2", 0.5, "a", order=1)],
                     profile(component("rollout")))
    assert times["A"] == (0.0, 1.0) and times["B"] == (0.0, 1.0) and times["A2"] == (1.0, 1.5)


def test_lane_tasks_of_no_duration_release_their_successors():
    # Z takes no time; B (on a lane scanned before Z's) waits on it and on nothing else: starts at 0.
    tasks = [_lane_task("B0", 0.0, "b"), _lane_task("Z", 0.0, "a", order=1), _lane_task("B", 1.0, "b", deps=("Z",), order=2)]
    assert schedule(tasks, profile(component("rollout")))["B"] == (0.0, 1.0)


def test_lane_messages_cost_between_lanes_only():
    # 0.1 s per message: across lanes it is paid, within a lane it is free.
    tasks = [_lane_task("A", 1.0, "a"), _lane_task("B", 1.0, "b", deps=("A",), order=1),
             _lane_task("A2", 1.0, "a", deps=("A",), order=1)]
    times = schedule(tasks, profile(component("rollout"), latency_s=0.1))
    assert times["B"] == pytest.approx((1.1, 2.1))
    assert times["A2"] == pytest.approx((1.0, 2.0))


SHARED_POOL = {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}


def test_shared_two_lanes_by_hand():
    # 2 envs, 1 step, 2 chunks of 1 env; rollout 0.5 s per env, env 0.25 s per env, trainer 0.5 s.
    # Shared, 2 lanes (chunk c on lane c), env and lanes one thread each on 2 cores (never more than
    # 2 threads run: the env's chunk waits on its own lane):
    #   lane 0: rollout t0 c0 [0, .5]           rollout t1 c0 [.75, 1.25]
    #   lane 1: rollout t0 c1 [0, .5]                 rollout t1 c1 [1.0, 1.5]
    #   env:                env t0 c0 [.5, .75] env t0 c1 [.75, 1.0]
    #   trainer on both cores [1.5, 2.0]
    # Hybrid (env:0 rollout:1) must run the four rollout calls one after the other: 2.0 s, then 2.5.
    prof = profile(component("env", per_item_s=0.25), component("rollout", per_item_s=0.5), component("trainer", fixed_s=0.5))
    workflow, resources = MacroFlow.embodied(num_envs=2, rollout_steps=1), Resources.cpu_cores(2, 8.0)
    plan = Plan("shared", SHARED_POOL, 2, None, (), NAN, lanes=2)
    timeline = simulate(plan, prof, workflow, resources)
    times = _times(timeline)
    assert times["rollout t0 c1"] == (0.0, 0.5)
    assert times["env t0 c0"] == (0.5, 0.75) and times["env t0 c1"] == (0.75, 1.0)
    assert times["rollout t1 c0"] == (0.75, 1.25) and times["rollout t1 c1"] == (1.0, 1.5)
    assert times["trainer epoch 0"] == (1.5, 2.0)
    assert timeline.makespan_s == 2.0
    # 2 core-s of rollout + 0.5 of env + 2 x 0.5 of trainer over 2 cores x 2 s
    assert timeline.utilization == pytest.approx({0: 3.5 / 4, 1: 3.5 / 4})
    assert {s.device for s in timeline.spans if s.component == "rollout"} == {0, 1}
    hybrid = _plan("hybrid", {"env": (0,), "rollout": (1,), "trainer": (0, 1)}, 2)
    assert simulate(hybrid, prof, workflow, resources).makespan_s == 2.5


def test_shared_plans_are_validated():
    workflow, prof = MacroFlow.embodied(num_envs=2, rollout_steps=1), _env_rollout_profile()
    with pytest.raises(ValueError, match="lanes"):
        Plan("shared", SHARED_POOL, 2, None, (), NAN, lanes=1)
    with pytest.raises(ValueError, match="lanes"):
        Plan("hybrid", SHARED_POOL, 2, None, (), NAN, lanes=2)
    with pytest.raises(ValueError, match="one pool"):
        simulate(Plan("shared", {"env": (0,), "rollout": (0, 1), "trainer": (0, 1)}, 2, None, (), NAN, lanes=2),
                 prof, workflow, Resources.cpu_cores(2, 8.0))
    with pytest.raises(ValueError, match="CPU cores"):
        simulate(Plan("shared", SHARED_POOL, 2, None, (), NAN, lanes=2), prof, workflow, Resources.gpus(2, 8.0))
    reasoning = MacroFlow.reasoning(num_prompts=2, group_size=1)
    with pytest.raises(ValueError, match="no shared mode"):
        simulate(Plan("shared", {"rollout": (0, 1), "reward": (0, 1), "trainer": (0, 1)}, 2, None, (), NAN, lanes=2),
                 profile(component("rollout"), component("reward"), component("trainer")), reasoning,
                 Resources.cpu_cores(2, 8.0))


# ------------------------------------------------------------------ a GPU simulator sharing its GPU


def _gpu_sim_profile(switch_s: float, contention: float):
    # 2 envs in 2 chunks of 1, one step: env and rollout take 0.5 s per call, the trainer 1 s.
    prof = profile(component("env", per_item_s=0.5), component("rollout", per_item_s=0.5),
                   component("trainer", fixed_s=1.0))
    return replace(prof, gpu_switch_s=switch_s, gpu_contention=contention)


ONE_GPU = {"env": (0,), "rollout": (0,), "trainer": (0,)}
GPU_SIM_FLOW = MacroFlow.embodied(num_envs=2, rollout_steps=1, train_epochs=1)


def test_switch_runs_one_task_at_a_time_and_pays_each_change_of_component():
    # Static order on GPU 0: rollout t0 c0, env t0 c0, rollout t0 c1, env t0 c1, rollout t1 c0,
    # rollout t1 c1, trainer. Every change of component waits 0.1 s; rollout t1 c1 follows a rollout.
    plan = Plan("colocated", ONE_GPU, 2, None, (), NAN, gpu_sharing="switch")
    timeline = simulate(plan, _gpu_sim_profile(0.1, 1.5), GPU_SIM_FLOW, Resources.gpus(1, 80.0))
    times = _times(timeline)
    expected = {
        "rollout t0 c0": (0.0, 0.5), "env t0 c0": (0.6, 1.1), "rollout t0 c1": (1.2, 1.7),
        "env t0 c1": (1.8, 2.3), "rollout t1 c0": (2.4, 2.9), "rollout t1 c1": (2.9, 3.4),
        "trainer epoch 0": (3.5, 4.5),
    }
    for label, (start_s, end_s) in expected.items():
        assert times[label] == pytest.approx((start_s, end_s)), label
    assert timeline.makespan_s == pytest.approx(4.5)


def test_overlap_runs_env_and_rollout_side_by_side_slowed_by_contention():
    # rollout t0 c0 alone 0-0.5; then env t0 c0 and rollout t0 c1 together, each at 1/1.5 speed:
    # 0.5 s of work in 0.75 s (to 1.25); then env t0 c1 and rollout t1 c0 together (to 2.0); then
    # rollout t1 c1 alone (to 2.5); the trainer after the pool: 2.5-3.5. No switch cost.
    plan = Plan("colocated", ONE_GPU, 2, None, (), NAN, gpu_sharing="overlap")
    timeline = simulate(plan, _gpu_sim_profile(0.1, 1.5), GPU_SIM_FLOW, Resources.gpus(1, 80.0))
    times = _times(timeline)
    expected = {
        "rollout t0 c0": (0.0, 0.5), "env t0 c0": (0.5, 1.25), "rollout t0 c1": (0.5, 1.25),
        "env t0 c1": (1.25, 2.0), "rollout t1 c0": (1.25, 2.0), "rollout t1 c1": (2.0, 2.5),
        "trainer epoch 0": (2.5, 3.5),
    }
    for label, (start_s, end_s) in expected.items():
        assert times[label] == pytest.approx((start_s, end_s)), label
    assert timeline.makespan_s == pytest.approx(3.5)


def test_cpu_plans_pay_no_switch_cost():
    cores = Resources.cpu_cores(1, 16.0)
    plan = Plan("colocated", ONE_GPU, 2, None, (), NAN)
    assert simulate(plan, _gpu_sim_profile(0.1, 1.5), GPU_SIM_FLOW, cores).makespan_s == pytest.approx(4.0)
    with pytest.raises(ValueError, match="gpu_sharing"):
        simulate(dataclasses.replace(plan, gpu_sharing="switch"), _gpu_sim_profile(0.1, 1.5), GPU_SIM_FLOW, cores)
