"""The CNN actor-critic: contract shapes, logprob consistency, gradients, and that it sees pixels."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.errors import UserError
from policies.base import Policy
from policies.config import PolicyConfig
from policies.models.cnn import CNNActorCritic, camera_keys
from policies.registry import build_policy
from tests.policies.contract import assert_gradients_reach_every_parameter

BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(5)


def obs_space(
    size: int = 64, state_dim: int | None = None, extra_cameras: dict[str, int] | None = None
) -> gym.spaces.Dict:
    spaces: dict[str, gym.spaces.Space] = {"rgb": gym.spaces.Box(0, 255, (size, size, 3), np.uint8)}
    for name, cam_size in (extra_cameras or {}).items():
        spaces[f"rgb/{name}"] = gym.spaces.Box(0, 255, (cam_size, cam_size, 3), np.uint8)
    if state_dim is not None:
        spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
    return gym.spaces.Dict(spaces)


def sample_obs(space: gym.spaces.Dict, batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    obs = {}
    for key, sub in space.spaces.items():
        if sub.dtype == np.uint8:
            obs[key] = torch.randint(0, 256, (batch, *sub.shape), dtype=torch.uint8, generator=gen)
        else:
            obs[key] = torch.randn((batch, *sub.shape), generator=gen)
    return obs


def make(space: gym.spaces.Dict, action_space: gym.spaces.Space, **cfg) -> Policy:
    torch.manual_seed(0)
    return build_policy(PolicyConfig(name="cnn", **cfg), space, action_space)


@pytest.mark.parametrize("size,flat_dim", [(128, 64 * 12 * 12), (64, 64 * 4 * 4)])
@pytest.mark.parametrize("state_dim", [None, 7])
@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["box", "discrete"])
def test_shapes(size: int, flat_dim: int, state_dim: int | None, action_space: gym.spaces.Space) -> None:
    space = obs_space(size, state_dim)
    policy = make(space, action_space)
    assert isinstance(policy, CNNActorCritic)
    assert policy.encoders["rgb"].flat_dim == flat_dim
    obs = sample_obs(space, batch=3)
    out = policy.act(obs)
    expected_actions = (3, 4) if action_space is BOX else (3,)
    assert out.actions.shape == expected_actions
    assert out.logprobs.shape == (3,) and out.values is not None and out.values.shape == (3,)
    ev = policy.evaluate(obs, out.actions)
    assert ev.logprobs.shape == ev.entropy.shape == (3,)
    assert policy.value(obs).shape == (3,)


def test_numpy_observations_are_accepted() -> None:
    space = obs_space(64, state_dim=3)
    policy = make(space, BOX)
    obs = {k: v.numpy() for k, v in sample_obs(space, batch=2).items()}
    assert policy.act(obs).actions.shape == (2, 4)


def test_several_cameras_are_encoded_and_concatenated() -> None:
    space = obs_space(64, state_dim=5, extra_cameras={"wrist": 128, "base": 64})
    assert camera_keys(space) == ["rgb", "rgb/base", "rgb/wrist"]
    policy = make(space, BOX, kwargs={"feature_dim": 32})
    assert policy.actor[0].in_features == 32 * 4  # three cameras + state
    assert any(k.startswith("encoders.rgb__wrist.") for k in policy.state_dict())
    obs = sample_obs(space, batch=2)
    base = policy.value(obs)
    # Changing only the wrist camera changes the value: that camera is part of the features.
    obs["rgb/wrist"] = 255 - obs["rgb/wrist"]
    assert not torch.allclose(policy.value(obs), base)


@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["box", "discrete"])
def test_evaluate_matches_act_logprobs(action_space: gym.spaces.Space) -> None:
    space = obs_space(64, state_dim=4)
    policy = make(space, action_space, init_log_std=-0.5)
    obs = sample_obs(space, batch=6)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs)
    torch.testing.assert_close(ev.values, out.values)


@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["box", "discrete"])
def test_deterministic_is_the_mode(action_space: gym.spaces.Space) -> None:
    """The deterministic action is repeatable and no other action is more likely."""
    space = obs_space(64)
    policy = make(space, action_space, init_log_std=-0.5)
    obs = sample_obs(space, batch=4)
    with torch.no_grad():
        a1, a2 = policy.act(obs, deterministic=True).actions, policy.act(obs, deterministic=True).actions
        best = policy.evaluate(obs, a1).logprobs  # (4,)
        if action_space is DISCRETE:
            others = [torch.full_like(a1, k) for k in range(DISCRETE.n)]
        else:  # a Gaussian's density falls off its mean along every axis, both ways
            others = [a1 + sign * 0.05 * torch.eye(4)[j] for j in range(4) for sign in (-1.0, 1.0)]
        rivals = torch.stack([policy.evaluate(obs, other).logprobs for other in others])  # (n, 4)
    torch.testing.assert_close(a1, a2)
    assert (best >= rivals.max(0).values - 1e-6).all()
    if action_space is BOX:
        assert (best > rivals.max(0).values).all()  # strictly: the mean is the unique mode


@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["box", "discrete"])
def test_gradients_reach_every_parameter(action_space: gym.spaces.Space) -> None:
    space = obs_space(64, state_dim=4)
    policy = make(space, action_space, normalize_obs=True)
    obs = sample_obs(space, batch=8)
    policy.update_normalizer(obs)
    assert_gradients_reach_every_parameter(policy, obs)


def test_critic_learns_image_brightness() -> None:
    """The critic fits a target that only the pixels carry; fails if the encoder ignores them."""
    space = obs_space(64)
    policy = make(space, DISCRETE, hidden_sizes=[64])
    gen = torch.Generator().manual_seed(1)
    brightness = torch.rand(32, generator=gen)  # (B,)
    noise = torch.randint(-20, 21, (32, 64, 64, 3), generator=gen)
    frames = (brightness.view(-1, 1, 1, 1) * 200 + 28 + noise).clamp(0, 255).to(torch.uint8)  # (B, H, W, 3)
    target = 2.0 * brightness - 1.0
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    first = None
    for _ in range(40):
        loss = (policy.value({"rgb": frames}) - target).pow(2).mean()
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # A constant prediction cannot beat the target variance (1/3); the encoder must read brightness.
    final = (policy.value({"rgb": frames}) - target).pow(2).mean().item()
    assert final < 0.1 * target.var().item(), (first, final)


def test_normalizer_updates_only_with_state() -> None:
    space = obs_space(64, state_dim=3)
    policy = make(space, BOX, normalize_obs=True)
    obs = sample_obs(space, batch=16)
    policy.update_normalizer(obs)
    assert policy.normalizer is not None
    torch.testing.assert_close(policy.normalizer.mean, obs["state"].mean(0), atol=1e-4, rtol=1e-4)
    no_state = make(obs_space(64), BOX, normalize_obs=True)
    no_state.update_normalizer(sample_obs(obs_space(64), batch=2))  # a no-op, not an error


def test_clear_errors() -> None:
    state_only = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (3,), np.float32)})
    with pytest.raises(UserError, match="obs_mode=rgb"):
        make(state_only, BOX)
    with pytest.raises(UserError, match="at least 36x36"):
        make(obs_space(32), BOX)
    with pytest.raises(UserError, match="allowed: feature_dim, channels"):
        make(obs_space(64), BOX, kwargs={"width": 3})
    with pytest.raises(UserError, match="channels"):
        make(obs_space(64), BOX, kwargs={"channels": [8, 8]})
    with pytest.raises(UserError, match="Discrete and Box"):
        make(obs_space(64), gym.spaces.MultiBinary(3))


def test_kwargs_set_widths() -> None:
    policy = make(obs_space(64), BOX, kwargs={"feature_dim": 48, "channels": [8, 16, 16]})
    encoder = policy.encoders["rgb"]
    assert encoder.flat_dim == 16 * 4 * 4
    assert encoder.project[0].out_features == 48
