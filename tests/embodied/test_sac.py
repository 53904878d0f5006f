"""SAC's and RLPD's math against hand-computed numbers on tiny tensors (the production functions),
and one update of the algorithm object: what it moves, the temperature's direction, the target
critics' Polyak step, the random-subset min of RLPD, and the state round trip."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from embodied.algorithms import ALGORITHMS, SACConfig, build_off_policy
from embodied.algorithms.sac import (
    actor_loss,
    critic_loss,
    merge_optimizer_states,
    polyak_update,
    soft_td_target,
    split_optimizer_state,
    squashed_gaussian,
    temperature_loss,
)
from embodied.rl.replay import ReplaySample


def test_the_soft_td_target_takes_the_min_of_the_critics_and_the_entropy_backup():
    rewards, discounts = torch.tensor([1.0, 0.5]), torch.tensor([0.8, 0.0])  # the second sample terminated
    next_q = torch.tensor([[2.0, 7.0], [3.0, 5.0]])  # (E=2, M=2)
    next_logprob = torch.tensor([-1.0, 4.0])
    target = soft_td_target(rewards, discounts, next_q, next_logprob, alpha=0.5)
    # 1 + 0.8 * (min(2, 3) - 0.5 * -1) = 1 + 0.8 * 2.5 = 3.0; 0.5 + 0 * ... = 0.5
    assert torch.allclose(target, torch.tensor([3.0, 0.5]))
    plain = soft_td_target(rewards, discounts, next_q, next_logprob, alpha=0.5, backup_entropy=False)
    assert torch.allclose(plain, torch.tensor([1.0 + 0.8 * 2.0, 0.5]))
    with pytest.raises(ValueError, match=r"soft_td_target: next_q must be \(E, M=2\)"):
        soft_td_target(rewards, discounts, next_q[:, :1], next_logprob, 0.5)


def test_the_critic_loss_sums_each_critics_mean_squared_error():
    q = torch.tensor([[1.0, 2.0], [0.0, 4.0]])
    target = torch.tensor([2.0, 2.0])
    # critic 0: (1 + 0) / 2 = 0.5; critic 1: (4 + 4) / 2 = 4
    assert critic_loss(q, target).item() == pytest.approx(4.5)


def test_the_actor_and_temperature_losses():
    logprob, q = torch.tensor([-1.0, 1.0]), torch.tensor([2.0, 4.0])
    # mean(0.5 * -1 - 2, 0.5 * 1 - 4) = mean(-2.5, -3.5) = -3
    assert actor_loss(logprob, q, 0.5).item() == pytest.approx(-3.0)
    log_alpha = torch.tensor([math.log(2.0)], requires_grad=True)
    # target entropy -1: mean(-2 * (-1 - 1), -2 * (1 - 1)) = mean(4, 0) = 2
    loss = temperature_loss(log_alpha, logprob, target_entropy=-1.0)
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    assert log_alpha.grad.item() > 0  # entropy 0 above the target -1: alpha falls (gradient descent)


def test_the_squashed_gaussian_log_probability_has_the_change_of_variables():
    mean, log_std, noise = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, math.log(0.5)]]), torch.tensor([[0.0, 2.0]])
    scale, bias = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])
    actions, logprob = squashed_gaussian(mean, log_std, noise, scale, bias)
    u = torch.tensor([0.0, 1.0 + 0.5 * 2.0])
    assert torch.allclose(actions, torch.tanh(u) * scale + bias)
    gaussian = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum()
    squash = torch.log(scale * (1 - torch.tanh(u) ** 2) + 1e-6).sum()
    assert logprob.item() == pytest.approx((gaussian - squash).item(), abs=1e-5)


def test_polyak_moves_the_target_by_tau():
    source, target = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
    source.weight.data.fill_(1.0)
    target.weight.data.fill_(0.0)
    polyak_update(target, source, 0.25)
    assert target.weight.item() == pytest.approx(0.25)


def batch(m=8, obs_dim=3, action_dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ReplaySample({"state": torch.randn(m, obs_dim, generator=g)}, torch.rand(m, action_dim, generator=g) * 2 - 1,
                        torch.randn(m, generator=g), {"state": torch.randn(m, obs_dim, generator=g)}, torch.full((m,), 0.8))


def sac(**kw):
    cfg = SACConfig(hidden_sizes=[16, 16], batch_size=8, **kw)
    return build_off_policy(cfg, 3, [-1.0, -1.0], [1.0, 1.0])


def test_one_update_moves_critic_actor_temperature_and_targets():
    algo = sac(tau=0.5)
    before = {k: v.clone() for k, v in algo.tensors().items()}
    stats = algo.update(batch(), torch.Generator().manual_seed(1))
    after = algo.tensors()
    moved = lambda prefix: any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix))  # noqa: E731
    assert moved("actor.") and moved("critic.") and moved("critic_target.") and moved("log_alpha")
    assert set(stats) >= {"losses/qf_loss", "losses/actor_loss", "losses/alpha", "losses/alpha_loss", "losses/entropy"}
    # target = 0.5 * critic + 0.5 * old target: halfway between the old target and the new critic
    name = next(k for k in after if k.startswith("critic_target.") and k.endswith("weight"))
    critic = after[name.replace("critic_target.", "critic.")]
    assert torch.allclose(after[name], 0.5 * before[name] + 0.5 * critic, atol=1e-6)
    assert algo.updates == 1


def test_the_actor_steps_every_policy_frequency_updates():
    algo = sac(policy_frequency=2)
    actor = {k: v.clone() for k, v in algo.actor.state_dict().items()}
    assert "losses/actor_loss" not in algo.update(batch())
    assert all(torch.equal(v, algo.actor.state_dict()[k]) for k, v in actor.items())
    assert "losses/actor_loss" in algo.update(batch())


def test_rlpd_defaults_to_ten_layer_normed_critics_and_a_random_pair_in_the_target():
    cfg = SACConfig(name="rlpd")
    assert (cfg.critics, cfg.min_critics, cfg.layer_norm, cfg.actor_combine) == (10, 2, True, "mean")
    assert cfg.entropy_target(4) == -2.0 and SACConfig().entropy_target(4) == -4.0
    algo = sac(name="rlpd")
    assert type(algo) is ALGORITHMS.get("rlpd") and algo.critic(torch.zeros(5, 3), torch.zeros(5, 2)).shape == (10, 5)
    assert any(isinstance(m, torch.nn.LayerNorm) for m in algo.critic.modules())
    algo.update(batch())
    with pytest.raises(ValueError, match=r"algo.num_min_qs in \[1, num_qs\]"):
        SACConfig(num_qs=2, num_min_qs=3)


def test_the_state_round_trip_continues_with_the_same_updates():
    a = sac()
    a.update(batch(seed=1), torch.Generator().manual_seed(0))
    b = sac(alpha=0.2)
    b.load_tensors({k: v.clone() for k, v in a.tensors().items()})
    state = a.optimizer_state()
    assert len(state["param_groups"]) == 3
    b.load_optimizer_state(split_roundtrip(state))
    ga, gb = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for seed in (2, 3):
        a.update(batch(seed=seed), ga)
        b.update(batch(seed=seed), gb)
    assert all(torch.equal(v, b.tensors()[k]) for k, v in a.tensors().items())


def split_roundtrip(state):
    """The merged state split and merged again, copied (torch's load_state_dict keeps the tensors it
    is given: two optimizers must not share them)."""
    return copy.deepcopy(merge_optimizer_states(split_optimizer_state(state, [1, 1, 1])))
