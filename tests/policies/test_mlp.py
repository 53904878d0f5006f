"""The MLP actor-critic: contract shapes, evaluate/act consistency, the deterministic mode, RunningNorm."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.errors import UserError
from policies.config import PolicyConfig
from policies.models.mlp import MLPActorCritic, RunningNorm, mlp
from policies.registry import build_policy
from tests.policies.contract import assert_gradients_reach_every_parameter

STATE = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)})
BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX_2D = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
DISCRETE = gym.spaces.Discrete(4)


def make(action_space: gym.spaces.Space, space: gym.spaces.Dict = STATE, **cfg) -> MLPActorCritic:
    torch.manual_seed(0)
    policy = build_policy(PolicyConfig(name="mlp", **cfg), space, action_space)
    assert isinstance(policy, MLPActorCritic)
    return policy


def states(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"state": torch.randn(batch, 6, generator=torch.Generator().manual_seed(seed))}


@pytest.mark.parametrize(
    "action_space,action_shape",
    [(BOX, (5, 3)), (BOX_2D, (5, 2, 3)), (DISCRETE, (5,))],
    ids=["box", "box-2d", "discrete"],
)
def test_shapes(action_space: gym.spaces.Space, action_shape: tuple[int, ...]) -> None:
    policy = make(action_space)
    obs = states(5)
    out = policy.act(obs)
    assert out.actions.shape == action_shape
    assert out.logprobs.shape == (5,) and out.values is not None and out.values.shape == (5,)
    ev = policy.evaluate(obs, out.actions)
    assert ev.logprobs.shape == ev.entropy.shape == (5,)
    assert ev.values is not None and ev.values.shape == (5,)
    assert policy.value(obs).shape == (5,)
    if action_space is DISCRETE:
        assert out.actions.dtype == torch.int64
        assert ((out.actions >= 0) & (out.actions < 4)).all()


@pytest.mark.parametrize("action_space", [BOX, BOX_2D, DISCRETE], ids=["box", "box-2d", "discrete"])
def test_evaluate_matches_act(action_space: gym.spaces.Space) -> None:
    policy = make(action_space, init_log_std=-0.7)
    obs = states(16)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs)
    torch.testing.assert_close(ev.values, out.values)
    torch.testing.assert_close(policy.value(obs), out.values)


def test_gaussian_logprob_and_entropy_by_hand() -> None:
    policy = make(BOX, init_log_std=-0.5)
    obs = states(4)
    actions = torch.zeros(4, 3)
    with torch.no_grad():
        mean = policy.actor(obs["state"])
        ev = policy.evaluate(obs, actions)
    std = np.exp(-0.5)
    expected = (-((0.0 - mean.numpy()) ** 2) / (2 * std**2) - np.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)
    np.testing.assert_allclose(ev.logprobs.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(ev.entropy.numpy(), 3 * (0.5 + 0.5 * np.log(2 * np.pi) + np.log(std)), rtol=1e-5)


def test_deterministic_is_the_mode() -> None:
    continuous, discrete = make(BOX), make(DISCRETE)
    obs = states(8)
    with torch.no_grad():
        torch.testing.assert_close(continuous.act(obs, deterministic=True).actions, continuous.actor(obs["state"]))
        modes = discrete.actor(obs["state"]).argmax(-1)
        torch.testing.assert_close(discrete.act(obs, deterministic=True).actions, modes)
        # Deterministic twice gives the same action; sampling with a large std does not.
        wide = make(BOX, init_log_std=1.0)
        torch.testing.assert_close(wide.act(obs, deterministic=True).actions, wide.act(obs, deterministic=True).actions)
        assert not torch.allclose(wide.act(obs).actions, wide.act(obs, deterministic=True).actions)


def test_initialization_follows_ppo_defaults() -> None:
    policy = make(BOX, init_log_std=-0.3, hidden_sizes=[32, 16])
    layers = [m for m in policy.actor if isinstance(m, torch.nn.Linear)]
    assert [l.out_features for l in layers] == [32, 16, 3]
    assert all((l.bias == 0).all() for l in layers)
    # Orthogonal rows scaled by the gain: W W^T = gain^2 I for a wide-to-narrow layer.
    w = layers[-1].weight.detach()
    torch.testing.assert_close(w @ w.T, 0.01**2 * torch.eye(3), atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(policy.log_std.detach(), torch.full((3,), -0.3))


def test_running_norm_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=3.0, scale=2.0, size=(n, 4)).astype(np.float32) for n in (7, 50, 13, 1)]
    norm = RunningNorm(4)
    for batch in batches:
        norm.update(torch.from_numpy(batch))
    seen = np.concatenate(batches).astype(np.float64)
    # The prior count (1e-4) pulls the statistics by ~1e-4 / 71 relative: far below the tolerance.
    np.testing.assert_allclose(norm.mean.numpy(), seen.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(norm.var.numpy(), seen.var(0), rtol=1e-4, atol=1e-4)
    assert norm.count.item() == pytest.approx(len(seen), abs=1e-3)
    x = torch.from_numpy(batches[0])
    expected = (batches[0] - seen.mean(0)) / np.sqrt(seen.var(0) + 1e-8)
    np.testing.assert_allclose(norm(x).numpy(), expected, rtol=1e-3, atol=1e-3)


def test_running_norm_clips() -> None:
    norm = RunningNorm(2, clip=5.0)
    norm.update(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    out = norm(torch.tensor([[1e6, -1e6]]))
    torch.testing.assert_close(out, torch.tensor([[5.0, -5.0]]))


def test_policy_normalizer_is_used_and_saved() -> None:
    policy = make(BOX, normalize_obs=True)
    obs = {"state": torch.randn(64, 6) * 5 + 10}
    before = policy.value(obs)
    policy.update_normalizer(obs)
    assert not torch.allclose(policy.value(obs), before)
    assert {"normalizer.mean", "normalizer.var", "normalizer.count"} <= set(policy.state_dict())
    without = make(BOX)
    without.update_normalizer(obs)  # a no-op, not an error
    assert without.normalizer is None


def test_gradients_reach_every_parameter() -> None:
    policy = make(BOX)
    obs = states(8)
    assert_gradients_reach_every_parameter(policy, obs, torch.randn(8, 3))


def test_clear_errors() -> None:
    pixels = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})
    with pytest.raises(UserError, match=r"needs a 'state' observation.*\['rgb'\].*policy.name=cnn"):
        make(BOX, space=pixels)
    with pytest.raises(UserError, match="Discrete and Box"):
        make(gym.spaces.MultiBinary(3))
    with pytest.raises(UserError, match="policy.activation='swish'"):
        mlp(3, [4], 2, "swish", out_gain=1.0)
    with pytest.raises(UserError, match="Unknown policy 'mlpp'"):
        build_policy(PolicyConfig(name="mlpp"), STATE, BOX)


@pytest.mark.parametrize(
    "action_space,chunk_shape",
    [(BOX, (5, 4, 3)), (BOX_2D, (5, 4, 2, 3)), (DISCRETE, (5, 4))],
    ids=["box", "box-2d", "discrete"],
)
def test_action_chunks(action_space: gym.spaces.Space, chunk_shape: tuple[int, ...]) -> None:
    """policy.action_chunk=4: four actions per observation, logprob/entropy summed over them,
    and evaluate agrees with act."""
    policy = make(action_space, action_chunk=4, init_log_std=-0.5)
    assert policy.action_chunk == 4
    obs = states(5)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    assert out.actions.shape == chunk_shape and out.logprobs.shape == (5,)
    torch.testing.assert_close(ev.logprobs, out.logprobs)
    # The chunk's logprob is the sum of its steps' logprobs under the per-step distributions, built
    # here from the actor head on the raw state (the MLP's input without normalize_obs).
    with torch.no_grad():
        head = policy.actor(obs["state"])  # (5, 4 * act_dim)
    if action_space is DISCRETE:
        dist = torch.distributions.Categorical(logits=head.reshape(5, 4, int(DISCRETE.n)))  # batch (5, 4): one per step
        per_step = dist.log_prob(out.actions)  # (5, 4)
    else:
        dist = torch.distributions.Normal(head, policy.log_std.detach().exp())
        per_step = dist.log_prob(out.actions.reshape(5, -1))  # (5, 4 * act_dim)
    entropy = dist.entropy().sum(-1)
    torch.testing.assert_close(out.logprobs, per_step.sum(-1))
    torch.testing.assert_close(ev.entropy, entropy)
    with torch.no_grad():
        mode = policy.act(obs, deterministic=True).actions
    assert mode.shape == chunk_shape


def test_action_chunk_errors() -> None:
    with pytest.raises(UserError, match="policy.action_chunk=0 must be a positive integer"):
        make(BOX, action_chunk=0)


def test_a_policy_without_chunks_is_refused_a_chunk() -> None:
    """A registered policy that ignores policy.action_chunk is caught at build time."""
    from policies.base import Policy
    from policies.registry import POLICIES

    class OneStep(Policy):
        def act(self, obs, deterministic=False):
            raise NotImplementedError

        def evaluate(self, obs, actions):
            raise NotImplementedError

    POLICIES.register("one_step_test", doc="test policy")(lambda cfg, obs_space, act_space: OneStep())
    try:
        with pytest.raises(UserError, match="does not support action chunks"):
            build_policy(PolicyConfig(name="one_step_test", action_chunk=3), STATE, BOX)
        assert isinstance(build_policy(PolicyConfig(name="one_step_test"), STATE, BOX), OneStep)
    finally:
        POLICIES.remove("one_step_test")
    assert "one_step_test" not in POLICIES
