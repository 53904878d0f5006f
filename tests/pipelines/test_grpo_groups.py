"""Embodied GRPO: a group is G envs reset to one initial state; groups differ, iterations differ."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.config import apply_overrides
from embodied.runtime import Channel, Cluster, ClusterConfig, Worker, WorkerGroup
from pipelines.config import EmbodiedConfig
from pipelines.workers import BlockRoute, EnvWorker


class Sink(Worker):
    """Receives the env workers' first observations of an iteration."""

    def take(self, channel: Channel, keys: list[int]) -> list:
        return [channel.get(k) for k in keys]


def first_outputs(cfg: EmbodiedConfig, chunks: int, iteration: int):
    """The EnvOutputs env rank 0 sends at the start of ``iteration`` (one per chunk)."""
    with Cluster(ClusterConfig(backend="local")) as cluster:
        env = WorkerGroup(cluster, EnvWorker, 1, cfg, chunks, None, True, name="env")
        sink = WorkerGroup(cluster, Sink, 1, name="sink")
        obs, act = Channel("obs", sink), Channel("act", env, route=BlockRoute(chunks))
        env.call("interact", 0, obs, act, iteration).wait()
        outs = sink.call("take", obs, list(range(chunks))).result()
        env.call("close").wait()
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
