"""PPO (Schulman et al. 2017) with GAE: a critic's values as the baseline.

    advantages:  each decision's reward (a chunk of C env steps discounted inside, times
                 ``reward_scale``) and how its episode ended (termination is terminal unless
                 ``bootstrap_terminated``; a time limit bootstraps from V(final obs)), into GAE at
                 ``gamma**C`` per decision. Every decision enters the loss.
    minibatch:   advantages normalized to mean 0 / std 1 (``norm_adv``, on by default for PPO).
    loss:        clipped surrogate - entropy bonus (+ KL to a reference)  +  vf_coef * value loss,
                 the value loss clipped around the old values (``value_clip``) and averaged over
                 the minibatch's samples.
"""

from __future__ import annotations

from typing import Any

import torch

from embodied.algorithms.base import ALGORITHMS, Advantages, Algorithm
from embodied.rl import (
    ADVANTAGE_ESTIMATORS,
    LossAggCounts,
    Samples,
    TrajectoryBatch,
    agg_loss,
    bootstrap_rule,
    chunk_bootstrap_discount,
    chunk_rewards,
    decision_ends,
    value_errors,
)


@ALGORITHMS.register("ppo")
class PPO(Algorithm):
    """PPO with a critic and GAE advantages."""

    name = "ppo"
    estimators = ("gae",)
    summed_stats = Algorithm.summed_stats | {"losses/value"}

    @property
    def needs_critic(self) -> bool:
        return True

    def advantages(self, batch: TrajectoryBatch) -> Advantages:
        cfg = self.cfg
        if batch.values is None or batch.final_values is None or batch.last_values is None:
            raise ValueError("PPO needs the rollout's values: the policy has no critic (algo.name=grpo trains without one)")
        rewards = chunk_rewards(batch.rewards.float(), batch.valid, cfg.gamma) * cfg.reward_scale  # (T, B)
        terminated, truncated, steps = decision_ends(batch.terminated, batch.truncated, batch.valid)
        terminal, bootstrap = bootstrap_rule(terminated, truncated, cfg.bootstrap_terminated)
        final_values = batch.final_values.float() * chunk_bootstrap_discount(steps, batch.chunk, cfg.gamma)
        values = batch.values.float()
        advantages, returns = ADVANTAGE_ESTIMATORS.get(cfg.estimator)(
            rewards, values, terminal, bootstrap, final_values, batch.last_values.float(),
            gamma=cfg.gamma ** batch.chunk, lam=cfg.gae_lambda,
        )
        var_returns = torch.var(returns)
        explained = 1 - torch.var(returns - values) / var_returns if var_returns > 0 else torch.tensor(float("nan"))
        return Advantages(advantages, returns, torch.ones_like(terminal),
                          {"losses/explained_variance": float(explained)})

    def loss(self, policy: Any, mb: Samples, counts: LossAggCounts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.cfg
        ev = policy.evaluate(mb.obs, mb.actions)
        loss, stats = self.policy_objective(ev, mb, counts)
        if ev.values is None:
            raise ValueError("PPO needs a critic: the policy's evaluate returned no values")
        values = ev.values.to(torch.promote_types(ev.values.dtype, torch.float32))  # bf16 heads: fp32 math
        errors = value_errors(values, mb.fields["old_values"].to(values.dtype), mb.fields["returns"].to(values.dtype), cfg.value_clip)  # (M,)
        value = agg_loss(errors, None, "seq-mean-token-sum", num_seqs=counts.num_seqs)  # sum / the minibatch's samples
        stats["losses/value"] = value.detach()
        return loss + cfg.vf_coef * value, stats
