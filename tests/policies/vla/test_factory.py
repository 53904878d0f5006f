"""Registration without the vla extra, and the kwargs schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from embodied.errors import UserError
from policies.vla.factory import OFT_KWARGS, VLA_KWARGS, parse_kwargs

ROOT = Path(__file__).resolve().parents[3]

WITHOUT_TRANSFORMERS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "peft", "tokenizers", "accelerate"):
            raise ImportError("blocked " + name)
sys.meta_path.insert(0, Block())
import gymnasium as gym, numpy as np
from embodied.errors import UserError
from policies.config import PolicyConfig
from policies.registry import POLICIES, build_policy
import policies.models
assert "openvla" in POLICIES and "openvla_oft" in POLICIES
space = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)})
assert build_policy(PolicyConfig(name="token_transformer", kwargs={"patch_size": 8}), space, gym.spaces.Box(-1, 1, (2,))) is not None
try:
    build_policy(PolicyConfig(name="openvla", kwargs={"tiny": {}}), space, gym.spaces.Box(-1, 1, (2,)))
except UserError as err:
    print("USER ERROR:", err)
"""


def test_registry_works_without_the_vla_extra() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", WITHOUT_TRANSFORMERS], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "USER ERROR: policy 'openvla' needs transformers, tokenizers and peft: pip install 'embodied[vla]'" in result.stdout


def test_kwargs_defaults_and_checks() -> None:
    options = parse_kwargs({"tiny": {}, "temperature": 2}, VLA_KWARGS, "openvla")
    assert options["temperature"] == 2.0 and options["top_k"] == 0 and options["value_head"] == 1
    assert set(OFT_KWARGS) - set(VLA_KWARGS) == {"eval_head", "tiny_l1_head", "tiny_proprio"}
    with pytest.raises(UserError, match="Did you mean 'top_k'"):
        parse_kwargs({"tiny": {}, "topk": 5}, VLA_KWARGS, "openvla")
    with pytest.raises(UserError, match="top_k=-1 must be a non-negative integer"):
        parse_kwargs({"tiny": {}, "top_k": -1}, VLA_KWARGS, "openvla")
    with pytest.raises(UserError, match="temperature=0 must be a positive number"):
        parse_kwargs({"tiny": {}, "temperature": 0}, VLA_KWARGS, "openvla")
    with pytest.raises(UserError, match="cameras"):
        parse_kwargs({"tiny": {}, "cameras": "rgb"}, VLA_KWARGS, "openvla")
    with pytest.raises(UserError, match="dtype='fp16' must be one of"):
        parse_kwargs({"tiny": {}, "dtype": "fp16"}, VLA_KWARGS, "openvla")
    with pytest.raises(UserError, match="lora_targets"):
        parse_kwargs({"tiny": {}, "lora_targets": 3}, VLA_KWARGS, "openvla")
