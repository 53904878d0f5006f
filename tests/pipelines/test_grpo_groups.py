"""Embodied GRPO: a group is G envs reset to one initial state; groups differ, iterations differ."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.config import apply_overrides
from embodied.runtime import Channel, Cluster, ClusterConfig, Worker, WorkerGroup
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workers import BlockRoute, EnvWorker


class Sink(Worker):
    """Receives the env workers' first observations of an iteration."""

    def take(self, channel: Channel, keys: list[int]) -> list:
        return [channel.get(k) for k in keys]


def first_outputs(cfg: EmbodiedConfig, chunks: int, iteration: int, grouped: bool = True, split: int = 1):
    """The EnvOutputs the env ranks send at the start of ``iteration`` (one per chunk, in key
    order): one rank of ``chunks`` chunks, or (``split``) a streams plan's ``split`` ranks of
    ``chunks // split`` chunks each."""
    with Cluster(ClusterConfig(backend="local")) as cluster:
        env = WorkerGroup(cluster, EnvWorker, split, cfg, chunks // split, None, grouped, split, name="env")
        sink = WorkerGroup(cluster, Sink, 1, name="sink")
        obs, act = Channel("obs", sink), Channel("act", env, route=BlockRoute(chunks // split))
        env.remote.interact(0, obs, act, iteration).wait()
        outs = sink.remote.take(obs, list(range(chunks))).result()
        env.remote.close().wait()
    return outs


def _cfg(env_id: str, *overrides: str) -> EmbodiedConfig:
    return apply_overrides(EmbodiedConfig, {}, [f"env.id={env_id}", "env.num_envs=6", "env.backend=inprocess",
                                                "algo.name=grpo", "algo.group_size=3", "algo.outcome=return", *overrides])


@pytest.mark.parametrize("chunks", [1, 2])
def test_a_group_shares_its_initial_state_and_groups_differ(chunks):
    outs = first_outputs(_cfg("HalfCheetah-v5"), chunks, iteration=0)
    state = np.concatenate([o.obs["state"] for o in outs])
    ids = np.concatenate([o.group_ids for o in outs])
    assert ids.tolist() == [0, 0, 0, 1, 1, 1]
    for g in (0, 1):
        members = state[ids == g]
        assert (members == members[0]).all()  # one initial state per group
    assert not np.array_equal(state[0], state[3])  # different groups, different states
    later = np.concatenate([o.obs["state"] for o in first_outputs(_cfg("HalfCheetah-v5"), chunks, iteration=1)])
    assert not np.array_equal(later[0], state[0])  # each iteration draws new initial states


@pytest.mark.parametrize("grouped", [False, True])
def test_a_streams_split_steps_the_same_envs_from_the_same_seeds(grouped):
    """Two streams' env ranks (3 envs each) start from exactly the initial states one env worker's
    two chunks do: an env keeps its index and seed whatever the plan."""
    cfg = _cfg("HalfCheetah-v5", *([] if grouped else ["algo.name=ppo"]))
    one = first_outputs(cfg, 2, iteration=0, grouped=grouped)
    split = first_outputs(cfg, 2, iteration=0, grouped=grouped, split=2)
    for a, b in zip(one, split):
        np.testing.assert_array_equal(a.obs["state"], b.obs["state"])
        assert (a.group_ids is None and b.group_ids is None) or a.group_ids.tolist() == b.group_ids.tolist()
    assert not np.array_equal(one[0].obs["state"][0], one[1].obs["state"][0])  # the chunks' envs differ


def test_groups_share_the_initial_state_in_maniskill():
    pytest.importorskip("mani_skill")
    from tests.envs.conftest import vulkan_problem

    if vulkan_problem():
        pytest.skip(vulkan_problem())
    cfg = _cfg("PushCube-v1", "env.num_envs=4", "algo.group_size=2", "algo.outcome=success")
    (out,) = first_outputs(cfg, 1, iteration=0)
    state = out.obs["state"]
    assert np.array_equal(state[0], state[1]) and np.array_equal(state[2], state[3])
    assert not np.array_equal(state[0], state[2])


class Driver(Worker):
    """Plays the rollout's side for one chunk: the expert in the first half of the envs, standing
    still in the second (those never reach the goal: truncated after the 12-step limit)."""

    def drive(self, obs: Channel, act: Channel, steps: int) -> None:
        from envs.adapters.color_reach import expert

        for t in range(steps + 1):
            out = obs.get(0)
            if t < steps:
                actions = expert(out.obs)
                actions[len(actions) // 2:] = 0.0
                act.put(0, actions)


def test_a_grouped_iteration_reports_each_envs_first_episode_once():
    """The experts succeed within a few steps and start second episodes (auto-reset) that also
    succeed before the iteration ends; the iteration's rollouts are the first episodes only, so
    train/success_rate is the group members' 0.5, not inflated by the second successes or (a window
    of the last episodes to end) deflated towards the failures that end last."""
    cfg = _cfg("ColorReach-v0", "env.num_envs=8", "algo.group_size=4", "env.obs_mode=state", "algo.rollout_steps=12")
    with Cluster(ClusterConfig(backend="local")) as cluster:
        env = WorkerGroup(cluster, EnvWorker, 1, cfg, 1, None, True, name="env")
        driver = WorkerGroup(cluster, Driver, 1, name="driver")
        obs, act = Channel("obs", driver), Channel("act", env, route=BlockRoute(1))
        interacting = env.remote.interact(12, obs, act, 0)
        driver.remote.drive(obs, act, 12).wait()
        out = interacting.result()
        env.remote.close().wait()
    episodes = out["episodes"]
    assert len(episodes) == 8  # one per env, though the experts' envs finished two or more
    assert sorted(e["success"] for e in episodes) == [0.0] * 4 + [1.0] * 4
    assert sorted(e["length"] for e in episodes)[-4:] == [12] * 4
    assert out["env_steps"] > 8 * 6  # the steps of the second episodes are still counted as taken
