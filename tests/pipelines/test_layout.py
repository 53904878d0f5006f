"""The device map: what every rank gets (node, cores, GPUs, Ray's GPU share) for each kind of plan
the planner makes, on simulated machines (GPUs, several nodes) that this machine does not have."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from pipelines.layout import RAY_NOSET_CUDA, Layout, Machine, NodeSpec, RankPlacement
from scheduler import Plan, PlanningError, Resources, MacroFlow, plan
from tests.scheduler.profiles import component, profile

RANKS = {"env": 2, "rollout": 2, "trainer": 2}


def gpu_profile(rollout_gib: float, trainer_gib: float):
    """Env on CPU cores; rollout and trainer on GPUs, ``*_gib`` of memory each."""
    return profile(
        component("env", per_item_s=0.01, exponent=1.0, device_kind="cpu", output_mib_per_item=0.1),
        component("rollout", fixed_s=0.002, per_item_s=0.001, device_kind="gpu", memory_gib=rollout_gib, weights_mib=100,
                  offload_s=0.5, onload_s=0.5),
        component("trainer", per_item_s=0.01, device_kind="gpu", memory_gib=trainer_gib, offload_s=1.0, onload_s=1.0),
        latency_s=0.001, s_per_mib=0.001,
    )


def one_node(gpus: int = 4, cpus: int = 8) -> Machine:
    return Machine.of_nodes([NodeSpec(None, "node0", cpus=cpus, gpus=gpus, cpu_memory_gib=4.0, gpu_memory_gib=80.0)])


def check_device_map(layout: Layout, machine: Machine) -> None:
    """What holds for every layout: each rank sees GPUs of its component's plan devices, on one
    node; no GPU is reserved more than once over; data-parallel trainer ranks see GPUs of their
    own when there are enough; CPU-only components reserve no GPU."""
    share: dict[tuple[str | None, int], float] = defaultdict(float)
    for name, ranks in layout.ranks.items():
        devices = layout.plan.placement[name]
        allowed = {(machine.nodes[d], machine.local[d]) for d in devices if machine.kind(d) == "gpu"}
        for r in ranks:
            if r.gpus is None:
                assert not allowed and r.num_gpus == 0, (name, r)
                continue
            assert {(r.node, g) for g in r.gpus} <= allowed, (name, r)
            assert r.env_vars() == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, r.gpus)), RAY_NOSET_CUDA: "1"}
            for g in r.gpus:
                share[(r.node, g)] += r.num_gpus / len(r.gpus)
        if name == "trainer" and len(allowed) >= len(ranks) and ranks[0].gpus is not None:
            seen = [g for r in ranks for g in r.gpus]
            assert len(seen) == len(set(seen)), ranks
    assert all(total <= 1 + 1e-9 for total in share.values()), dict(share)


def test_trainer_ranks_own_cores_and_the_others_share_theirs():
    lay = Layout.of(Plan("hybrid", {"env": (0,), "rollout": (1,), "trainer": (0, 1)}, 3, None, (), 1.0),
                    Resources.cpu_cores(2, 8.0), RANKS)
    assert lay.ranks_of("trainer") == (RankPlacement(cores=(0,)), RankPlacement(cores=(1,)))
    assert lay.ranks_of("env") == (RankPlacement(cores=(0,)),) * 2  # both env ranks' processes on core 0
    assert lay.cores_of("trainer") == (0, 1) and lay.cores_of("rollout") == (1,) and lay.num_chunks == 3
    unplanned = Layout.unplanned(("env", "rollout", "trainer"), 2, 1, RANKS)
    assert unplanned.ranks_of("trainer") == (RankPlacement(),) * 2 and unplanned.cores_of("env") == ()


def test_colocated_gpus_are_shared_and_the_idle_phase_offloads():
    """Rollout and trainer on all 4 GPUs (each 60 GiB of 80: together they fit only when one
    offloads): each GPU holds one rollout rank and one trainer rank, half a GPU each in Ray."""
    machine = one_node()
    ranks = {"env": 1, "rollout": 4, "trainer": 4}
    best = plan(MacroFlow.embodied(num_envs=64, rollout_steps=8, ranks={"env": 1, "rollout": 4, "trainer": 4}), gpu_profile(60, 60), machine.resources,
                force_mode="colocated", force_chunks=1).best
    assert best.offload, best
    lay = Layout.of(best, machine, ranks)
    check_device_map(lay, machine)
    for i in range(4):
        rollout, trainer = lay.ranks_of("rollout")[i], lay.ranks_of("trainer")[i]
        assert rollout.cuda_visible_devices == trainer.cuda_visible_devices == str(i)
        assert rollout.num_gpus == trainer.num_gpus == 0.5
    (env,) = lay.ranks_of("env")
    assert env.gpus is None and env.cores == tuple(range(8))


def test_disaggregated_gpus_are_disjoint_and_whole():
    machine = one_node()
    result = plan(MacroFlow.embodied(num_envs=64, rollout_steps=8, ranks={"env": 1, "rollout": 2, "trainer": 2}), gpu_profile(10, 10), machine.resources,
                  force_mode="disaggregated", force_chunks=1)
    for candidate, _ in result.candidates:  # every disaggregated plan of the search lays out
        check_device_map(Layout.of(candidate, machine, {"env": 1, "rollout": 2, "trainer": 2}), machine)
    best = Plan("disaggregated", {"env": (4, 5, 6, 7, 8, 9, 10, 11), "rollout": (0, 1), "trainer": (2, 3)}, 2, None, (),
                math.nan)
    lay = Layout.of(best, machine, {"env": 1, "rollout": 2, "trainer": 2})
    assert [r.cuda_visible_devices for r in lay.ranks_of("rollout")] == ["0", "1"]
    assert [r.cuda_visible_devices for r in lay.ranks_of("trainer")] == ["2", "3"]
    assert all(r.num_gpus == 1.0 for c in ("rollout", "trainer") for r in lay.ranks_of(c))
    check_device_map(lay, machine)


def test_hybrid_trainer_spans_every_gpu_beside_the_rollout():
    machine = one_node()
    wf = MacroFlow.embodied(num_envs=64, rollout_steps=8, ranks={"env": 1, "rollout": 4, "trainer": 4})
    result = plan(wf, gpu_profile(20, 20), machine.resources, force_mode="hybrid", force_chunks=1)
    for candidate, _ in result.candidates:
        assert len(candidate.placement["trainer"]) == 4  # the trainer's 4 ranks: one GPU each
        lay = Layout.of(candidate, machine, {"env": 1, "rollout": 4, "trainer": 4})
        check_device_map(lay, machine)
        assert [r.num_gpus for r in lay.ranks_of("trainer")] == [0.5] * 4  # each beside a rollout rank
    # a hand-made hybrid plan: the rollout's 2 ranks on GPUs 0 and 1 beside trainer ranks 0 and 1
    hybrid = Plan("hybrid", {"env": (4, 5, 6, 7), "rollout": (0, 1), "trainer": (0, 1, 2, 3)}, 1, None, (), math.nan)
    lay = Layout.of(hybrid, machine, {"env": 1, "rollout": 2, "trainer": 4})
    assert [r.gpus for r in lay.ranks_of("rollout")] == [(0,), (1,)]
    assert [r.num_gpus for r in lay.ranks_of("rollout")] == [0.5, 0.5]
    assert [r.num_gpus for r in lay.ranks_of("trainer")] == [0.5, 0.5, 1.0, 1.0]
    check_device_map(lay, machine)


def test_a_plan_over_two_nodes_puts_each_rank_on_one_node():
    """Two nodes of 2 cores: env on node A, trainer's 2 ranks on node B (a core each), and a
    rollout spanning both nodes with 2 ranks gets one rank per node."""
    machine = Machine.of_nodes([NodeSpec("A", "a", cpus=2), NodeSpec("B", "b", cpus=2)])
    assert machine.multi_node and [d.name for d in machine.resources.devices] == ["a/cpu0", "a/cpu1", "b/cpu0", "b/cpu1"]
    lay = Layout.of(Plan("disaggregated", {"env": (0, 1), "rollout": (0, 1, 2, 3), "trainer": (2, 3)}, 1, None, (), 1.0),
                    machine, {"env": 1, "rollout": 2, "trainer": 2})
    assert lay.ranks_of("env") == (RankPlacement(node="A", cores=(0, 1)),)
    assert lay.ranks_of("trainer") == (RankPlacement(node="B", cores=(0,)), RankPlacement(node="B", cores=(1,)))
    assert lay.ranks_of("rollout") == (RankPlacement(node="A", cores=(0, 1)), RankPlacement(node="B", cores=(0, 1)))
    # a data-parallel block never straddles nodes: 3 cores over 2 ranks -> a/cpu0-1 and b/cpu0
    lay = Layout.of(Plan("colocated", {"env": (0,), "rollout": (0,), "trainer": (0, 1, 2)}, 1, None, (), 1.0), machine, RANKS)
    assert [(r.node, r.cores) for r in lay.ranks_of("trainer")] == [("A", (0, 1)), ("B", (0,))]


def test_the_planner_gives_ranks_whole_devices():
    """2 trainer ranks: a multiple of 2 cores, or exactly 2 GPUs; one rollout rank: one GPU;
    none that fits is an error that says so."""
    cpu = profile(component("env", per_item_s=0.01), component("rollout", per_item_s=0.001),
                  component("trainer", per_item_s=0.01))
    wf = MacroFlow.embodied(num_envs=8, rollout_steps=4, ranks={"trainer": 2})
    result = plan(wf, cpu, Resources.cpu_cores(5, 8.0), max_chunks=2)
    assert result.candidates and all(len(p.placement["trainer"]) % 2 == 0 for p, _ in result.candidates)
    ones = plan(MacroFlow.embodied(num_envs=8, rollout_steps=4), cpu, Resources.cpu_cores(5, 8.0), max_chunks=2)
    assert any(len(p.placement["trainer"]) % 2 for p, _ in ones.candidates)  # the rule is what removed them
    gpus = plan(MacroFlow.embodied(num_envs=8, rollout_steps=4, ranks={"rollout": 1, "trainer": 2}), gpu_profile(10, 10),
                one_node(gpus=3).resources, max_chunks=1)
    assert all(len(p.placement["trainer"]) == 2 and len(p.placement["rollout"]) == 1 for p, _ in gpus.candidates)
    with pytest.raises(PlanningError, match=r"ranks \(trainer 3\) whole devices"):
        plan(MacroFlow.embodied(num_envs=8, rollout_steps=4, ranks={"trainer": 3}), cpu, Resources.cpu_cores(2, 8.0))


def test_a_streams_plan_gives_each_streams_ranks_its_block_of_cores_on_one_node():
    pool = tuple(range(3))
    streams = Plan("streams", {"env": pool, "rollout": pool, "trainer": pool}, 2, None, (), 1.0, lanes=2)
    lay = Layout.of(streams, Resources.cpu_cores(3, 8.0), {"env": 2, "rollout": 2, "trainer": 1})
    assert [r.cores for r in lay.ranks_of("env")] == [(0, 1), (2,)]  # larger block first
    assert [r.cores for r in lay.ranks_of("rollout")] == [(0, 1), (2,)]
    assert [r.cores for r in lay.ranks_of("trainer")] == [(0, 1, 2)]
    # a component whose ranks are not one per stream keeps the usual rule (ranks share its cores)
    lay = Layout.of(streams, Resources.cpu_cores(3, 8.0), {"env": 2, "rollout": 1, "trainer": 1})
    assert [r.cores for r in lay.ranks_of("rollout")] == [(0, 1, 2)]
    machine = Machine.of_nodes([NodeSpec("a", "a", cpus=3), NodeSpec("b", "b", cpus=3)])
    cores = tuple(range(6))
    across = Plan("streams", {"env": cores, "rollout": cores, "trainer": cores}, 4, None, (), 1.0, lanes=4)
    with pytest.raises(ValueError, match="spans nodes"):  # blocks (0, 1) (2, 3) (4,) (5,): core 2 on a, 3 on b
        Layout.of(across, machine, {"env": 4, "rollout": 4})
