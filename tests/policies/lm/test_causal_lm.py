"""The causal-LM policy: rollout logprobs equal recomputed ones (left padding, temperature, top-k,
top-p) and an independent unpadded reference; EOS masks by position (pad == eos, several EOS ids);
sampling settings do not leak from the checkpoint; prompts, LoRA, checkpointing, kwargs errors."""

from __future__ import annotations

import json

import pytest
import torch

from embodied.errors import UserError
from policies.config import PolicyConfig
from policies.lm.options import CAUSAL_LM_DEFAULTS
from policies.lm.policy import CausalLMPolicy
from policies.lm.tiny import TinyModelConfig, write_tiny_model
from policies.registry import build_policy

PROMPTS = ["1+1=", "123456789+987654=", "7"]  # mixed lengths: the batch is left-padded
EOS_BASE = 256  # <|endoftext|>: EOS and PAD of the base-style tiny tokenizer
IM_END = 258  # <|im_end|>: the chat style's first EOS


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("base"), TinyModelConfig(seed=1))


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("chat"), TinyModelConfig(style="chat", seed=2))


def make(model_dir, **kwargs) -> CausalLMPolicy:
    cfg = PolicyConfig(name="causal_lm", kwargs={"model_path": str(model_dir), "max_new_tokens": 10, **kwargs})
    policy = build_policy(cfg, None, None)
    assert isinstance(policy, CausalLMPolicy)
    return policy


def boost_eos(policy: CausalLMPolicy, token: int, logit: float = 6.0) -> None:
    """Make ``token`` likely (about ``logit`` above a typical logit near 0) after the prompts'
    average final hidden state, so sampled responses end at different lengths. Embeddings are
    tied: the token's output row is its input row."""
    obs = policy.encode_prompts(PROMPTS)
    with torch.no_grad():
        out = policy.model(
            input_ids=obs["prompt_ids"], attention_mask=obs["prompt_mask"].long(), output_hidden_states=True
        )
        direction = out.hidden_states[-1][obs["prompt_mask"]].mean(0)  # (H,)
        policy.model.get_output_embeddings().weight[token] = logit * direction / direction.pow(2).sum()


def reference_logprobs(policy: CausalLMPolicy, prompts, actions, temperature, top_k, top_p=1.0) -> torch.Tensor:
    """Each row alone (no padding, default positions), processing written out by hand: (B, K)."""
    rows = []
    for prompt, response in zip(prompts, actions):
        ids = policy.tokenizer(prompt)["input_ids"]
        sequence = torch.tensor([ids + response.tolist()])
        with torch.no_grad():
            logits = policy.model(input_ids=sequence).logits[0, len(ids) - 1 : -1].double()  # (K, V)
        logits = logits / temperature
        if top_k:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            probs = logits.softmax(-1)
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            mass_before = sorted_probs.cumsum(-1) - sorted_probs
            drop_sorted = mass_before >= top_p  # keep tokens until the kept mass reaches top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        rows.append(logits.log_softmax(-1).gather(-1, response.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows).float()


