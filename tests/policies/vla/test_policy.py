"""``openvla`` and ``openvla_oft`` under the Policy contract, on tiny models of the real architecture.

act/evaluate agreement on left-padded batches of mixed prompts, the processed (temperature,
top-k) distribution, bidirectional parallel decoding, heads, LoRA, what trains, and clear errors.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
from embodied.errors import UserError  # noqa: E402
from policies.base import INSTRUCTION_KEY, Policy  # noqa: E402
from policies.config import PolicyConfig  # noqa: E402
from policies.registry import POLICIES, build_policy  # noqa: E402
from policies.vla.sampling import Sampler  # noqa: E402
from policies.vla.tiny import write_tiny_checkpoint  # noqa: E402
from tests.policies.contract import assert_gradients_reach_every_parameter  # noqa: E402

LOW = np.array([-1.0, -2.0, 0.0, -0.5], np.float32)
HIGH = np.array([1.0, 2.0, 1.0, 0.5], np.float32)
ACTIONS = gym.spaces.Box(LOW, HIGH)
SPACE = gym.spaces.Dict({
    "rgb": gym.spaces.Box(0, 255, (40, 40, 3), np.uint8),  # resized to the tiny model's 32 x 32
    "rgb/wrist": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
    "state": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32),
})
INSTRUCTIONS = ["pick up the red cube", "open the drawer", "put the bowl on the plate and close the microwave door"]
NAMES = ["openvla", "openvla_oft"]
TEXT_VOCAB = 512  # the tiny models' V: action tokens are 256 .. 511


def make(name: str, chunk: int = 2, space: gym.spaces.Dict = SPACE, actions: gym.spaces.Space = ACTIONS, **kwargs) -> Policy:
    torch.manual_seed(0)
    kwargs.setdefault("tiny", {})
    return build_policy(PolicyConfig(name=name, action_chunk=chunk, kwargs=kwargs), space, actions)


def proprio(name: str) -> dict:
    """OFT models get a proprio projector (the state token); OpenVLA has none."""
    return {"tiny_proprio": 1} if name == "openvla_oft" else {}


def observations(batch: int = 3, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (batch, 40, 40, 3), dtype=torch.uint8, generator=gen),
        "rgb/wrist": torch.randint(0, 256, (batch, 32, 32, 3), dtype=torch.uint8, generator=gen),
        "state": torch.randn(batch, 5, generator=gen),
        INSTRUCTION_KEY: np.array([INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch)]),
    }


def select(obs: dict, rows: slice) -> dict:
    return {k: v[rows] for k, v in obs.items()}


class CallCounter:
    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        module.register_forward_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.calls += 1


def test_both_policies_are_registered() -> None:
    import policies.models  # noqa: F401  (registers the built-in policies)

    assert "openvla" in POLICIES and "openvla_oft" in POLICIES
    assert "KV cache" in POLICIES.doc("openvla") and "bidirectional" in POLICIES.doc("openvla_oft")


# -- acting and scoring agree ----------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [0, 50])
@pytest.mark.parametrize("temperature", [1.0, 1.6])
@pytest.mark.parametrize("name", NAMES)
def test_act_and_evaluate_agree_on_a_padded_batch(name: str, temperature: float, top_k: int) -> None:
    policy = make(name, temperature=temperature, top_k=top_k, **proprio(name))
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    assert out.actions.shape == (3, 2, 4) and out.actions.dtype == torch.long
    assert ((out.actions >= TEXT_VOCAB - 256) & (out.actions < TEXT_VOCAB)).all()
    assert out.env_actions.shape == (3, 2, 4) and out.env_actions.dtype == torch.float32
    assert out.logprobs.shape == out.mask.shape == (3, 8) and out.mask.all()
    assert ev.logprobs.shape == ev.entropy.shape == (3, 8)
    assert (out.logprobs <= 0).all()
    torch.testing.assert_close(ev.logprobs, out.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(ev.values, out.values, atol=1e-5, rtol=0)
    if top_k:  # entropies of a top-50 distribution are at most log 50
        assert (ev.entropy <= np.log(top_k) + 1e-4).all()


@pytest.mark.parametrize("name", NAMES)
def test_a_padded_batch_computes_what_each_sample_computes_alone(name: str) -> None:
    policy = make(name)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs, deterministic=True)
        batched = policy.evaluate(obs, out.actions)
        for row in range(3):
            alone = policy.evaluate(select(obs, slice(row, row + 1)), out.actions[row : row + 1])
            torch.testing.assert_close(alone.logprobs[0], batched.logprobs[row], atol=1e-5, rtol=0)
            torch.testing.assert_close(alone.values[0], batched.values[row], atol=1e-5, rtol=0)
            greedy = policy.act(select(obs, slice(row, row + 1)), deterministic=True)
            assert torch.equal(greedy.actions[0], out.actions[row])


def test_processed_distribution_by_hand() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0, 3.0])
    log_probs = Sampler(temperature=2.0, top_k=2).log_probs(logits)
    # /2 -> [0.5, 1.5, 1, 0, 1.5]; the two largest (a tie at 1.5) stay: each has probability 1/2
    expected = torch.tensor([float("-inf"), np.log(0.5), float("-inf"), float("-inf"), np.log(0.5)], dtype=torch.float32)
    torch.testing.assert_close(log_probs, expected)
    # a tie at the k-th value keeps every tied entry (as transformers' TopKLogitsWarper does)
    log_probs = Sampler(temperature=1.0, top_k=2).log_probs(torch.tensor([3.0, 2.0, 2.0, 0.0]))
    total = np.exp(3) + 2 * np.exp(2)
    expected = torch.tensor([3 - np.log(total), 2 - np.log(total), 2 - np.log(total), float("-inf")], dtype=torch.float32)
    torch.testing.assert_close(log_probs, expected)
    with pytest.raises(UserError, match="temperature"):
        Sampler(temperature=0.0)


def action_logits(policy: Policy, obs: dict, tokens: torch.Tensor) -> torch.Tensor:
    """The raw action-token logits (B, K, 256) behind ``tokens`` (B, K), through the models' public methods."""
    model = policy.model
    pixels = torch.stack([policy.images(obs[k]) for k in policy.cameras], dim=1)
    prompt = policy.prompts(list(obs[INSTRUCTION_KEY]))
    if policy.oft:
        return model.action_logits(model.parallel(model.prefix(pixels, None), prompt, tokens.shape[1]))
    return model.score(model.embed_images(pixels), prompt, tokens)[0]


