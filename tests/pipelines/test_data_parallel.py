"""Data-parallel trainer ranks: two ranks on CPU (gloo, real Ray processes) train like one.

The reference is one TrainerWorker in this process (the single-rank update every other test
checks); the two ranks are the same TrainerWorker as Ray actors joined into a process group. Both
start from the same seed and update on the same global batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from embodied.config import apply_overrides
from embodied.rl import TrajectoryBatch
from embodied.runtime import Cluster, ClusterConfig, WorkerGroup
from embodied.runtime.distributed import SINGLE, DataParallel
from embodied.runtime.weights import state_of
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workers import Pinning, TrainerWorker

OBS = spaces.Dict({"state": spaces.Box(-np.inf, np.inf, (4,), np.float32)})
ACT = spaces.Discrete(2)


def config(*overrides: str) -> EmbodiedConfig:
    # 4 envs x 13 decisions = 52 samples in 3 minibatches of 18, 18, 16: blocks of 9/9 and 8/8
    return apply_overrides(EmbodiedConfig, {}, [
        "env.id=CartPole-v1", "env.num_envs=4", "algo.rollout_steps=13", "algo.num_minibatches=3", "algo.epochs=2",
        "policy.hidden_sizes=[32, 32]", "policy.normalize_obs=true", "cluster.timeout_s=60", "workers.trainer_cpus=0.25",
        *overrides,
    ])


def random_batch(T: int = 13, B: int = 4, seed: int = 0, critic: bool = True) -> TrajectoryBatch:
    """A rollout's facts, random but plausible (episodes end now and then, GRPO groups of 2)."""
    rng = np.random.default_rng(seed)
    ends = rng.random((T, B, 1)) < 0.15
    ends[-1] = True  # every env's first episode ends (GRPO scores finished episodes)
    return TrajectoryBatch(
        obs={"state": rng.normal(size=(T, B, 4)).astype(np.float32)},
        actions=rng.integers(0, 2, size=(T, B)),
        logprobs=np.log(rng.uniform(0.3, 0.7, size=(T, B))).astype(np.float32),
        rewards=rng.normal(size=(T, B, 1)).astype(np.float32),
        terminated=ends,
        truncated=np.zeros((T, B, 1), bool),
        valid=np.ones((T, B, 1), bool),
        values=rng.normal(size=(T, B)).astype(np.float32) if critic else None,
        final_values=np.zeros((T, B), np.float32) if critic else None,
        last_values=rng.normal(size=(B,)).astype(np.float32) if critic else None,
        success=rng.random((T, B, 1)) < 0.5,
        group_ids=np.arange(B) // 2,
    ).check()


def one_rank(cfg: EmbodiedConfig, batches: list[TrajectoryBatch]) -> dict:
    """What a single in-process TrainerWorker has before and after updating on ``batches``:
    ``initial`` and ``weights``, the ``stats`` of each update, its checkpoint ``state``."""
    with Cluster(ClusterConfig(backend="local", timeout_s=60)) as local:
        group = WorkerGroup(local, TrainerWorker, 1, cfg, OBS, ACT, name="reference")
        initial = state_of(group.remote.export_weights().result())
        stats = [group.remote.update(b, cfg.algo.lr).result() for b in batches]
        out = {"initial": initial, "weights": state_of(group.remote.export_weights().result()), "stats": stats,
               "state": group.remote.state().result()}
        group.shutdown()
    return out


def ranks(cluster: Cluster, cfg: EmbodiedConfig, n: int) -> WorkerGroup:
    group = WorkerGroup(cluster, TrainerWorker, n, cfg, OBS, ACT, name="dp-trainer")
    host, port = group.on(0).rendezvous().result()
    assert host == "127.0.0.1"  # the store of a local Ray listens on loopback only
    group.remote.join(host, port).wait()
    return group