# -- rollout logprobs == recomputed logprobs -----------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("top_k", [0, 5])
def test_rollout_logprobs_equal_recomputed_and_reference(base_dir, temperature: float, top_k: int) -> None:
    policy = make(base_dir, temperature=temperature, top_k=top_k)
    boost_eos(policy, EOS_BASE, logit=3.0)
    obs = policy.encode_prompts(PROMPTS)
    assert obs["prompt_mask"].sum(1).tolist() == [4, 17, 1]
    torch.manual_seed(0)
    out = policy.act(obs)
    evaluation = policy.evaluate(obs, out.actions)
    assert out.actions.shape == out.logprobs.shape == out.mask.shape == (3, 10) and out.values is None
    torch.testing.assert_close(evaluation.logprobs, out.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(policy.response_mask(out.actions), out.mask)
    reference = reference_logprobs(policy, PROMPTS, out.actions, temperature, top_k) * out.mask
    torch.testing.assert_close(evaluation.logprobs, reference, atol=1e-5, rtol=0)
    assert (out.logprobs[out.mask] < 0).all() and (out.logprobs[~out.mask] == 0).all()
    if top_k:  # every sampled token is among the top k, and the entropy is at most log k
        assert (evaluation.entropy[out.mask] <= torch.log(torch.tensor(float(top_k))) + 1e-5).all()


def test_top_p_logprobs_equal_recomputed_and_reference(base_dir) -> None:
    policy = make(base_dir, top_p=0.5, temperature=1.3)
    obs = policy.encode_prompts(PROMPTS)
    torch.manual_seed(1)
    out = policy.act(obs)
    evaluation = policy.evaluate(obs, out.actions)
    torch.testing.assert_close(evaluation.logprobs, out.logprobs, atol=1e-5, rtol=0)
    reference = reference_logprobs(policy, PROMPTS, out.actions, 1.3, 0, top_p=0.5) * out.mask
    torch.testing.assert_close(evaluation.logprobs, reference, atol=1e-5, rtol=0)


def test_entropy_matches_hand_computed_full_distribution(base_dir) -> None:
    policy = make(base_dir, temperature=0.7)
    obs = policy.encode_prompts(PROMPTS[:1])
    actions = torch.tensor([[52, 53, 54, EOS_BASE, EOS_BASE, EOS_BASE, EOS_BASE, EOS_BASE, EOS_BASE, EOS_BASE]])
    evaluation = policy.evaluate(obs, actions)
    ids = policy.tokenizer(PROMPTS[0])["input_ids"]
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([ids + actions[0].tolist()])).logits[0, len(ids) - 1 : len(ids) + 3]
    probs = (logits.double() / 0.7).softmax(-1)
    expected = -(probs * probs.log()).sum(-1).float()  # (4,): three digits and the EOS
    torch.testing.assert_close(evaluation.entropy[0, :4], expected, atol=1e-5, rtol=0)
    assert (evaluation.entropy[0, 4:] == 0).all()


# -- EOS masks by position --------------------------------------------------------------------------------


def test_pad_equal_to_eos_does_not_mask_the_eos(base_dir) -> None:
    policy = make(base_dir)
    assert policy.pad_token_id == EOS_BASE and policy.eos_token_ids == [EOS_BASE]
    actions = torch.tensor([
        [52, EOS_BASE, EOS_BASE, EOS_BASE],  # answered, then padding that is also EOS
        [52, 53, 54, 55],  # no EOS: cut at max_new_tokens
        [EOS_BASE, EOS_BASE, EOS_BASE, EOS_BASE],  # empty answer: only the EOS
    ])
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(policy.response_mask(actions), expected)
    assert policy.truncated(actions).tolist() == [False, True, False]
    assert policy.response_lengths(actions).tolist() == [2, 4, 1]
    assert policy.decode(actions) == ["4", "4567", ""]


def test_sampled_eos_is_inside_the_mask_and_scored(base_dir) -> None:
    policy = make(base_dir)
    boost_eos(policy, EOS_BASE)
    obs = policy.encode_prompts(PROMPTS * 4)
    torch.manual_seed(3)
    out = policy.act(obs)
    lengths = out.mask.sum(1)
    ended = ~policy.truncated(out.actions)
    assert ended.sum() >= 6 and len(set(lengths.tolist())) > 1  # responses end at different lengths
    for row in torch.nonzero(ended).flatten().tolist():
        last = int(lengths[row]) - 1
        assert out.actions[row, last] == EOS_BASE  # the EOS is the last masked token ...
        assert out.logprobs[row, last] < 0  # ... and it carries its logprob
        assert (out.actions[row, last:] == EOS_BASE).all()  # pad == eos after it
    torch.testing.assert_close(policy.evaluate(obs, out.actions).logprobs, out.logprobs, atol=1e-5, rtol=0)


def test_any_of_several_eos_ids_ends_a_response(chat_dir) -> None:
    policy = make(chat_dir)
    assert policy.eos_token_ids == [IM_END, EOS_BASE] and policy.pad_token_id == EOS_BASE
    actions = torch.tensor([
        [52, IM_END, 53, EOS_BASE],
        [52, 53, EOS_BASE, IM_END],
        [52, 53, 54, 55],
    ])
    assert policy.response_mask(actions).long().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert policy.truncated(actions).tolist() == [False, False, True]
    boost_eos(policy, IM_END)
    boost_eos(policy, EOS_BASE)
    obs = policy.encode_prompts(PROMPTS * 4)
    torch.manual_seed(4)
    out = policy.act(obs)
    last_tokens = out.actions.gather(1, out.mask.sum(1, keepdim=True) - 1).flatten()[~policy.truncated(out.actions)]
    assert set(last_tokens.tolist()) == {IM_END, EOS_BASE}  # generation stopped at either id
    torch.testing.assert_close(policy.evaluate(obs, out.actions).logprobs, out.logprobs, atol=1e-5, rtol=0)