@pytest.mark.parametrize("name", NAMES)
def test_sampling_stays_inside_top_k_and_deterministic_is_greedy(name: str) -> None:
    policy = make(name, chunk=1, top_k=3, temperature=5.0)
    obs = {k: v[:1].repeat(64, *([1] * (v.ndim - 1))) if torch.is_tensor(v) else np.repeat(v[:1], 64) for k, v in observations().items()}
    with torch.no_grad():
        sampled = policy.act(obs).actions.reshape(64, 4)
        logits = action_logits(policy, obs, sampled)  # (64, 4, 256), given each sample's own earlier tokens
        greedy = policy.act(obs, deterministic=True)
        again = policy.act(obs, deterministic=True)
    top3 = logits.topk(3, dim=-1).indices + TEXT_VOCAB - 256
    assert (top3 == sampled[..., None]).any(-1).all()  # every token among the 3 most likely
    assert len(set(sampled[:, 0].tolist())) >= 2  # temperature 5 explores
    assert torch.equal(greedy.actions, again.actions)
    assert (greedy.actions == greedy.actions[:1]).all()  # identical observations, identical greedy actions


@pytest.mark.parametrize("name", NAMES)
def test_greedy_tokens_are_the_teacher_forced_argmax(name: str) -> None:
    policy = make(name)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs, deterministic=True)
        logits = action_logits(policy, obs, out.actions.reshape(3, 8))
    assert torch.equal(logits.argmax(-1) + TEXT_VOCAB - 256, out.actions.reshape(3, 8))