def assert_same_update(weights: dict, stats: list[dict], reference: dict) -> None:
    ref_weights, ref_stats = reference["weights"], reference["stats"][-len(stats):]
    assert set(weights) == set(ref_weights)
    for name in ref_weights:
        torch.testing.assert_close(weights[name], ref_weights[name], rtol=1e-5, atol=1e-6, msg=name)
    for got, want in zip(stats, ref_stats):
        # the gradient norm is that of the *summed* gradients (averaging would halve it: Adam
        # alone would not notice); losses are the minibatch's, not a rank's share of them
        for key in ("losses/grad_norm", "losses/policy", "losses/approx_kl", "losses/epochs", "charts/samples"):
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    moved = max(float((ref_weights[k] - reference["initial"][k]).abs().max()) for k in ref_weights)
    assert moved > 1e-3  # the comparison is not between two untrained policies


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_like_one_on_the_same_batch(ray_cluster, strategy):
    """PPO, two updates of 2 epochs x 3 uneven minibatches, observation normalizer on: two gloo
    ranks (DDP or FSDP2) reach the weights and statistics of one rank; then, from one rank's
    checkpoint, with micro-batches of at most 4 samples per rank (accumulated) and (DDP) the
    trainer offloaded between updates, again; and their checkpoint is one rank's."""
    cfg = config(f"workers.trainer_strategy={strategy}")
    batches = [random_batch(seed=1), random_batch(seed=2), random_batch(seed=3)]
    reference = one_rank(cfg, batches[:2])
    group = ranks(ray_cluster, cfg, 2)
    try:
        stats = [group.remote.update(b, cfg.algo.lr).wait() for b in batches[:2]]
        assert all(s[0]["charts/micro_batches"] == 1.0 for s in stats)
        for per_rank in stats:  # every rank logs the combined statistics
            assert per_rank[0]["losses/policy"] == pytest.approx(per_rank[1]["losses/policy"], rel=1e-6)
        assert_same_update(state_of(group.remote.export_weights().wait()[0]), [s[0] for s in stats], reference)

        # one rank's checkpoint continues on two; with micro-batches of at most 4 samples per rank,
        # and (DDP) the trainer's state offloaded between updates
        state = reference["state"]
        group.remote.load_state(state["model"], state["optimizer"], state["version"], state["generator"]).wait()
        group.remote.configure(Pinning(), strategy == "ddp", 4).wait()
        more = group.remote.update(batches[2], cfg.algo.lr).wait()[0]
        assert ("offload/onload_s" in more) == (strategy == "ddp")
        # blocks of 9, 9 and 8 samples: 3 + 3 + 2 calls per epoch over 3 steps
        assert more["charts/micro_batches"] == pytest.approx(8 / 3)
        weights = state_of(group.remote.export_weights().wait()[0])
        states = group.remote.state().wait()
    finally:
        group.shutdown()
    reference = one_rank(cfg, batches)
    assert_same_update(weights, [more], reference)
    # the checkpoint of two ranks is rank 0's whole state, in the form one rank writes
    assert states[1] is None and states[0]["version"] == reference["state"]["version"] == 3
    got, want = states[0]["optimizer"], reference["state"]["optimizer"]
    assert got["param_groups"][0]["params"] == want["param_groups"][0]["params"]
    for i, slot in want["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got["state"][i][key], slot[key], rtol=1e-4, atol=1e-7)
    assert torch.equal(states[0]["generator"], reference["state"]["generator"])


@pytest.mark.slow
def test_grpo_on_a_policy_with_an_unused_critic(ray_cluster):
    """GRPO leaves the MLP's critic out of its loss: DDP must not wait for its gradients."""
    cfg = config("algo.name=grpo", "algo.group_size=2", "algo.outcome=return", "algo.norm_adv=false")
    batch = random_batch(seed=4, critic=False)
    reference = one_rank(cfg, [batch, batch])
    group = ranks(ray_cluster, cfg, 2)
    try:
        stats = [group.remote.update(batch, cfg.algo.lr).wait()[0] for _ in range(2)]
        weights = state_of(group.remote.export_weights().wait()[0])
    finally:
        group.shutdown()
    assert_same_update(weights, stats, reference)


class TreeFlattenHooks(TrainerWorker):
    """A trainer rank whose FSDP2 finds the tensors of a forward's output with ``tree_flatten``,
    as torch did up to at least 2.11 (later releases also walk dataclasses)."""

    def hook_outputs_by_tree_flatten(self) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
        from torch.utils._pytree import tree_flatten

        def register(state, output):  # noqa: ANN001, ANN202
            if torch.is_grad_enabled():
                for t in tree_flatten(output)[0]:
                    if torch.is_tensor(t) and t.requires_grad:
                        t.register_hook(state._pre_backward)
            return output

        FSDPState._register_pre_backward_hook = register


@pytest.mark.slow
def test_fsdp_finds_the_backward_of_evaluate_where_it_flattens_the_output(ray_cluster):
    """Seen on an H200 with torch 2.11: a one-rank FSDP2 trainer reported grad_norm 0.0 and never
    moved (the backward hook of ``evaluate``'s output was never registered: FSDP2 looked for its
    tensors with ``tree_flatten``, to which a plain dataclass was one leaf). ``Evaluation`` is a
    pytree node, so that FSDP2 takes the step of one rank too."""
    cfg = config("workers.trainer_strategy=fsdp")
    batches = [random_batch(seed=1), random_batch(seed=2)]
    reference = one_rank(config(), batches)
    group = WorkerGroup(ray_cluster, TreeFlattenHooks, 1, cfg, OBS, ACT, name="fsdp-tree-flatten")
    try:
        group.remote.hook_outputs_by_tree_flatten().wait()
        host, port = group.on(0).rendezvous().result()
        assert group.remote.join(host, port).result() == "fsdp x1"
        stats = [group.remote.update(b, cfg.algo.lr).result() for b in batches]
        assert_same_update(state_of(group.remote.export_weights().result()), stats, reference)
    finally:
        group.shutdown()


def test_every_rank_makes_the_same_calls_over_its_block():
    """The split of a minibatch over ranks and micro-batches, by hand: blocks of ``tensor_split``;
    every rank makes as many calls as the largest block needs; a rank without rows repeats row 0
    in a call that is not real."""

    class Rank(DataParallel):
        def __init__(self, rank: int, world_size: int) -> None:
            self.rank, self.world_size = rank, world_size

    def calls(rank: int, world: int, n: int, size: int | None) -> list[tuple[list[int], bool]]:
        return [(idx.tolist(), real) for idx, real in Rank(rank, world).calls(n, size)]

    assert calls(0, 2, 9, None) == [([0, 1, 2, 3, 4], True)]
    assert calls(1, 2, 9, None) == [([5, 6, 7, 8], True)]
    assert calls(0, 2, 9, 2) == [([0, 1], True), ([2, 3], True), ([4], True)]
    assert calls(1, 2, 9, 2) == [([5, 6], True), ([7], True), ([8], True)]  # 3 calls like rank 0
    assert calls(2, 3, 2, None) == [([0], False)]  # 2 rows over 3 ranks: rank 2 has none
    assert SINGLE.calls(5, 2)[0][0].tolist() == [0, 1] and SINGLE.gather(torch.ones(3), 3).tolist() == [1, 1, 1]
