"""The token (VLA-shaped) policy: tokenizer numbers, contract shapes, act/evaluate agreement, the
A-passes-versus-one cost structure, gradients, and that it learns a target action from pixels."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.errors import UserError
from policies.base import Policy
from policies.config import PolicyConfig
from policies.models.token_policy import ActionTokenizer, TokenActionPolicy
from policies.registry import build_policy
from tests.policies.contract import assert_gradients_reach_every_parameter

BOX = gym.spaces.Box(np.array([-1.0, -1.0, 0.0, -2.0], np.float32), np.array([1.0, 1.0, 1.0, 2.0], np.float32))
#: a small model: tests run on 2 shared cores.
SMALL = {"d_model": 32, "n_heads": 2, "ffn": 64, "n_layers": 2, "patch_size": 8}


def obs_space(kind: str, size: int = 32, extra_cameras: dict[str, int] | None = None) -> gym.spaces.Dict:
    spaces: dict[str, gym.spaces.Space] = {}
    if "rgb" in kind:
        spaces["rgb"] = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
    for name, cam_size in (extra_cameras or {}).items():
        spaces[f"rgb/{name}"] = gym.spaces.Box(0, 255, (cam_size, cam_size, 3), np.uint8)
    if "state" in kind:
        spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
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


def make(space: gym.spaces.Dict, action_space: gym.spaces.Space = BOX, **kwargs) -> Policy:
    torch.manual_seed(0)
    normalize = kwargs.pop("normalize_obs", False)
    chunk = kwargs.pop("action_chunk", 1)
    return build_policy(
        PolicyConfig(name="token_transformer", normalize_obs=normalize, action_chunk=chunk, kwargs={**SMALL, **kwargs}),
        space, action_space,
    )


class CallCounter:
    """Counts forward calls of a module through a forward hook."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.calls += 1


# -- the tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_hand_computed_bins() -> None:
    # Bin width 0.5 on both dims: dim 0 bins [-1, -0.5), ..., dim 1 bins [0, 0.5), ...
    tokenizer = ActionTokenizer(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), num_bins=4)
    actions = torch.tensor([[-1.0, 0.0], [-0.3, 1.2], [0.99, 1.99], [1.0, 2.0]])
    assert tokenizer.encode(actions).tolist() == [[0, 0], [1, 2], [3, 3], [3, 3]]
    centers = tokenizer.decode(torch.tensor([[0, 0], [1, 2], [3, 3]]))
    torch.testing.assert_close(centers, torch.tensor([[-0.75, 0.25], [-0.25, 1.25], [0.75, 1.75]]))


def test_tokenizer_clips_out_of_range_actions() -> None:
    tokenizer = ActionTokenizer(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), num_bins=4)
    tokens = tokenizer.encode(torch.tensor([[-5.0, 7.0], [1e6, -1e6]]))
    assert tokens.tolist() == [[0, 3], [3, 0]]


def test_tokenizer_round_trip() -> None:
    tokenizer = ActionTokenizer(BOX.low, BOX.high, num_bins=256)
    every_token = torch.arange(256).unsqueeze(-1).expand(256, 4)  # (256, A)
    assert torch.equal(tokenizer.encode(tokenizer.decode(every_token)), every_token)
    actions = torch.rand(1000, 4) * (tokenizer.high - tokenizer.low) + tokenizer.low
    error = (tokenizer.decode(tokenizer.encode(actions)) - actions).abs()
    assert (error <= tokenizer.bin_width / 2 + 1e-6).all()
    # Chunks (B, C, A) tokenize per dimension as well.
    assert tokenizer.encode(actions.reshape(10, 100, 4)).shape == (10, 100, 4)


def test_tokenizer_needs_finite_bounds() -> None:
    with pytest.raises(UserError, match="finite bounds"):
        ActionTokenizer(np.array([-np.inf]), np.array([1.0]))
    with pytest.raises(UserError, match="num_bins"):
        ActionTokenizer(np.array([0.0]), np.array([1.0]), num_bins=1)