@pytest.mark.parametrize("name,act_calls", [("openvla", 8), ("openvla_oft", 1)])
def test_language_model_passes_per_call(name: str, act_calls: int) -> None:
    policy = make(name)
    counter = CallCounter(policy.model.llm.model)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        assert counter.calls == act_calls  # OpenVLA: prefill + 7 cached steps for K = 8; OFT: one pass
        policy.evaluate(obs, out.actions)
        assert counter.calls == act_calls + 1


def test_oft_attention_is_bidirectional() -> None:
    policy = make("openvla_oft")
    model = policy.model
    obs = observations()
    with torch.no_grad():
        prefix = model.prefix(torch.stack([policy.images(obs[k]) for k in policy.cameras], dim=1), None)
        prompt = policy.prompts(list(obs[INSTRUCTION_KEY]))
        placeholders = torch.zeros(3, 8, model.hidden_size)
        changed = placeholders.clone()
        changed[:, -1] = 1.0  # the last placeholder
        first = lambda p, bidirectional: model.action_logits(model.parallel(prefix, prompt, 8, p, bidirectional)[:, 0])  # noqa: E731
        assert (first(placeholders, True) - first(changed, True)).abs().max() > 1e-3
        torch.testing.assert_close(first(placeholders, False), first(changed, False), rtol=0, atol=0)  # causal: no effect
        torch.testing.assert_close(first(placeholders, True), first(None, True))  # default placeholders are zeros


# -- outputs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_env_actions_are_unnormalized_bin_centers_by_hand(name: str) -> None:
    policy = make(name, chunk=1)
    with torch.no_grad():
        out = policy.act(observations())
    assert out.actions.shape == (3, 1, 4) and out.env_actions.shape == (3, 4)
    index = np.clip(TEXT_VOCAB - out.actions[:, 0].numpy() - 1, 0, 254)
    center = -1 + (2 * index + 1) / 255  # (bins[i] + bins[i + 1]) / 2 with bins = linspace(-1, 1, 256)
    eps = 1e-8 if name == "openvla_oft" else 0.0  # the tiny model's statistics: q01 = low, q99 = high
    expected = 0.5 * (center + 1) * (HIGH - LOW + eps) + LOW
    np.testing.assert_allclose(out.env_actions.numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_action_level_logprobs_sum_the_tokens(name: str) -> None:
    token_level, action_level = make(name), make(name, logprob_level="action")
    obs = observations()
    with torch.no_grad():
        torch.manual_seed(3)
        a = token_level.act(obs)
        torch.manual_seed(3)
        b = action_level.act(obs)
        ev = action_level.evaluate(obs, b.actions)
    assert torch.equal(a.actions, b.actions) and b.mask is None and b.logprobs.shape == (3,)
    torch.testing.assert_close(b.logprobs, a.logprobs.sum(-1))
    torch.testing.assert_close(ev.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert ev.entropy.shape == (3,)


@pytest.mark.parametrize("name", NAMES)
def test_value_head_reads_the_last_prompt_token(name: str) -> None:
    policy = make(name)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        values = policy.value(obs)
        if name == "openvla":
            prefix = policy.model.embed_images(torch.stack([policy.images(obs[k]) for k in policy.cameras], dim=1))
            hidden = policy.model.prompt_hidden(prefix, policy.prompts(list(obs[INSTRUCTION_KEY])))
            torch.testing.assert_close(policy.value_head(hidden), values)
    torch.testing.assert_close(values, out.values, atol=1e-5, rtol=0)
    assert values.shape == (3,)
    layers = [m for m in policy.value_head.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features, m.bias is not None) for m in layers] == [(64, 512, True), (512, 128, True), (128, 1, False)]


@pytest.mark.parametrize("name", NAMES)
def test_grpo_policies_have_no_critic(name: str) -> None:
    policy = make(name, value_head=0)
    assert not policy.has_critic and policy.value_head is None
    with torch.no_grad():
        out = policy.act(observations())
        assert out.values is None and policy.evaluate(observations(), out.actions).values is None
    with pytest.raises(NotImplementedError):
        policy.value(observations())


def test_inputs_matter_cameras_instruction_and_proprio() -> None:
    policy = make("openvla_oft", tiny_proprio=1)
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs, deterministic=True)
        base = policy.evaluate(obs, out.actions).logprobs
        for key, change in [("rgb/wrist", lambda v: 255 - v), ("state", lambda v: v + 0.5), ("rgb", lambda v: 255 - v)]:
            other = dict(obs, **{key: change(obs[key])})
            assert (policy.evaluate(other, out.actions).logprobs - base).abs().max() > 1e-4, key
        reworded = dict(obs, **{INSTRUCTION_KEY: np.array(["stack the cube"] * 3)})
        assert (policy.evaluate(reworded, out.actions).logprobs - base).abs().max() > 1e-4
        # without an instruction in obs the default instruction is used
        default = {k: v for k, v in obs.items() if k != INSTRUCTION_KEY}
        explicit = dict(obs, **{INSTRUCTION_KEY: np.array(["complete the task"] * 3)})
        torch.testing.assert_close(policy.evaluate(default, out.actions).logprobs, policy.evaluate(explicit, out.actions).logprobs)
        # numpy observations work as tensors do
        as_numpy = {k: (v.numpy() if torch.is_tensor(v) else v) for k, v in obs.items()}
        torch.testing.assert_close(policy.evaluate(as_numpy, out.actions.numpy()).logprobs, base)


