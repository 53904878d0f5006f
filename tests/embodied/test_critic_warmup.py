"""algo.critic_warmup: the first PPO updates of a run step only the critic's own parameters."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.algorithms import build_algorithm, build_optimizer
from embodied.algorithms.config import AlgoConfig
from embodied.rl import TrajectoryBatch
from policies.config import PolicyConfig
from policies.registry import build_policy


def batch(T: int = 8, B: int = 4) -> TrajectoryBatch:
    g = torch.Generator().manual_seed(0)
    return TrajectoryBatch(
        obs={"state": torch.randn(T, B, 3, generator=g)},
        actions=torch.randn(T, B, 2, generator=g).clamp(-1, 1),
        logprobs=torch.randn(T, B, generator=g) - 2.0,
        rewards=torch.randn(T, B, 1, generator=g),
        terminated=torch.zeros(T, B, 1, dtype=torch.bool),
        truncated=torch.zeros(T, B, 1, dtype=torch.bool),
        valid=torch.ones(T, B, 1, dtype=torch.bool),
        values=torch.zeros(T, B),
        final_values=torch.zeros(T, B),
        last_values=torch.zeros(B),
    ).check()


def test_warmup_updates_move_only_the_critic():
    obs_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)})
    policy = build_policy(PolicyConfig(name="mlp"), obs_space, gym.spaces.Box(-1, 1, (2,), np.float32))
    cfg = AlgoConfig(name="ppo", critic_warmup=1, epochs=1, num_minibatches=1)
    algo = build_algorithm(cfg)
    optimizer = build_optimizer(policy.parameters(), cfg)
    critic = {id(p) for p in policy.critic_parameters()}
    assert critic and len(critic) < len(list(policy.parameters()))

    def moved(update_index: int) -> tuple[bool, bool]:
        before = {id(p): p.detach().clone() for p in policy.parameters()}
        stats = algo.update(policy, optimizer, batch(), lr=1e-2, update_index=update_index)
        changed = {id(p): not torch.equal(before[id(p)], p.detach()) for p in policy.parameters()}
        assert stats["losses/critic_warmup"] == float(update_index < cfg.critic_warmup)
        return any(changed[i] for i in critic), any(v for i, v in changed.items() if i not in critic)

    assert moved(0) == (True, False)  # the warmup update: the critic alone
    assert moved(1) == (True, True)  # after it: the actor too


def test_critic_warmup_must_be_a_non_negative_integer():
    with pytest.raises(Exception, match="critic_warmup"):
        AlgoConfig(name="ppo", critic_warmup=-1)
