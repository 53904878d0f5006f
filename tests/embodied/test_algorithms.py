"""Algorithm objects (PPO, GRPO): advantages from a batch's facts by hand, the shared update loop."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from embodied.algorithms import AlgoConfig, build_algorithm
from embodied.config import build_config
from embodied.errors import ConfigError
from embodied.runtime.distributed import clip_grad_norm
from embodied.rl import (
    Samples,
    TrajectoryBatch,
    chunk_bootstrap_discount,
    chunk_rewards,
    decision_ends,
    first_episode_mask,
    first_episode_outcome,
)


def batch(rewards, terminated=None, truncated=None, valid=None, values=None, final_values=None, last_values=None,
          success=None, group_ids=None, logprobs=None, actions=None) -> TrajectoryBatch:
    """A (T, B, C) batch from nested lists; missing flags are all-False (valid: all-True)."""
    r = np.asarray(rewards, np.float32)
    if r.ndim == 2:
        r = r[..., None]
    T, B, C = r.shape
    flags = lambda x, fill: np.full((T, B, C), fill) if x is None else np.asarray(x, bool).reshape(T, B, C)  # noqa: E731
    return TrajectoryBatch(
        obs={"state": np.zeros((T, B, 1), np.float32)},
        actions=np.zeros((T, B), np.int64) if actions is None else np.asarray(actions),
        logprobs=np.zeros((T, B), np.float32) if logprobs is None else np.asarray(logprobs, np.float32),
        rewards=r, terminated=flags(terminated, False), truncated=flags(truncated, False), valid=flags(valid, True),
        values=None if values is None else np.asarray(values, np.float32).reshape(T, B),
        final_values=None if final_values is None else np.asarray(final_values, np.float32).reshape(T, B),
        last_values=None if last_values is None else np.asarray(last_values, np.float32).reshape(B),
        success=None if success is None else np.asarray(success, bool).reshape(T, B, C),
        group_ids=None if group_ids is None else np.asarray(group_ids),
    ).check().to_torch()


# --- PPO: which episode ends bootstrap (one env, gamma 0.5, lambda 1) --------------------------------


def _three_steps(terminated, truncated) -> TrajectoryBatch:
    # rewards 1, 1, 1; V = 0 everywhere except V(final obs of step 1) = 4 and V(obs_3) = 2
    return batch([[1.0], [1.0], [1.0]], terminated=terminated, truncated=truncated, values=[[0.0]] * 3,
                 final_values=[[0.0], [4.0], [0.0]], last_values=[2.0])


@pytest.mark.parametrize("bootstrap", [False, True])
def test_ppo_bootstraps_terminations_only_when_asked(bootstrap):
    ppo = build_algorithm(AlgoConfig(gamma=0.5, gae_lambda=1.0, bootstrap_terminated=bootstrap))
    adv = ppo.advantages(_three_steps([[0], [1], [0]], None))
    # episode 1 = steps 0-1 ending in a termination at step 1; episode 2 = step 2, bootstrapped by V(obs_3) = 2
    end = 0.5 * 4.0 if bootstrap else 0.0
    expected = [1 + 0.5 * (1 + end), 1 + end, 1 + 0.5 * 2.0]
    torch.testing.assert_close(adv.returns[:, 0], torch.tensor(expected))
    torch.testing.assert_close(adv.advantages, adv.returns)  # values are 0
    assert adv.mask.all()


def test_ppo_bootstraps_truncations_either_way():
    for bootstrap in (False, True):
        ppo = build_algorithm(AlgoConfig(gamma=0.5, gae_lambda=1.0, bootstrap_terminated=bootstrap))
        adv = ppo.advantages(_three_steps(None, [[0], [1], [0]]))
        assert adv.returns[1, 0].item() == pytest.approx(1 + 0.5 * 4.0)


def test_ppo_without_values_says_to_use_grpo():
    with pytest.raises(ValueError, match="no critic"):
        build_algorithm(AlgoConfig()).advantages(batch([[1.0]]))


# --- action chunks: one decision per chunk, discounted as its env steps -------------------------------


def test_chunk_functions_by_hand():
    """Chunks of C=3 steps, gamma 0.5: env 0 runs the chunk out, env 1 terminates at its second
    step (its third is not part of the episode), env 2 is truncated at its first step."""
    rewards = torch.tensor([[[1.0, 2.0, 4.0], [1.0, 2.0, 9.0], [3.0, 0.0, 0.0]]])  # (T=1, B=3, C=3)
    terminated = torch.tensor([[[0, 0, 0], [0, 1, 0], [0, 0, 0]]], dtype=torch.bool)
    truncated = torch.tensor([[[0, 0, 0], [0, 0, 0], [1, 0, 0]]], dtype=torch.bool)
    valid = torch.tensor([[[1, 1, 1], [1, 1, 0], [1, 0, 0]]], dtype=torch.bool)
    torch.testing.assert_close(chunk_rewards(rewards, valid, 0.5)[0], torch.tensor([1 + 0.5 * 2 + 0.25 * 4, 1 + 0.5 * 2, 3.0]))
    term, trunc, steps = decision_ends(terminated, truncated, valid)
    assert term[0].tolist() == [False, True, False] and trunc[0].tolist() == [False, False, True]
    assert steps[0].tolist() == [3, 2, 1]
    torch.testing.assert_close(chunk_bootstrap_discount(steps, 3, 0.5)[0], torch.tensor([1.0, 2.0, 4.0]))  # 0.5 ** (steps - 3)


def test_chunked_gae_equals_the_per_step_discounted_return():
    """With lambda 1 a chunk-level advantage is the per-step discounted return (bootstrapped by
    V(final obs) of a truncation inside a chunk, after the steps actually taken)."""
    gamma, chunk = 0.9, 4
    rng = np.random.default_rng(0)
    step_rewards = rng.normal(size=(3, 1, chunk)).astype(np.float32)  # 3 decisions of one env
    valid = np.ones((3, 1, chunk), bool)
    truncated = np.zeros((3, 1, chunk), bool)
    valid[2, 0, 2:] = False  # the episode is truncated at the second step of the last chunk
    truncated[2, 0, 1] = True
    values, v_final, v_last = [[0.3], [-0.2], [0.1]], 1.5, 7.0
    b = batch(step_rewards * valid, truncated=truncated, valid=valid, values=values,
              final_values=[[0.0], [0.0], [v_final]], last_values=[v_last])  # v_last: the next episode's
    adv = build_algorithm(AlgoConfig(gamma=gamma, gae_lambda=1.0)).advantages(b).advantages
    flat = step_rewards.reshape(-1)[: 2 * chunk + 2]  # the 10 steps the episode took
    discounted = sum(gamma**k * r for k, r in enumerate(flat)) + gamma ** len(flat) * v_final
    assert adv[0, 0].item() == pytest.approx(discounted - values[0][0], rel=1e-5)
    later = sum(gamma**k * r for k, r in enumerate(flat[chunk:])) + gamma ** (len(flat) - chunk) * v_final
    assert adv[1, 0].item() == pytest.approx(later - values[1][0], rel=1e-5)


# --- GRPO: one episode per env, compared with its group -----------------------------------------------


def test_first_episode_mask_and_outcome_by_hand():
    # 4 decisions of 3 envs: env 0 terminates at t=1 (then a new episode), env 1 is truncated at
    # t=3, env 2 never ends. Success: env 0 at t=1, env 1 never, env 2 at t=0 (kept going).
    term = torch.zeros(4, 3, 1, dtype=torch.bool)
    trunc = torch.zeros(4, 3, 1, dtype=torch.bool)
    term[1, 0, 0] = True
    trunc[3, 1, 0] = True
    success = torch.zeros(4, 3, 1, dtype=torch.bool)
    success[1, 0, 0] = success[0, 2, 0] = True
    success[3, 0, 0] = True  # env 0's second episode: not part of its outcome
    rewards = torch.arange(12, dtype=torch.float32).reshape(4, 3, 1)
    valid = torch.ones(4, 3, 1, dtype=torch.bool)
    t, u, _ = decision_ends(term, trunc, valid)
    assert first_episode_mask(t, u).T.tolist() == [[True, True, False, False], [True] * 4, [True] * 4]
    outcome, finished = first_episode_outcome(rewards, valid, term, trunc, success, "success")
    assert outcome.tolist() == [1.0, 0.0, 1.0] and finished.tolist() == [True, True, False]
    returns, _ = first_episode_outcome(rewards, valid, term, trunc, None, "return")
    assert returns.tolist() == [0 + 3, 1 + 4 + 7 + 10, 2 + 5 + 8 + 11]


def test_grpo_advantages_per_group_and_dynamic_sampling():
    # 6 envs in 3 groups of 2, one decision each; successes: group 0 (1, 0), group 1 (1, 1), group 2 (0, 0)
    ends = [[1, 1, 1, 1, 1, 1]]
    b = batch([[0.0] * 6], truncated=ends, success=[[1, 0, 1, 1, 0, 0]], group_ids=[0, 0, 1, 1, 2, 2])
    cfg = dict(name="grpo", group_size=2)
    adv = build_algorithm(AlgoConfig(**cfg)).advantages(b)
    std = float(np.std([1.0, 0.0], ddof=1))
    torch.testing.assert_close(adv.advantages[0], torch.tensor([0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0, 0, 0, 0]))
    assert adv.mask.all() and adv.returns is None
    assert adv.stats["grpo/frac_reward_zero_std"] == pytest.approx(2 / 3)
    filtered = build_algorithm(AlgoConfig(**cfg, filter_groups=True)).advantages(b)
    assert filtered.mask[0].tolist() == [True, True, False, False, False, False]  # exactly the zero-spread groups out
    dr = build_algorithm(AlgoConfig(**cfg, norm_adv_by_std_in_grpo=False)).advantages(b)
    torch.testing.assert_close(dr.advantages[0], torch.tensor([0.5, -0.5, 0, 0, 0, 0]))


def test_grpo_warns_when_no_group_of_a_batch_has_any_spread(caplog):
    ends = [[1, 1, 1, 1]]
    equal = batch([[0.0] * 4], truncated=ends, success=[[1, 1, 0, 0]], group_ids=[0, 0, 1, 1])  # all right, all wrong
    mixed = batch([[0.0] * 4], truncated=ends, success=[[1, 0, 0, 0]], group_ids=[0, 0, 1, 1])
    algo = build_algorithm(AlgoConfig(name="grpo", group_size=2))
    with caplog.at_level("WARNING", logger="embodied.grpo"):
        algo.advantages(mixed)
        assert caplog.records == []  # one group has a signal: silent
        algo.advantages(equal)
        assert len(caplog.records) == 1 and "no learning signal: all 2 group(s)" in caplog.records[0].getMessage()
        assert "algo.group_size" in caplog.records[0].getMessage()
        for _ in range(3):
            algo.advantages(equal)
        assert len(caplog.records) == 1  # rate-limited: not every batch


def test_grpo_equal_episode_weight_makes_a_short_success_weigh_as_much_as_a_long_failure():
    # one group of 2 envs over 4 decisions: env 0 succeeds at its 1st decision (then auto-resets:
    # the 3 decisions after are not its rollout), env 1 is truncated at its 4th; advantages +-a
    b = batch([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], terminated=[[1, 0], [0, 0], [0, 0], [0, 0]],
              truncated=[[0, 0], [0, 0], [0, 0], [0, 1]], success=[[1, 0], [0, 0], [0, 0], [0, 0]], group_ids=[0, 0])
    a = 0.5 / (float(np.std([1.0, 0.0], ddof=1)) + 1e-6)
    plain = build_algorithm(AlgoConfig(name="grpo", group_size=2)).advantages(b)
    assert plain.mask.tolist() == [[True, True], [False, True], [False, True], [False, True]]
    torch.testing.assert_close(plain.advantages[plain.mask], torch.tensor([a, -a, -a, -a, -a]))  # row-major: the failure weighs 4x
    equal = build_algorithm(AlgoConfig(name="grpo", group_size=2, episode_weight="equal")).advantages(b)
    # mean length 2.5: env 0's one decision x 2.5, env 1's four x 2.5 / 4; each episode sums to +-2.5 a
    torch.testing.assert_close(equal.advantages[equal.mask], torch.tensor([2.5 * a] + [-0.625 * a] * 4))
    assert equal.mask.tolist() == plain.mask.tolist()
    with pytest.raises(ConfigError, match="episode_weight=equal"):
        build_config(AlgoConfig, {"name": "grpo", "outcome": "return_to_go", "episode_weight": "equal"})


def test_grpo_needs_groups_and_a_group_of_two():
    with pytest.raises(ValueError, match="group ids"):
        build_algorithm(AlgoConfig(name="grpo", group_size=2)).advantages(batch([[1.0]], truncated=[[1]], success=[[1]]))
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        build_config(AlgoConfig, {"name": "grpo", "group_size": 1})


def test_trl_names_are_aliases():
    cfg = build_config(AlgoConfig, {"name": "grpo", "num_generations": 4, "loss_type": "dr_grpo", "scale_rewards": "none",
                                    "epsilon": 0.1, "epsilon_high": 0.28, "beta": 0.04, "ent_coef": 0.01})
    assert (cfg.group_size, cfg.loss_agg_mode, cfg.norm_adv_by_std_in_grpo) == (4, "seq-mean-token-sum-norm", False)
    assert (cfg.clip_low, cfg.clip_high, cfg.kl_loss_coef, cfg.entropy_coeff) == (0.1, 0.28, 0.04, 0.01)
    with pytest.raises(ConfigError, match="same setting"):
        build_config(AlgoConfig, {"epsilon": 0.1, "clip_ratio_low": 0.2})


# --- the shared update loop ----------------------------------------------------------------------------


class TokenPolicy(nn.Module):
    """A tiny token-level policy: K=3 tokens over a 5-symbol vocabulary from a 2-d state."""

    has_critic = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(2, 3 * 5)

    def evaluate(self, obs, actions):
        logits = self.head(obs["state"]).reshape(-1, 3, 5)
        dist = torch.distributions.Categorical(logits=logits)
        from policies.base import Evaluation

        return Evaluation(dist.log_prob(actions), dist.entropy(), None)

    def update_normalizer(self, obs) -> None:
        pass


def _token_batch(envs: int = 8) -> TrajectoryBatch:
    rng = np.random.default_rng(1)
    policy = TokenPolicy()
    obs = rng.normal(size=(1, envs, 2)).astype(np.float32)
    actions = rng.integers(0, 5, (1, envs, 3))
    with torch.no_grad():
        logprobs = policy.evaluate({"state": torch.as_tensor(obs[0])}, torch.as_tensor(actions[0])).logprobs.numpy()[None]
    mask = np.ones((1, envs, 3), bool)
    mask[0, ::3, 2] = False  # some sequences are a token shorter
    b = TrajectoryBatch(
        obs={"state": obs}, actions=actions, logprobs=logprobs - 0.1, rewards=rng.normal(size=(1, envs, 1)).astype(np.float32),
        terminated=np.ones((1, envs, 1), bool), truncated=np.zeros((1, envs, 1), bool), valid=np.ones((1, envs, 1), bool),
        action_mask=mask, group_ids=np.arange(envs) // 4,
    )
    return b.check()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batching_does_not_change_the_update(mode):
    """A minibatch processed whole, or in micro-batches of 4, 2 or 1 samples with accumulated
    gradients, gives the same weights: every mode divides by the whole minibatch's counts."""
    results = []
    for micro in (None, 4, 2, 1):
        cfg = AlgoConfig(name="grpo", group_size=4, outcome="return", loss_agg_mode=mode, micro_batch_size=micro,
                         num_minibatches=1, epochs=1, max_grad_norm=1e9, clip_ratio_c=3.0, entropy_coeff=0.01)
        policy = TokenPolicy()
        opt = torch.optim.SGD(policy.parameters(), lr=0.5)
        build_algorithm(cfg).update(policy, opt, _token_batch(), lr=0.5, generator=torch.Generator().manual_seed(0))
        results.append(torch.cat([p.detach().reshape(-1) for p in policy.parameters()]))
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=1e-5, atol=1e-6)
    assert not torch.equal(results[0], torch.cat([p.reshape(-1) for p in TokenPolicy().parameters()]).detach())