def test_oft_l1_eval_head_executes_the_regression_actions() -> None:
    policy = make("openvla_oft", chunk=2, tiny_l1_head=1, eval_head="l1")
    obs = observations()
    head = {k: v.detach() for k, v in policy.model.action_head.state_dict().items()}

    def mlp_resnet(x: torch.Tensor) -> torch.Tensor:  # OFT's L1RegressionActionHead, written out
        ln = torch.nn.functional.layer_norm
        x = ln(x, x.shape[-1:], head["model.layer_norm1.weight"], head["model.layer_norm1.bias"])
        x = torch.relu(x @ head["model.fc1.weight"].T + head["model.fc1.bias"])
        for i in range(2):
            b = f"model.mlp_resnet_blocks.{i}.ffn."
            x = x + torch.relu(ln(x, x.shape[-1:], head[b + "0.weight"], head[b + "0.bias"]) @ head[b + "1.weight"].T + head[b + "1.bias"])
        x = ln(x, x.shape[-1:], head["model.layer_norm2.weight"], head["model.layer_norm2.bias"])
        return x @ head["model.fc2.weight"].T + head["model.fc2.bias"]

    with torch.no_grad():
        out = policy.act(obs, deterministic=True)
        prefix = policy.model.prefix(torch.stack([policy.images(obs[k]) for k in policy.cameras], dim=1), None)
        hidden = policy.model.parallel(prefix, policy.prompts(list(obs[INSTRUCTION_KEY])), 8)  # (B, 8, H)
        normalized = mlp_resnet(hidden.reshape(3, 2, 4 * 64)).double()  # (B, C, A)
        expected = 0.5 * (normalized + 1) * (torch.from_numpy(HIGH - LOW).double() + 1e-8) + torch.from_numpy(LOW).double()
        torch.testing.assert_close(out.env_actions, expected.float(), atol=1e-5, rtol=0)
        sampled = policy.act(obs)  # sampling executes the discrete tokens' centers
        index = (TEXT_VOCAB - sampled.actions - 1).clamp(0, 254).double()
        by_tokens = 0.5 * ((-1 + (2 * index + 1) / 255) + 1) * (torch.from_numpy(HIGH - LOW).double() + 1e-8) + torch.from_numpy(LOW).double()
        torch.testing.assert_close(sampled.env_actions, by_tokens.float(), atol=1e-6, rtol=0)


# -- training ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_full_finetune_gradients_reach_every_parameter(name: str) -> None:
    policy = make(name, **proprio(name))
    assert_gradients_reach_every_parameter(policy, observations())