# -- the policy contract ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("kind,obs_tokens", [("state", 4), ("rgb", 16), ("rgb+state", 17)])
def test_shapes(kind: str, obs_tokens: int, chunk: int) -> None:
    space = obs_space(kind)
    policy = make(space, action_chunk=chunk)
    assert isinstance(policy, TokenActionPolicy)
    assert policy.action_chunk == chunk and policy.num_obs_tokens == obs_tokens
    obs = sample_obs(space, batch=3)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    assert out.actions.shape == ((3, 4) if chunk == 1 else (3, chunk, 4))
    assert out.logprobs.shape == (3,) and out.values is not None and out.values.shape == (3,)
    assert ev.logprobs.shape == ev.entropy.shape == (3,)
    assert policy.value(obs).shape == (3,)
    # Actions are bin centers inside the bounds.
    tokenizer = policy.tokenizer
    torch.testing.assert_close(tokenizer.decode(tokenizer.encode(out.actions)), out.actions)
    low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
    assert ((out.actions >= low) & (out.actions <= high)).all()


def test_several_cameras_become_tokens() -> None:
    space = obs_space("rgb+state", size=32, extra_cameras={"wrist": 16})
    policy = make(space)
    assert policy.num_obs_tokens == 16 + 4 + 1
    assert any(k.startswith("patch_embeddings.rgb__wrist.") for k in policy.state_dict())
    obs = sample_obs(space, batch=2)
    with torch.no_grad():
        base = policy.value(obs)
        obs["rgb/wrist"] = 255 - obs["rgb/wrist"]
        assert not torch.allclose(policy.value(obs), base)


@pytest.mark.parametrize("chunk", [1, 3])
def test_evaluate_matches_act(chunk: int) -> None:
    space = obs_space("rgb+state")
    policy = make(space, action_chunk=chunk)
    obs = sample_obs(space, batch=6)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
        values = policy.value(obs)
    torch.testing.assert_close(ev.logprobs, out.logprobs)
    torch.testing.assert_close(ev.values, out.values)
    torch.testing.assert_close(values, out.values)
    # Near-uniform at init: the entropy is close to T * log(num_bins).
    tokens = chunk * 4
    assert (ev.entropy > 0.99 * tokens * np.log(256)).all()


def test_sampling_explores_and_deterministic_is_greedy() -> None:
    space = obs_space("rgb")
    policy = make(space)
    obs = sample_obs(space, batch=4)
    with torch.no_grad():
        sampled_1, sampled_2 = policy.act(obs).actions, policy.act(obs).actions
        greedy = policy.act(obs, deterministic=True)
        again = policy.act(obs, deterministic=True)
        tokens = policy.tokenizer.encode(greedy.actions)  # (B, A)
        # Teacher-force the greedy tokens: each must be the argmax given its prefix.
        logits = policy.token_logits(obs, tokens[:, :-1])  # (B, A, num_bins)
    assert not torch.equal(sampled_1, sampled_2)
    assert torch.equal(greedy.actions, again.actions)
    assert torch.equal(logits.argmax(-1), tokens)


def test_token_logits_score_what_act_and_evaluate_score() -> None:
    space = obs_space("rgb+state")
    policy = make(space, action_chunk=2)
    obs = sample_obs(space, batch=3)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
        tokens = policy.tokenizer.encode(out.actions).reshape(3, 8)  # (B, T = 2 steps x 4 dims)
        logits = policy.token_logits(obs, tokens[:, :-1])  # (B, T, num_bins)
        head = policy.token_logits(obs, tokens[:, :3])  # (B, 4, num_bins)
    assert logits.shape == (3, 8, 256)
    torch.testing.assert_close(head, logits[:, :4])  # causal: later tokens leave earlier positions alone
    summed = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)  # (B,)
    torch.testing.assert_close(summed, ev.logprobs)
    torch.testing.assert_close(summed, out.logprobs)
    with pytest.raises(ValueError, match="t < 8 action tokens"):
        policy.token_logits(obs, tokens)


@pytest.mark.parametrize("chunk", [1, 3])
def test_act_runs_one_pass_per_token_and_evaluate_one(chunk: int) -> None:
    space = obs_space("rgb+state")
    policy = make(space, action_chunk=chunk)
    counter = CallCounter(policy.decoder)
    obs = sample_obs(space, batch=2)
    with torch.no_grad():
        out = policy.act(obs)
        assert counter.calls == chunk * 4
        policy.evaluate(obs, out.actions)
        assert counter.calls == chunk * 4 + 1
        policy.value(obs)
        assert counter.calls == chunk * 4 + 2