# -- sampling settings ------------------------------------------------------------------------------------


def test_checkpoint_sampling_defaults_do_not_leak(tmp_path) -> None:
    """A checkpoint asking for greedy-like sampling (top_k=1, temperature 0.01, repetition penalty)
    must not change the policy's distribution: responses vary, and rollout == recompute."""
    model_dir = write_tiny_model(tmp_path / "m", TinyModelConfig(seed=5))
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text())
    config.update({"do_sample": True, "top_k": 1, "temperature": 0.01, "repetition_penalty": 3.0})
    path.write_text(json.dumps(config))
    policy = make(model_dir)
    obs = policy.encode_prompts(["1+1="] * 8)
    torch.manual_seed(0)
    out = policy.act(obs)
    assert len({tuple(row) for row in out.actions.tolist()}) > 1
    torch.testing.assert_close(policy.evaluate(obs, out.actions).logprobs, out.logprobs, atol=1e-5, rtol=0)
    # The checkpoint's own file is written back unchanged by save_pretrained.
    policy.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "generation_config.json").read_text())["top_k"] == 1


def test_greedy_is_deterministic_and_the_argmax(base_dir) -> None:
    policy = make(base_dir)
    obs = policy.encode_prompts(PROMPTS)
    first, second = policy.act(obs, deterministic=True), policy.act(obs, deterministic=True)
    assert torch.equal(first.actions, second.actions)
    for prompt, response in zip(PROMPTS, first.actions):
        ids = policy.tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([ids + response.tolist()])).logits[0, len(ids) - 1 : -1]
        assert torch.equal(logits.argmax(-1), response)


# -- prompts ----------------------------------------------------------------------------------------------


def test_encode_prompts_left_pads_and_applies_the_chat_template(chat_dir, base_dir) -> None:
    chat = make(chat_dir)
    obs = chat.encode_prompts([[{"role": "user", "content": "1+1="}], "2+2="])
    text = "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    expected = [257] + [ord(c) for c in "user\n1+1="] + [258, ord("\n"), 257] + [ord(c) for c in "assistant\n"]
    assert chat.tokenizer(text, add_special_tokens=False)["input_ids"] == expected
    assert obs["prompt_ids"][0].tolist() == expected
    # A string prompt is used as it is under chat_template=auto; left padding with the pad id.
    width = len(expected)
    assert obs["prompt_ids"][1].tolist() == [EOS_BASE] * (width - 4) + [ord(c) for c in "2+2="]
    assert obs["prompt_mask"][1].tolist() == [False] * (width - 4) + [True] * 4
    # on: strings become one user message; off: message contents only.
    assert make(chat_dir, chat_template="on").encode_prompts(["1+1="])["prompt_ids"][0].tolist() == expected
    off = make(chat_dir, chat_template="off").encode_prompts([[{"role": "user", "content": "1+1="}]])
    assert off["prompt_ids"][0].tolist() == [ord(c) for c in "1+1="]
    with pytest.raises(UserError, match="no chat template"):
        make(base_dir, chat_template="on").encode_prompts(["1+1="])
    with pytest.raises(UserError, match="message 0"):
        chat.encode_prompts([[{"content": "no role"}]])


def test_llama_style_bos_is_prepended(tmp_path) -> None:
    policy = make(write_tiny_model(tmp_path / "bos", TinyModelConfig(add_bos=True)))
    obs = policy.encode_prompts(["12"])
    assert obs["prompt_ids"][0].tolist() == [259, ord("1"), ord("2")]


def test_bad_observations_are_explained(base_dir) -> None:
    policy = make(base_dir)
    obs = policy.encode_prompts(PROMPTS)
    right_padded = {"prompt_ids": obs["prompt_ids"], "prompt_mask": obs["prompt_mask"].flip(1)}
    with pytest.raises(ValueError, match="left-padded"):
        policy.act(right_padded)
    with pytest.raises(ValueError, match="prompt_mask"):
        policy.evaluate({"prompt_ids": obs["prompt_ids"]}, torch.zeros(3, 10, dtype=torch.long))
    with pytest.raises(UserError, match="max_position_embeddings"):
        make(base_dir, max_new_tokens=200).act(obs)


