"""Plan modes as objects: what each mode's plans set and reserve, and that a plan whose ranks the
cluster cannot hold is never chosen."""

from __future__ import annotations

import pytest

from embodied.config import apply_overrides
from embodied.errors import UserError
from embodied.runtime import Cluster, ClusterConfig
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.modes import RUN_MODES, Pipelined, Shared, Streams, capacity_of, mode_of, requests
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from scheduler import MODES, ComponentProfile, CostModel, Plan, Profile

POOL = {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)}
PROFILE = Profile({
    "env": ComponentProfile("env", CostModel(0.0, 0.01, 0.0)),
    "rollout": ComponentProfile("rollout", CostModel(0.04, 0.0, 1.0)),
    "trainer": ComponentProfile("trainer", CostModel(0.0, 0.001, 1.0)),
})


def _cfg(*overrides: str) -> EmbodiedConfig:
    return apply_overrides(EmbodiedConfig, {}, [
        "env.id=CartPole-v1", "env.num_envs=8", "env.backend=inprocess", "algo.rollout_steps=16",
        "cluster.backend=ray", "cluster.num_cpus=2", *overrides,
    ])


def test_every_plan_mode_is_run_by_a_registered_class():
    assert set(RUN_MODES) == set(MODES)
    assert mode_of(Plan("colocated", POOL, 2, None, (), 1.0)) is Pipelined
    assert RUN_MODES.get("disaggregated") is RUN_MODES.get("hybrid") is Pipelined  # one wiring
    assert (RUN_MODES.get("shared"), RUN_MODES.get("streams")) == (Shared, Streams)
    assert Shared.wiring == Pipelined.wiring != Streams.wiring  # re-planning shared <-> hybrid keeps the groups


def test_a_mode_reserves_for_the_ranks_its_plans_set():
    """Lanes and streams split their component's configured CPUs; a stream rank reserves what its
    env and rollout ranks would; the trainer's ranks split ``workers.trainer_cpus``."""
    cfg = _cfg("workers.env_cpus=1", "workers.rollout_cpus=0.5", "workers.trainer_cpus=0.5")
    workflow = EmbodiedWorkflow(cfg)
    cpus = lambda plan: {g: [r.num_cpus for r in ranks] for g, ranks in requests(cfg, workflow.layout_of(plan)).items()}  # noqa: E731
    assert cpus(Plan("hybrid", POOL, 2, None, (), 1.0)) == {"env": [1.0], "rollout": [0.5], "trainer": [0.5]}
    assert cpus(Plan("shared", POOL, 2, None, (), 1.0, lanes=2)) == {"env": [1.0], "rollout": [0.25, 0.25], "trainer": [0.5]}
    assert cpus(Plan("streams", POOL, 2, None, (), 1.0, lanes=2)) == {"stream": [0.75, 0.75], "trainer": [0.5]}


def test_a_plan_the_cluster_cannot_hold_is_never_chosen():
    """Two rollout ranks of 0.5 CPU, an env rank of 1 and a trainer of 0.5 ask for 2.5 CPUs of 2
    in the modes that run ``workers.rollout`` ranks; lanes and streams split the rollout's 0.5:
    only their plans are candidates, and the best is one of them."""
    workflow = EmbodiedWorkflow(_cfg("workers.rollout=2"))
    unchecked = workflow.plan(PROFILE)  # no capacity known: every candidate
    workflow.capacity = {"CPU": 2.0, "GPU": 0.0}
    assert any(workflow.shortfall(p) is not None for p, _ in unchecked.candidates)
    result = workflow.plan(PROFILE)
    assert result.candidates and all(workflow.shortfall(p) is None for p, _ in result.candidates)
    assert {p.mode for p, _ in result.candidates} <= {"shared", "streams"}
    assert result.best.mode in ("shared", "streams")
    assert workflow.shortfall(Plan("hybrid", POOL, 2, None, (), 1.0)) == "2.5 CPU (env 1, rollout 1, trainer 0.5), the cluster has 2"


def test_trainer_ranks_split_the_trainers_reservation():
    """``workers.trainer=2`` on 2 CPUs (the README's DDP command): the two ranks reserve 0.25 CPU
    each, so every mode's plans fit and one is chosen."""
    cfg = _cfg("workers.trainer=2")
    workflow = EmbodiedWorkflow(cfg)
    workflow.capacity = {"CPU": 2.0, "GPU": 0.0}
    result = workflow.plan(PROFILE)
    assert all(workflow.shortfall(p) is None for p, _ in result.candidates)
    assert [r.num_cpus for r in requests(cfg, workflow.layout_of(result.best))["trainer"]] == [0.25, 0.25]


def test_when_no_plan_fits_planning_names_what_to_lower():
    """An env rank of 1.5 CPUs on 2 CPUs: every mode asks 2.5 CPUs; planning refuses at once
    (before any worker reserves), naming the groups' shares."""
    workflow = EmbodiedWorkflow(_cfg("workers.env_cpus=1.5"))
    workflow.capacity = {"CPU": 2.0, "GPU": 0.0}
    with pytest.raises(UserError, match=r"No plan fits the cluster.*2\.5 CPU \(.*trainer 0\.5\), the cluster has 2.*workers\.<group>_cpus"):
        workflow.plan(PROFILE)


def test_capacity_is_checked_only_where_reservations_are():
    with Cluster(ClusterConfig(backend="local")) as cluster:
        assert capacity_of(cluster) is None  # the local backend reserves nothing


def test_a_local_rays_capacity_is_what_it_was_started_with(ray_cluster):
    assert capacity_of(ray_cluster) == {"CPU": 4.0, "GPU": ray_cluster.num_gpus}


def test_an_env_on_cuda_reserves_a_share_of_the_gpu_it_shares():
    """``workers.env_device=cuda``: colocated with the rollout and trainer on one GPU, the env rank
    reserves a share of it (the three fit in the one GPU); on the CPU it reserves none."""
    from pipelines.layout import Machine, NodeSpec

    gpu_plan = {"env": (0,), "rollout": (0,), "trainer": (0,)}
    devices = ("workers.env_device=cuda", "workers.rollout_device=cuda", "workers.trainer_device=cuda")
    workflow = EmbodiedWorkflow(_cfg(*devices))
    workflow.machine_ = Machine.of_nodes([NodeSpec(None, "node0", 2, 1)])
    assert workflow.resources().devices[0].kind == "gpu"
    gpus = {g: [r.num_gpus for r in ranks]
            for g, ranks in requests(workflow.cfg, workflow.layout_of(Plan("colocated", gpu_plan, 2, None, (), 1.0, gpu_sharing="overlap"))).items()}
    assert gpus["env"][0] > 0 and sum(sum(v) for v in gpus.values()) <= 1.0 + 1e-9
    cpu = EmbodiedWorkflow(_cfg("workers.env_device=cpu"))
    assert [r.num_gpus for r in requests(cpu.cfg, cpu.layout_of(Plan("colocated", POOL, 2, None, (), 1.0)))["env"]] == [0.0]