def test_kl_to_a_reference_enters_the_loss():
    b = _token_batch()
    policy = TokenPolicy()
    with torch.no_grad():
        policy.head.bias.add_(0.3)  # moved away from the reference
    reference = TokenPolicy()
    algo = build_algorithm(AlgoConfig(name="grpo", group_size=4, outcome="return", use_kl_loss=True, kl_loss_coef=0.5,
                                      kl_loss_type="k1", num_minibatches=1, epochs=1))
    stats = algo.update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), b, lr=0.0, reference=reference)
    # k1 = logp - ref_logp averaged over the valid tokens (token-mean), at the unchanged weights (lr 0)
    with torch.no_grad():
        obs, actions = {"state": torch.as_tensor(b.obs["state"][0])}, torch.as_tensor(b.actions[0])
        diff = policy.evaluate(obs, actions).logprobs - reference.evaluate(obs, actions).logprobs
        expected = diff[torch.as_tensor(b.action_mask[0])].mean()
    assert stats["losses/kl_to_reference"] == pytest.approx(float(expected), rel=1e-5)
    with pytest.raises(RuntimeError, match="reference"):
        algo.update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), b, lr=0.0)


def test_rollout_importance_correction_recomputes_and_truncates():
    b = _token_batch()
    policy = TokenPolicy()
    algo = build_algorithm(AlgoConfig(name="grpo", group_size=4, outcome="return", rollout_is="token",
                                      rollout_is_threshold=1.05, num_minibatches=1, epochs=1))
    stats = algo.update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), b, lr=0.0)
    # the batch's logprobs are the policy's minus 0.1: every weight is exp(0.1) = 1.105 > 1.05, truncated
    assert stats["rollout_is/frac_truncated"] == pytest.approx(1.0)
    assert stats["rollout_is/ratio_mean"] == pytest.approx(float(np.exp(0.1)), rel=1e-5)
    assert stats["losses/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # PPO's ratio is to the recomputed logprobs


def test_a_non_finite_gradient_skips_the_step():
    b = _token_batch()
    policy = TokenPolicy()
    before = copy.deepcopy(policy.state_dict())
    b.rewards[:] = np.nan  # NaN outcomes -> NaN advantages -> NaN gradients
    stats = build_algorithm(AlgoConfig(name="grpo", group_size=4, outcome="return", num_minibatches=2, epochs=1)).update(
        policy, torch.optim.SGD(policy.parameters(), lr=0.1), b, lr=0.1)
    assert stats["losses/non_finite_steps"] == 2.0
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k])