# -- options ------------------------------------------------------------------------------------------------


def test_kwargs_errors(base_dir, tmp_path) -> None:
    assert CAUSAL_LM_DEFAULTS["top_k"] == 0 and CAUSAL_LM_DEFAULTS["temperature"] == 1.0
    with pytest.raises(UserError, match="Did you mean 'temperature'"):
        make(base_dir, temprature=0.5)
    with pytest.raises(UserError, match="model_path is required"):
        build_policy(PolicyConfig(name="causal_lm"), None, None)
    with pytest.raises(UserError, match="not a Hugging Face model directory"):
        make(tmp_path / "nowhere")
    with pytest.raises(UserError, match="top_p"):
        make(base_dir, top_p=0.0)
    with pytest.raises(UserError, match="temperature"):
        make(base_dir, temperature=0)
    with pytest.raises(UserError, match="dtype"):
        make(base_dir, dtype="float8")


# -- training ---------------------------------------------------------------------------------------------


def test_gradient_checkpointing_gives_the_same_logprobs_and_gradients(base_dir) -> None:
    plain, checkpointed = make(base_dir), make(base_dir, gradient_checkpointing=True)
    obs = plain.encode_prompts(PROMPTS)
    actions = plain.act(obs).actions
    grads = []
    for policy in (plain, checkpointed):
        policy.train()
        logprobs = policy.evaluate(obs, actions).logprobs
        logprobs.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)
    assert grads[0].abs().sum() > 0


def test_lora_trains_only_adapters_and_round_trips(base_dir, tmp_path) -> None:
    policy = make(base_dir, lora_rank=4, lora_alpha=8)
    trainable = {n: t.clone() for n, t in policy.trainable_state_dict().items()}  # the dict holds views
    assert trainable and all("lora_" in name for name in trainable)
    total = sum(p.numel() for p in policy.parameters())
    assert sum(t.numel() for t in trainable.values()) < 0.2 * total
    obs = policy.encode_prompts(PROMPTS)
    actions = policy.act(obs).actions
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
    (-policy.evaluate(obs, actions).logprobs.sum()).backward()
    optimizer.step()
    frozen_before = {n: p.clone() for n, p in policy.named_parameters() if not p.requires_grad}
    after = {n: t.clone() for n, t in policy.trainable_state_dict().items()}
    assert any(not torch.equal(after[n], trainable[n]) for n in after)  # the adapters moved
    # A second policy takes the adapters and then computes the same logprobs.
    other = make(base_dir, lora_rank=4, lora_alpha=8)
    other.load_trainable_state_dict(after)
    torch.testing.assert_close(other.evaluate(obs, actions).logprobs, policy.evaluate(obs, actions).logprobs)
    assert all(torch.equal(p, frozen_before[n]) for n, p in policy.named_parameters() if not p.requires_grad)
    with pytest.raises(ValueError, match="missing"):
        other.load_trainable_state_dict({})
    # Saved with the adapters merged: a plain policy loads the same function.
    merged = make(policy.save_pretrained(tmp_path / "merged"))
    torch.testing.assert_close(merged.evaluate(obs, actions).logprobs, policy.evaluate(obs, actions).logprobs, atol=1e-5, rtol=0)


def test_full_finetune_trainable_state_is_every_parameter(base_dir) -> None:
    policy = make(base_dir)
    assert set(policy.trainable_state_dict()) == {n for n, _ in policy.named_parameters()}


def test_bfloat16_loads_and_scores_in_float32(base_dir) -> None:
    policy = make(base_dir, dtype="bfloat16")
    assert next(policy.model.parameters()).dtype == torch.bfloat16
    obs = policy.encode_prompts(PROMPTS)
    out = policy.act(obs)
    evaluation = policy.evaluate(obs, out.actions)
    assert evaluation.logprobs.dtype == torch.float32
    torch.testing.assert_close(evaluation.logprobs, out.logprobs, atol=0.05, rtol=0)
