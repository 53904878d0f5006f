"""A plan's ``gpu_sharing`` at run time: a ``switch`` plan's env and rollout take turns, an
``overlap`` plan's run side by side (the chunks pipelined), as the planner's timelines have it.
The runtime does what the plan says whatever the device, so the CPU shows it: an env with a
sleep in its step stands for the simulator, and ``time/env_rollout_overlap_s`` (the seconds both
were busy at once, from the spans the ranks record) tells the two apart."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.config import apply_overrides
from embodied.rl import TrajectoryBatch
from embodied.runtime import Channel, Cluster, ClusterConfig, Worker, WorkerGroup, wait_all
from embodied.runtime.weights import WeightSyncer
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.modes import takes_turns
from pipelines.onpolicy.spans import overlap_s, union
from pipelines.onpolicy.workers import BlockRoute, EnvWorker, RolloutWorker
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.runner import Runner
from policies.registry import build_policy
from scheduler import Plan
from tests.pipelines.batches import assert_same_batch

ONE_DEVICE = {"env": (0,), "rollout": (0,), "trainer": (0,)}


def test_overlap_is_the_time_both_sides_were_busy():
    # a: [0, 1] and [1, 3] merge into [0, 3]; b: [2, 4] and [5, 6]; both busy in [2, 3] only
    assert union([(1.0, 3.0), (0.0, 1.0)]) == [(0.0, 3.0)]
    assert overlap_s([(1.0, 3.0), (0.0, 1.0)], [(2.0, 4.0), (5.0, 6.0)]) == pytest.approx(1.0)
    assert overlap_s([(0.0, 1.0)], [(1.0, 2.0)]) == 0.0  # one ends as the other starts
    assert overlap_s([], [(0.0, 1.0)]) == 0.0
    with pytest.raises(ValueError, match="union: a span ends before it starts"):
        union([(2.0, 1.0)])


def test_env_and_rollout_take_turns_only_where_a_switch_plan_puts_them_on_one_device():
    workflow = EmbodiedWorkflow(_cfg())
    layout = lambda placement, sharing: workflow.layout_of(Plan("colocated", placement, 2, None, (), math.nan, gpu_sharing=sharing))  # noqa: E731
    assert takes_turns(layout(ONE_DEVICE, "switch"))
    assert not takes_turns(layout(ONE_DEVICE, "overlap"))
    assert not takes_turns(layout(ONE_DEVICE, None))
    apart = {"env": (0,), "rollout": (1,), "trainer": (0,)}  # the env shares its device with the trainer only
    assert not takes_turns(workflow.layout_of(Plan("hybrid", apart, 2, None, (), math.nan, gpu_sharing="switch")))


def test_a_switch_plan_never_steps_the_env_while_the_rollout_decides():
    """Two chunks on one device. ``overlap``: the env steps chunk 1 while chunk 0 is decided for.
    ``switch``: never at once; every env steps every decision all the same."""
    cfg = _cfg()
    workflow = EmbodiedWorkflow(cfg)
    runner = Runner(cfg, None, workflow)
    sharings = ("overlap", "switch", "overlap")  # and back: re-planning reconfigures the rollout
    with Cluster(cfg.cluster) as cluster:
        runner.start(cluster)
        rows = []
        for sharing in sharings:
            workflow.switch(workflow.layout_of(Plan("colocated", ONE_DEVICE, 2, None, (), math.nan, gpu_sharing=sharing)))
            rows.append(runner.step())
    overlaps = [r["time/env_rollout_overlap_s"] for r in rows]
    assert overlaps[1] == 0.0, overlaps
    assert overlaps[0] > 0.0 and overlaps[2] > 0.0, overlaps
    assert [r["env_steps"] for r in rows] == [32, 64, 96]  # every env steps every decision in both ways


class Trainer(Worker):
    """Receives the collection's batch, as a trainer rank does."""

    def take(self, channel: Channel, n: int) -> list[TrajectoryBatch]:
        return channel.get_batch(0, n)


def collected(cfg: EmbodiedConfig, turns: bool) -> TrajectoryBatch:
    """One collection of one env rank's 2 chunks by one rollout rank at fixed weights, the
    rollout taking turns with the env or pipelined."""
    T, grouped = cfg.algo.rollout_steps, cfg.algo.name == "grpo"
    with Cluster(ClusterConfig(backend="local")) as cluster:
        trainer = WorkerGroup(cluster, Trainer, 1, name="trainer")
        traj = Channel("trajectories", trainer)
        env = WorkerGroup(cluster, EnvWorker, 1, cfg, 2, None, grouped, name="env")
        obs_space, action_space = env.on(0).spaces().result()
        rollout = WorkerGroup(cluster, RolloutWorker, 1, cfg, obs_space, action_space, 2, None, True, grouped, False, turns,
                              name="rollout")
        torch.manual_seed(0)
        rollout.remote.load_weights(WeightSyncer().export(build_policy(cfg.policy, obs_space, action_space), 3)).wait()
        obs, act = Channel("observations", rollout), Channel("actions", env, route=BlockRoute(2))
        wait_all(env.remote.interact(T, obs, act, 0), rollout.remote.generate(T, obs, act, traj))
        env.remote.close().wait()
        return trainer.remote.take(traj, 1).result()[0]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_taking_turns_changes_when_the_env_steps_not_what_is_collected(algo):
    """The same envs, seeds, sampling stream and batch, taking turns or pipelined; GRPO's chunks
    stop once their episodes are over, in turns too."""
    cfg = _cfg("env.kwargs={}", "env.max_episode_steps=5", f"algo.name={algo}", "algo.group_size=2", "algo.outcome=return")
    in_turns, pipelined = collected(cfg, turns=True), collected(cfg, turns=False)
    assert_same_batch(in_turns, pipelined)
    if algo == "grpo":
        assert not in_turns.valid.all()  # the episodes ended inside the collection: padded


def _cfg(*overrides: str) -> EmbodiedConfig:
    return apply_overrides(EmbodiedConfig, {}, [
        "env.id=tests.pipelines.reach_env:Reach1D", "env.kwargs={delay_s: 0.002}", "env.num_envs=4",
        "env.backend=inprocess", "algo.rollout_steps=8", "algo.total_env_steps=1000", "plan.profile=false",
        "cluster.backend=local", *overrides,
    ])
