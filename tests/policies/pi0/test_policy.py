"""π0 / π0.5 under the Policy contract: the denoising chain, its log-probabilities (Flow-SDE,
Flow-Noise), act/evaluate agreement, the critics, SFT and the options."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from embodied.errors import UserError  # noqa: E402
from embodied.rl.flow import flow_timesteps  # noqa: E402
from policies.config import PolicyConfig  # noqa: E402
from policies.pi0.policy import Pi0Policy  # noqa: E402
from policies.pi0.tiny import tiny_pi0, tiny_stats, write_checkpoint  # noqa: E402
from policies.registry import build_policy  # noqa: E402
from tests.policies.contract import assert_gradients_reach_every_parameter  # noqa: E402

OBS_SPACE = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (24, 32, 3), np.uint8),
                             "state": gym.spaces.Box(-1, 1, (3,), np.float32)})
ACTION_SPACE = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
CHUNK = 2


def make(name: str = "pi0", chunk: int = CHUNK, **kwargs: Any) -> Pi0Policy:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy = build_policy(PolicyConfig(name=name, action_chunk=chunk, kwargs={"tiny": {}, **kwargs}), OBS_SPACE, ACTION_SPACE)
    assert isinstance(policy, Pi0Policy)
    return policy


def observations(batch: int = 4, seed: int = 1) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"rgb": torch.randint(0, 256, (batch, 24, 32, 3), generator=g, dtype=torch.uint8),
            "state": torch.rand(batch, 3, generator=g) * 2 - 1,
            "instruction": np.array(["pick up the cube", "open the drawer", "push", "stack the blocks"][:batch])}


@pytest.mark.parametrize("name", ["pi0", "pi05"])
@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
def test_act_and_evaluate_agree_on_a_batch(name: str, method: str) -> None:
    policy = make(name, noise_method=method)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    steps, horizon, width = policy.num_steps, policy.config.chunk_size, policy.config.max_action_dim
    assert out.actions.shape == (4, steps + 1, horizon, width)  # the chain x_0 ... x_N
    assert out.env_actions.shape == (4, CHUNK, 2) and out.logprobs.shape == (4, CHUNK * 2) and out.mask.all()
    assert torch.allclose(out.logprobs, ev.logprobs, atol=1e-5)
    assert torch.allclose(out.values, ev.values, atol=1e-5)
    assert ev.entropy.shape == ev.logprobs.shape and torch.isfinite(ev.entropy).all()
    # the executed actions are the chain's last state unnormalized (mean/std or quantiles of [-2, 2])
    assert torch.allclose(out.env_actions, policy.action_norm.unnormalize(out.actions[:, -1, :CHUNK, :2]))
    shifted = out.actions.clone()
    shifted[:, 1] += 0.3
    with torch.no_grad():
        assert not torch.allclose(policy.evaluate(obs, shifted).logprobs, out.logprobs, atol=1e-3)


def test_zero_noise_chain_is_the_ode_euler_integration() -> None:
    """At noise_level 0 every Flow-SDE step is the Euler step: the sampled chain, and the
    deterministic one, are x <- x - dt * v(x, t) from their own x_0."""
    policy = make("pi0", noise_level=0.0)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        deterministic = policy.act(obs, deterministic=True)
        assert torch.allclose(out.actions[:, 1:], _euler_from(policy, obs, out.actions[:, 0]), atol=1e-5)
        assert torch.allclose(deterministic.actions[:, 1:], _euler_from(policy, obs, deterministic.actions[:, 0]), atol=1e-5)
    assert (out.logprobs == 0).all()  # std 0: deterministic steps carry no density


def _velocity(policy: Pi0Policy, obs: dict[str, Any], x: torch.Tensor, t: float) -> torch.Tensor:
    """v(x, t) (B, H, D) through the model's public passes, the inputs built as openpi does."""
    model = policy.model
    images = torch.stack([_images(policy, obs)], 1)
    from policies.pi0.inputs import prompt_texts, tokenize

    state = policy.state_norm.normalize(torch.as_tensor(obs["state"]).float())
    padded = torch.nn.functional.pad(state, (0, policy.config.max_state_dim - 3))
    texts = prompt_texts(list(obs["instruction"]), state, policy.config.pi05)
    tokens, mask = tokenize(policy.tokenizer, texts, policy.config.tokenizer_max_length)
    cache = model.encode_prefix(images, torch.ones(x.shape[0], 1, dtype=torch.bool), tokens, mask)
    return model.velocity(model.expert_features(cache, padded, x, torch.full((x.shape[0],), t)))