def test_freeze_vision_keeps_the_towers_out_of_the_graph() -> None:
    policy = make("openvla", freeze_vision=1)
    obs = observations()
    with torch.no_grad():
        actions = policy.act(obs).actions
    ev = policy.evaluate(obs, actions)
    (-ev.logprobs.mean() + ev.values.pow(2).mean()).backward()
    for name, param in policy.named_parameters():
        if name.startswith("model.vision_backbone."):
            assert not param.requires_grad and param.grad is None, name
        else:
            assert param.grad is not None and param.grad.abs().sum() > 0, name


def random_adapters(policy: Policy, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in policy.trainable_state_dict().items()}


@pytest.mark.parametrize("name", NAMES)
def test_lora_trains_adapters_and_value_head_only(name: str) -> None:
    policy = make(name, lora_rank=4, lora_alpha=8, **proprio(name))
    state = policy.trainable_state_dict()
    assert state and all(".lora_A." in k or ".lora_B." in k or k.startswith("value_head.") for k in state)
    assert any(".q_proj.lora_A." in k for k in state) and any(".down_proj.lora_B." in k for k in state)
    assert not any("lm_head" in k for k in state)  # all-linear leaves the output layer alone
    policy.load_trainable_state_dict(random_adapters(policy))  # B != 0, so A gets gradients too
    obs = observations()
    with torch.no_grad():
        actions = policy.act(obs).actions
    ev = policy.evaluate(obs, actions)
    (-ev.logprobs.mean() + ev.values.pow(2).mean()).backward()
    for param_name, param in policy.named_parameters():
        if param_name in state:
            assert param.grad is not None and param.grad.abs().sum() > 0, param_name
        else:
            assert not param.requires_grad and param.grad is None, param_name


@pytest.mark.parametrize("name", NAMES)
def test_lora_merged_and_unmerged_give_the_same_outputs(name: str) -> None:
    policy = make(name, lora_rank=4, lora_alpha=8)
    base = make(name)  # the same tiny weights without adapters
    policy.load_trainable_state_dict(random_adapters(policy))
    obs = observations()
    with torch.no_grad():
        actions = base.act(obs).actions
        adapted = policy.evaluate(obs, actions).logprobs
        assert (adapted - base.evaluate(obs, actions).logprobs).abs().max() > 1e-3  # the adapters matter
        policy.merge_lora()
        merged = policy.evaluate(obs, actions).logprobs
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)
    assert not any("lora_" in k for k in policy.state_dict())
    assert set(policy.trainable_state_dict()) == {k for k in policy.state_dict() if k.startswith("value_head.")}


def test_trainable_state_round_trip_and_mismatch() -> None:
    trainer, rollout = make("openvla", lora_rank=4), make("openvla", lora_rank=4)
    trainer.load_trainable_state_dict(random_adapters(trainer, seed=5))
    rollout.load_trainable_state_dict(trainer.trainable_state_dict())
    obs = observations()
    with torch.no_grad():
        actions = trainer.act(obs, deterministic=True).actions
        torch.testing.assert_close(rollout.evaluate(obs, actions).logprobs, trainer.evaluate(obs, actions).logprobs)
    other = make("openvla", lora_rank=2)
    with pytest.raises(UserError, match="has shape"):
        rollout.load_trainable_state_dict(other.trainable_state_dict())
    with pytest.raises(UserError, match="does not match"):
        make("openvla", lora_rank=4, value_head=0).load_trainable_state_dict(trainer.trainable_state_dict())


def test_gradient_checkpointing_gives_the_same_gradients_and_keeps_the_cache() -> None:
    plain, checkpointed = make("openvla"), make("openvla", gradient_checkpointing=1)
    obs = observations()
    with torch.no_grad():
        actions = plain.act(obs, deterministic=True).actions
    for policy in (plain, checkpointed):
        policy.train()
        ev = policy.evaluate(obs, actions)
        (-ev.logprobs.mean() + ev.values.pow(2).mean()).backward()
        with torch.no_grad():  # act in training mode still decodes with its cache
            assert torch.equal(policy.act(obs, deterministic=True).actions, actions)
    grads = dict(plain.named_parameters())
    for name, param in checkpointed.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-5, rtol=1e-4)


