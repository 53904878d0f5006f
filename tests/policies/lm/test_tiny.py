"""Tiny Qwen2 models: written with save_pretrained, loaded back by the Auto classes and the policy
unchanged (weights, config, tokenizer ids, special tokens)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from embodied.errors import UserError
from policies.config import PolicyConfig
from policies.lm.tiny import TinyModelConfig, byte_symbols, write_tiny_model
from policies.registry import build_policy


def test_byte_symbols_are_gpt2s_table() -> None:
    symbols = byte_symbols()
    assert len(set(symbols)) == 256
    assert symbols[ord("4")] == "4" and symbols[ord("+")] == "+"
    assert symbols[ord(" ")] == "Ġ" and symbols[ord("\n")] == "Ċ"  # as in every byte-level BPE vocab


def test_round_trip_through_the_auto_classes(tmp_path) -> None:
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=3)
    model_dir = write_tiny_model(tmp_path / "tiny", cfg)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert isinstance(model, Qwen2ForCausalLM)
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.vocab_size) == (32, 2, 259)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    # One token per byte: ids are the bytes, special tokens after them.
    text = "47+85= x\n"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode())
    assert tokenizer.decode(ids) == text
    assert tokenizer("1<|endoftext|>")["input_ids"] == [ord("1"), 256]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id) == (256, 256, None)
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == 256
    # The same seed writes the same weights; the loaded weights are the written ones.
    again = AutoModelForCausalLM.from_pretrained(write_tiny_model(tmp_path / "again", cfg), local_files_only=True)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    other = AutoModelForCausalLM.from_pretrained(
        write_tiny_model(tmp_path / "other", TinyModelConfig(**{**cfg.__dict__, "seed": 4})), local_files_only=True
    )
    assert not torch.equal(model.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_chat_style_special_tokens(tmp_path) -> None:
    model_dir = write_tiny_model(tmp_path / "chat", TinyModelConfig(style="chat"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == [258, 256]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_policy_save_and_reload_keeps_the_function(tmp_path) -> None:
    model_dir = write_tiny_model(tmp_path / "tiny", TinyModelConfig(seed=7))
    policy = build_policy(PolicyConfig(name="causal_lm", kwargs={"model_path": str(model_dir)}), None, None)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.01)  # differs from the written init
    reloaded = build_policy(
        PolicyConfig(name="causal_lm", kwargs={"model_path": str(policy.save_pretrained(tmp_path / "saved"))}), None, None
    )
    obs = policy.encode_prompts(["12+34=", "5"])
    actions = policy.act(obs).actions
    torch.testing.assert_close(reloaded.evaluate(obs, actions).logprobs, policy.evaluate(obs, actions).logprobs)


def test_bad_sizes_are_user_errors(tmp_path) -> None:
    with pytest.raises(UserError, match="num_heads"):
        write_tiny_model(tmp_path / "x", TinyModelConfig(hidden_size=30, num_heads=4))
    with pytest.raises(UserError, match="num_kv_heads"):
        write_tiny_model(tmp_path / "x", TinyModelConfig(num_heads=4, num_kv_heads=3))