def _images(policy: Pi0Policy, obs: dict[str, Any]) -> torch.Tensor:
    from policies.pi0.inputs import images_to_model

    return images_to_model(torch.as_tensor(obs["rgb"]), policy.config.vision.image_size)


def _euler_from(policy: Pi0Policy, obs: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
    grid = flow_timesteps(policy.num_steps)
    states = []
    for step in range(policy.num_steps):
        x = x - (grid[step] - grid[step + 1]) * _velocity(policy, obs, x, float(grid[step]))
        states.append(x)
    return torch.stack(states, 1)


def test_one_step_flow_sde_log_prob_by_hand() -> None:
    """N = 1, noise_level a = 0.5: t = 1 -> 0, sigma = a, mean = x0_hat + x1_hat * (0 - a^2 / 2)
    = (x - v) - a^2 / 2 * x, std = a; the chain's log-prob per executed entry is log N(x_1; mean, a^2)."""
    policy = make("pi0", num_steps=1, noise_level=0.5)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        x0, x1 = out.actions[:, 0], out.actions[:, 1]
        v = _velocity(policy, obs, x0, 1.0)
    mean = (x0 - v) - 0.125 * x0
    per_entry = -math.log(0.5) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x1 - mean) / 0.5) ** 2
    want = per_entry[:, :CHUNK, :2].reshape(4, -1)
    assert torch.allclose(out.logprobs, want, atol=1e-5)


def test_action_level_sums_the_token_level() -> None:
    token, action = make("pi05", logprob_level="token"), make("pi05", logprob_level="action")
    obs = observations()
    with torch.no_grad():
        out = token.act(obs)
        assert torch.allclose(action.evaluate(obs, out.actions).logprobs, token.evaluate(obs, out.actions).logprobs.sum(-1), atol=1e-5)
    assert action.act(obs).mask is None


def test_gradients_reach_every_parameter_with_the_vlm_critic() -> None:
    assert_gradients_reach_every_parameter(make("pi05", value_after_vlm=1), observations(batch=2))


def test_gradients_reach_every_trainable_parameter_with_the_expert_critic() -> None:
    """Flow-Noise, critic on the expert: everything trains but the prefix's last-layer queries,
    output projection, MLP and final norm, which no output reads (they stay frozen)."""
    policy = make("pi0", noise_method="flow_noise", value_after_vlm=0)
    unused = {"model." + name for name in policy.unused_prefix_parameters()}
    assert len(unused) == 7  # q_proj, o_proj, post_attention_layernorm, gate/up/down_proj, norm
    obs = observations(batch=2)
    with torch.no_grad():
        actions = policy.act(obs).actions
    ev = policy.evaluate(obs, actions)
    (-ev.logprobs.mean() - 0.01 * ev.entropy.mean() + ev.values.pow(2).mean()).backward()
    for name, param in policy.named_parameters():
        if name in unused:
            assert not param.requires_grad and param.grad is None, name
        else:
            assert param.grad is not None and torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name


def test_critics_on_the_prefix_and_on_the_expert() -> None:
    obs = observations()
    for mode in ("mean_token", "first_token", "last_token"):
        vlm = make("pi05", value_after_vlm=1, value_vlm_mode=mode)
        with torch.no_grad():
            assert torch.allclose(vlm.value(obs), vlm.act(obs).values, atol=1e-5)
    expert = make("pi0", value_after_vlm=0)
    assert expert.value_head.net[0].in_features == expert.config.expert.width
    grpo = make("pi0", add_value_head=0)
    assert grpo.act(obs).values is None and not grpo.has_critic


def test_train_expert_only_freezes_the_vlm() -> None:
    policy = make("pi0", train_expert_only=1)
    trainable = policy.trainable_state_dict()
    assert trainable and not any(k.startswith("model.paligemma.") for k in trainable)
    assert any(k.startswith("model.gemma_expert.") for k in trainable) and "value_head.net.0.weight" in trainable


