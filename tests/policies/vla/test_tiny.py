"""Tiny checkpoints keep OpenVLA's layout and token conventions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from embodied.errors import UserError  # noqa: E402
from policies.vla.tiny import TINY_DEFAULTS, tiny_spec, tiny_tokenizer, write_tiny_checkpoint  # noqa: E402


def test_tokenizer_keeps_llama2_conventions() -> None:
    tokenizer = tiny_tokenizer(512)
    assert tokenizer.get_vocab_size() == 513  # 512 text tokens and <PAD>
    assert [tokenizer.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<PAD>")] == [0, 1, 2, 512]
    ids = tokenizer.encode("In: What action should the robot take to open the drawer?\nOut: ").ids
    assert ids[0] == 1 and ids[-1] == tokenizer.token_to_id("\u2581")  # BOS first, the lone space token last
    assert ids[-2] == tokenizer.token_to_id(":")
    assert max(ids) < 512 - 256  # prompts never produce action tokens (ids 256 .. 511)
    assert tokenizer.id_to_token(256).startswith("<action_") and tokenizer.id_to_token(511).startswith("<action_")


def test_checkpoint_files_are_the_official_layout(tmp_path: Path) -> None:
    path = write_tiny_checkpoint(tmp_path, proprio_dim=8, l1_head=True, num_shards=2, step=50000)
    names = sorted(p.name for p in path.iterdir())
    assert names == [
        "action_head--50000_checkpoint.pt", "config.json", "dataset_statistics.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "preprocessor_config.json", "proprio_projector--50000_checkpoint.pt", "tokenizer.json",
    ]
    config = json.loads((path / "config.json").read_text())
    assert config["vision_backbone_id"] == "dinosiglip-vit-so-224px" and config["use_fused_vision_backbone"]
    assert config["text_config"]["vocab_size"] - config["pad_to_multiple_of"] == TINY_DEFAULTS["vocab_size"]
    assert config["pad_token_id"] == TINY_DEFAULTS["vocab_size"]
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert "vision_backbone.featurizer.blocks.0.ls1.scale_factor" in index  # timm naming
    assert "vision_backbone.fused_featurizer.attn_pool.latent" in index
    stats = json.loads((path / "dataset_statistics.json").read_text())
    assert set(stats["tiny"]) >= {"action", "proprio"} and stats["tiny"]["action"]["mask"][-1] is False
    proprio = torch.load(path / "proprio_projector--50000_checkpoint.pt", weights_only=True)
    assert set(proprio) == {"module.fc1.weight", "module.fc1.bias", "module.fc2.weight", "module.fc2.bias"}


def test_tiny_spec_errors() -> None:
    with pytest.raises(UserError, match="Did you mean 'patch_size'"):
        tiny_spec({"patch": 4})
    with pytest.raises(UserError, match="must be an integer >= 1"):
        tiny_spec({"llm_depth": 0})