@pytest.mark.parametrize("kind", ["state", "rgb+state"])
def test_gradients_reach_every_parameter(kind: str) -> None:
    space = obs_space(kind)
    policy = make(space, normalize_obs=True, action_chunk=2)
    obs = sample_obs(space, batch=8)
    policy.update_normalizer(obs)
    assert_gradients_reach_every_parameter(policy, obs)


def test_learns_image_conditioned_target_actions() -> None:
    """Maximizing evaluate()'s logprob of a per-image target makes greedy act() decode it.

    Bright frames want one action, dark frames another: fails if the decoder ignores the pixels,
    or if evaluate's teacher forcing is misaligned with act's decoding order.
    """
    space = obs_space("rgb")
    policy = make(space)
    gen = torch.Generator().manual_seed(1)
    bright = torch.arange(8) % 2 == 0  # (B,)
    noise = torch.randint(-20, 21, (8, 32, 32, 3), generator=gen)
    frames = (torch.where(bright, 200, 50).view(-1, 1, 1, 1) + noise).clamp(0, 255).to(torch.uint8)
    obs = {"rgb": frames}
    targets = policy.tokenizer.decode(
        torch.where(bright.unsqueeze(-1), torch.tensor([10, 200, 128, 3]), torch.tensor([250, 7, 64, 180]))
    )  # (B, A) bin centers
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(120):  # 46-73 steps suffice over 8 seeds; a constant decoder plateaus at loss 4 * log 2
        loss = -policy.evaluate(obs, targets).logprobs.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        actions = policy.act(obs, deterministic=True).actions
    torch.testing.assert_close(actions, targets)


def test_numpy_observations_are_accepted() -> None:
    space = obs_space("rgb+state")
    policy = make(space)
    obs = {k: v.numpy() for k, v in sample_obs(space, batch=2).items()}
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions.numpy())
    torch.testing.assert_close(ev.logprobs, out.logprobs)


def test_clear_errors() -> None:
    with pytest.raises(UserError, match="Box action spaces"):
        make(obs_space("state"), gym.spaces.Discrete(3))
    with pytest.raises(UserError, match="finite bounds"):
        make(obs_space("state"), gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))
    with pytest.raises(UserError, match="allowed: d_model, n_layers"):
        make(obs_space("state"), width=3)
    with pytest.raises(UserError, match="must divide"):
        make(obs_space("state"), d_model=30, n_heads=4)
    with pytest.raises(UserError, match="positive integer"):
        make(obs_space("state"), action_chunk=0)
    with pytest.raises(UserError, match="8x8 patches"):
        make(obs_space("rgb", size=4))
    with pytest.raises(UserError, match="'state' or an image"):
        make(gym.spaces.Dict({"depth": gym.spaces.Box(0, 1, (4,), np.float32)}))


@pytest.mark.parametrize("kind,chunk", [("state", 1), ("rgb+state", 2)])
def test_kv_cache_decodes_the_same_function(kind: str, chunk: int) -> None:
    """kv_cache=1 runs [obs ; BOS] once and then one position per token through the same layers:
    the same greedy actions, the same logprobs and values, the same samples for the same seed,
    and evaluate() (one teacher-forced pass) agrees with it."""
    space = obs_space(kind)
    plain = make(space, action_chunk=chunk)
    cached = make(space, action_chunk=chunk, kv_cache=1)
    cached.load_state_dict(plain.state_dict())  # same parameters: the switch adds none
    assert cached.kv_cache and not plain.kv_cache
    obs = sample_obs(space, batch=5)
    with torch.no_grad():
        a, b = plain.act(obs, deterministic=True), cached.act(obs, deterministic=True)
        torch.testing.assert_close(b.actions, a.actions)
        torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.values, a.values, atol=1e-5, rtol=1e-5)
        torch.manual_seed(3)
        sa = plain.act(obs)
        torch.manual_seed(3)
        sb = cached.act(obs)
        torch.testing.assert_close(sb.actions, sa.actions)
        ev = cached.evaluate(obs, sb.actions)
    torch.testing.assert_close(ev.logprobs, sb.logprobs, atol=1e-5, rtol=1e-5)


def test_kv_cache_is_a_switch() -> None:
    with pytest.raises(UserError, match="kv_cache=2 must be 0 or 1"):
        make(obs_space("state"), kv_cache=2)