def test_lora_starts_as_the_base_model_and_trains_only_adapters_and_small_modules() -> None:
    base, lora = make("pi0"), make("pi0", lora_rank=4)
    obs = observations()
    with torch.no_grad():
        chain = base.act(obs).actions
        assert torch.allclose(lora.evaluate(obs, chain).logprobs, base.evaluate(obs, chain).logprobs, atol=1e-5)  # B = 0
        out = lora.act(obs)
        assert torch.allclose(out.logprobs, lora.evaluate(obs, out.actions).logprobs, atol=1e-5)
    trainable = set(lora.trainable_state_dict())
    adapters = {n for n in trainable if "lora_" in n}
    assert adapters and any("gemma_expert" in n for n in adapters) and any("language_model" in n for n in adapters)
    others = trainable - adapters
    assert "model.action_out_proj.weight" in others and "value_head.net.0.weight" in others
    assert not any(n.startswith(("model.paligemma.language_model.", "model.gemma_expert.", "model.paligemma.vision_tower."))
                   for n in others)


def test_real_size_layout_has_the_published_parameter_counts() -> None:
    """π0 / π0.5 at their released sizes (on the meta device: no memory): SigLIP So400m (412M
    without its pooling head), Gemma 2B (2.51B with its 257k-token embedding), a 311M expert (428M
    with π0.5's adaRMS ``dense``), 3.24B / 3.35B in all."""
    from policies.pi0.config import Pi0Config
    from policies.pi0.model import Pi0Model

    for pi05, total in ((False, 3_238_048_528), (True, 3_353_433_872)):
        with torch.device("meta"):
            model = Pi0Model(Pi0Config(pi05=pi05))
        count = lambda prefix: sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefix))  # noqa: E731
        assert count("paligemma.vision_tower.") == 412_442_352
        assert count("paligemma.language_model.") == 2_508_531_712
        assert count("") == total


def test_bfloat16_keeps_the_rotary_frequencies_in_float32() -> None:
    policy = make("pi05", dtype="bfloat16")
    model = policy.model
    assert model.action_in_proj.weight.dtype == torch.bfloat16
    assert model.paligemma.language_model.rotary_emb.inv_freq.dtype == torch.float32
    with torch.no_grad():
        out = policy.act(observations())
        ev = policy.evaluate(observations(), out.actions)
    assert out.actions.dtype == torch.float32 and torch.isfinite(ev.logprobs).all()
    assert torch.allclose(out.logprobs, ev.logprobs, atol=0.5)  # bfloat16: batched and stepwise passes round differently


def test_sft_loss_is_flow_matching_and_trains() -> None:
    policy = make("pi0")
    obs = observations(batch=2)
    actions = torch.rand(2, CHUNK, 2) * 4 - 2
    loss = policy.sft_loss(obs, actions)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert policy.model.action_out_proj.weight.grad.abs().sum() > 0


def test_a_checkpoint_dir_builds_the_policy(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = tiny_pi0(True, {}, [-2.0, -2.0], [2.0, 2.0], 3)
    path = write_checkpoint(tmp_path / "pi05", source.model, tiny_stats(True, [-2.0, -2.0], [2.0, 2.0], 3))
    policy = build_policy(PolicyConfig(name="pi05", action_chunk=CHUNK, path=str(path)), OBS_SPACE, ACTION_SPACE)
    with torch.no_grad():
        out = policy.act(observations())
    assert out.env_actions.shape == (4, CHUNK, 2)
    with pytest.raises(UserError, match="policy.name=pi05"):
        build_policy(PolicyConfig(name="pi0", action_chunk=CHUNK, path=str(path)), OBS_SPACE, ACTION_SPACE)


def test_options_are_checked() -> None:
    with pytest.raises(UserError, match="noise_levl.*noise_level"):
        make("pi0", noise_levl=0.3)
    with pytest.raises(UserError, match="flow_sde, flow_noise"):
        make("pi0", noise_method="flow_cps")
    with pytest.raises(UserError, match="exactly one"):
        build_policy(PolicyConfig(name="pi0", kwargs={}), OBS_SPACE, ACTION_SPACE)
    with pytest.raises(UserError, match="do not fit"):
        make("pi0", chunk=5)
    policy = make("pi0")
    with pytest.raises(ValueError, match="denoising chain"):
        policy.evaluate(observations(), torch.zeros(4, CHUNK, 2))
    with pytest.raises(NotImplementedError, match="sft_loss"):
        policy.encode_actions(torch.zeros(4, CHUNK, 2))