def test_grpo_return_to_go_compares_members_at_the_same_step():
    # 2 decisions of 4 envs in 2 groups; env 1's episode ends at t=0 (its t=1 belongs to a new episode)
    b = batch([[1.0, 2.0, 3.0, 5.0], [10.0, 0.0, 30.0, 50.0]], truncated=[[0, 1, 0, 0], [1, 0, 1, 1]], group_ids=[0, 0, 1, 1])
    adv = build_algorithm(AlgoConfig(name="grpo", group_size=2, outcome="return_to_go")).advantages(b)
    # returns to go: group 0 at t=0: env 0: 1 + 10 = 11, env 1: 2 -> +-1/sqrt(2) (two values, Bessel std);
    # at t=1 only env 0 is still in its episode: a group of one -> 0. Group 1: (33, 55) at t=0, (30, 50) at t=1.
    h = float(1 / np.sqrt(2))
    torch.testing.assert_close(adv.advantages, torch.tensor([[h, -h, -h, h], [0.0, 0.0, -h, h]]), atol=1e-4, rtol=0)
    assert adv.mask.tolist() == [[True, True, True, True], [True, False, True, True]]


def test_discounted_returns_to_go_by_hand():
    from embodied.rl import first_episode_returns_to_go

    # one env, 3 decisions of C=2 steps, gamma 0.5; the episode ends at the first step of the last decision
    rewards = torch.tensor([[[1.0, 2.0]], [[4.0, 8.0]], [[16.0, 99.0]]])
    valid = torch.tensor([[[1, 1]], [[1, 1]], [[1, 0]]], dtype=torch.bool)
    ends = torch.zeros(3, 1, 2, dtype=torch.bool)
    ends[2, 0, 0] = True
    to_go = first_episode_returns_to_go(rewards, valid, ends, torch.zeros_like(ends), gamma=0.5)
    # steps: 1, 2, 4, 8, 16 -> from step 0: 1 + 1 + 1 + 1 + 1 = 5; from step 2: 4 + 4 + 4 = 12; from step 4: 16
    torch.testing.assert_close(to_go[:, 0], torch.tensor([5.0, 12.0, 16.0]))