def test_bfloat16_weights() -> None:
    policy = make("openvla_oft", dtype="bfloat16")
    assert policy.model.projector.fc1.weight.dtype == torch.bfloat16
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    assert out.logprobs.dtype == torch.float32
    torch.testing.assert_close(ev.logprobs, out.logprobs, atol=0, rtol=0)  # one parallel pass: identical


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_on_cuda_act_and_evaluate_agree(name: str) -> None:
    policy = make(name, dtype="bfloat16").to("cuda")
    obs = observations(batch=8)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    assert out.actions.device.type == "cuda"
    torch.testing.assert_close(ev.logprobs, out.logprobs, atol=0.05, rtol=0)  # bf16: cached vs full pass rounding


# -- a checkpoint directory -------------------------------------------------------------------------------


def test_policy_from_an_official_layout_directory(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, proprio_dim=5, l1_head=True)  # 7 action dims, gripper not normalized
    actions = gym.spaces.Box(-np.inf, np.inf, (7,), np.float32)
    policy = make("openvla_oft", chunk=2, actions=actions, tiny=None, path=str(path), eval_head="l1")
    assert policy.unnorm_key == "tiny"
    obs = observations()
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs)
    gripper = -1 + (2 * (TEXT_VOCAB - out.actions[..., 6] - 1).clamp(0, 254) + 1) / 255
    torch.testing.assert_close(out.env_actions[..., 6], gripper.float())  # mask False: the bin center itself
    openvla = make("openvla", chunk=1, actions=actions, tiny=None, path=str(path))  # ignores the OFT files
    with torch.no_grad():
        assert openvla.act(obs).env_actions.shape == (3, 7)


# -- errors ---------------------------------------------------------------------------------------------


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="Did you mean 'temperature'"):
        make("openvla", temprature=1.0)
    with pytest.raises(UserError, match="exactly one of policy.kwargs.path"):
        make("openvla", tiny=None)
    with pytest.raises(UserError, match="exactly one of policy.kwargs.path"):
        make("openvla", path="/x")
    with pytest.raises(UserError, match="logprob_level='tokens' must be one of token, action"):
        make("openvla", logprob_level="tokens")
    with pytest.raises(UserError, match="value_head=2 must be 0 or 1"):
        make("openvla", value_head=2)
    with pytest.raises(UserError, match="tiny has unknown keys.*Did you mean 'llm_width'"):
        make("openvla", tiny={"llm_widht": 32})
    with pytest.raises(UserError, match="needs image observations"):
        make("openvla", space=gym.spaces.Dict({"state": SPACE["state"]}))
    with pytest.raises(UserError, match="needs image observations"):
        make("openvla", cameras=["rgb/side"])
    with pytest.raises(UserError, match="continuous action vectors"):
        make("openvla", actions=gym.spaces.Discrete(3))
    with pytest.raises(UserError, match="eval_head=l1 needs"):
        make("openvla_oft", eval_head="l1")
    with pytest.raises(UserError, match="tiny_l1_head"):
        make("openvla", tiny_l1_head=1)  # an OFT-only kwarg
    path = write_tiny_checkpoint(tmp_path, proprio_dim=5)
    with pytest.raises(UserError, match="7 dimensions, the env's 4"):
        make("openvla", tiny=None, path=str(path))
    seven = gym.spaces.Box(-1, 1, (7,), np.float32)
    with pytest.raises(UserError, match="Did you mean 'tiny'"):
        make("openvla", tiny=None, path=str(path), actions=seven, unnorm_key="tiny2")
    no_state = gym.spaces.Dict({"rgb": SPACE["rgb"]})
    with pytest.raises(UserError, match="proprio projector reads a state of 5"):
        make("openvla_oft", tiny=None, path=str(path), actions=seven, space=no_state)
    with pytest.raises(UserError, match="does not exist"):
        make("openvla", tiny=None, path=str(tmp_path / "missing"))