# --- micro-batches: the gradient and the logged losses of one pass -----------------------------------


class _ActorCritic(nn.Module):
    """A tiny discrete actor-critic with the policy contract's ``evaluate``."""

    has_critic = True

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pi, self.v = nn.Linear(3, 2), nn.Linear(3, 1)

    def evaluate(self, obs, actions):
        from policies.base import Evaluation

        dist = torch.distributions.Categorical(logits=self.pi(obs["state"]))
        return Evaluation(dist.log_prob(actions), dist.entropy(), self.v(obs["state"]).squeeze(-1))

    def update_normalizer(self, obs) -> None:
        pass


def _ppo_batch(T: int = 5, B: int = 3) -> TrajectoryBatch:
    rng = np.random.default_rng(7)
    b = batch(rng.normal(size=(T, B)), terminated=rng.random((T, B)) < 0.3, values=rng.normal(size=(T, B)),
              final_values=np.zeros((T, B)), last_values=rng.normal(size=B),
              logprobs=np.log(rng.uniform(0.3, 0.7, (T, B))), actions=rng.integers(0, 2, (T, B)))
    b.obs = {"state": torch.as_tensor(rng.normal(size=(T, B, 3)), dtype=torch.float32)}
    return b


@pytest.mark.parametrize("micro", [1, 4, 7])
def test_ppo_micro_batches_give_the_gradient_and_losses_of_one_pass(micro):
    """One SGD step at lr 1 on one minibatch of 15 samples moves the weights by minus the
    gradient: accumulated over micro-batches of 1, 4 or 7 samples it is the gradient of one
    pass, and the logged losses are the minibatch's (not a micro-batch's share of them)."""
    results = []
    for size in (None, micro):
        cfg = AlgoConfig(num_minibatches=1, epochs=1, micro_batch_size=size, max_grad_norm=1e9, entropy_coeff=0.01)
        policy = _ActorCritic()
        before = [p.detach().clone() for p in policy.parameters()]
        stats = build_algorithm(cfg).update(policy, torch.optim.SGD(policy.parameters(), lr=1.0), _ppo_batch(), lr=1.0,
                                            generator=torch.Generator().manual_seed(0))
        grads = [b - p.detach() for b, p in zip(before, policy.parameters())]
        results.append((grads, stats))
    (one_pass, whole), (accumulated, micro_stats) = results
    for g1, g2 in zip(one_pass, accumulated):
        torch.testing.assert_close(g2, g1, rtol=1e-5, atol=1e-7)
    assert max(float(g.abs().max()) for g in one_pass) > 1e-3
    for key in ("losses/policy", "losses/value", "losses/entropy", "losses/approx_kl", "losses/grad_norm"):
        assert micro_stats[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
    assert micro_stats["charts/micro_batches"] == -(-15 // micro) and whole["charts/micro_batches"] == 1


def _samples(advantages: list[float]) -> Samples:
    n = len(advantages)
    return Samples(obs={"state": torch.zeros(n, 1)}, actions=torch.zeros(n, dtype=torch.long), logprobs=torch.zeros(n),
                   fields={"advantages": torch.tensor(advantages)})


@pytest.mark.parametrize(("name", "norm_adv", "normalized"), [
    ("ppo", None, True), ("ppo", False, False), ("grpo", None, False), ("grpo", True, True),
])
def test_minibatch_advantages_are_normalized_for_ppo_and_where_a_grpo_recipe_asks(name, norm_adv, normalized):
    """``algo.norm_adv`` unset means the algorithm's habit: PPO normalizes each minibatch's
    advantages, GRPO keeps its group advantages as they are unless the recipe switches it on."""
    cfg = AlgoConfig(name=name, norm_adv=norm_adv, **({"group_size": 2} if name == "grpo" else {}))
    adv = build_algorithm(cfg).minibatch(_samples([1.0, 2.0, 3.0, 6.0])).fields["advantages"]
    if normalized:
        # mean 3, sample std sqrt((4 + 1 + 0 + 9) / 3)
        torch.testing.assert_close(adv, torch.tensor([-2.0, -1.0, 0.0, 3.0]) / float(np.sqrt(14 / 3)), atol=1e-5, rtol=0)
    else:
        assert adv.tolist() == [1.0, 2.0, 3.0, 6.0]


@pytest.mark.parametrize("target_kl", [None, 1e-9])
def test_early_stopping_reads_the_kl_of_the_step_just_taken(target_kl):
    """The batch's logprobs are not the policy's, so the first step's approximate KL is > 0:
    a tiny ``target_kl`` stops the update after its first minibatch, None runs every epoch."""
    cfg = AlgoConfig(num_minibatches=3, epochs=4, target_kl=target_kl)
    policy = _ActorCritic()
    stats = build_algorithm(cfg).update(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), _ppo_batch(), lr=1e-3,
                                        generator=torch.Generator().manual_seed(0))
    assert stats["losses/approx_kl"] > 0
    assert stats["losses/epochs"] == (4.0 if target_kl is None else 1.0)


def test_an_unweighted_entropy_is_still_logged():
    """With ``entropy_coeff`` 0 the entropy stays out of the loss's graph but is logged as it is
    with a bonus (one step: measured before the weights move)."""
    logged = []
    for coeff in (0.0, 0.01):
        policy = _ActorCritic()
        cfg = AlgoConfig(num_minibatches=1, epochs=1, entropy_coeff=coeff)
        stats = build_algorithm(cfg).update(policy, torch.optim.SGD(policy.parameters(), lr=0.1), _ppo_batch(), lr=0.1,
                                            generator=torch.Generator().manual_seed(0))
        logged.append(stats["losses/entropy"])
    assert logged[0] == pytest.approx(logged[1]) and 0 < logged[0] <= np.log(2) + 1e-6


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_the_updates_gradient_clip_is_torchs(scale):
    """``clip_grad_norm`` (the update's, lean on one device and dtype) returns and leaves what
    ``torch.nn.utils.clip_grad_norm_`` does, below, near and far above the bound; gradients in
    two dtypes go to torch's own."""
    torch.manual_seed(0)
    for dtypes in ([torch.float32] * 3, [torch.float32, torch.float64, torch.float32]):
        ours, theirs = [], []
        for params in (ours, theirs):
            for i, dtype in enumerate(dtypes):
                p = torch.nn.Parameter(torch.zeros(4 + i, dtype=dtype))
                p.grad = (torch.arange(4 + i, dtype=dtype) - 1.5) * scale
                params.append(p)
        norm = clip_grad_norm(ours, 0.5)
        expected = float(torch.nn.utils.clip_grad_norm_(theirs, 0.5))
        assert norm == pytest.approx(expected, rel=1e-6)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    assert clip_grad_norm([torch.nn.Parameter(torch.zeros(2))], 0.5) == 0.0  # no gradients at all
