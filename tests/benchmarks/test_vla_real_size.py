"""benchmarks.vla_real_size on a tiny model of the same architecture (the CPU run of the code the
GPU run uses): every section measured, weights restored bit for bit, the context switch a round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
from benchmarks import vla_real_size  # noqa: E402
from policies.vla.config import VLAConfig  # noqa: E402


def test_the_tiny_run_measures_every_section(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    result = vla_real_size.main(["--tiny", "--device", "cpu", "--repeats", "2", "--cycles", "2", "--out", str(out)])
    assert json.loads(out.read_text())["parameters"] == result["parameters"] > 0
    assert [r["batch"] for r in result["decode"]] == [1, 2]
    for row in result["decode"]:
        assert row["openvla_generate_s"] > 0 and row["oft_parallel_s"] > 0
        assert row["oft_actions_per_s"] == pytest.approx(row["batch"] * vla_real_size.OFT_CHUNK / row["oft_parallel_s"])
    assert [r["batch"] for r in result["train"]] == [2] and result["train"][0]["step_s"] > 0
    assert 0 < result["trainable_parameters"] < result["parameters"]  # LoRA adapters only
    sync = result["weight_sync"]
    assert sync["lora_adapters"]["bytes"] < sync["all_weights"]["bytes"]
    assert all(s["bit_exact"] and s["checked_tensors"] > 0 for s in sync.values())
    first, second = result["context_switch"]
    assert first["intact"] and second["intact"] and first["bytes_moved"] == second["bytes_moved"]
    assert set(first["what"]) == {"weights", "grads", "buffers", "optimizer"} and first["what"]["optimizer"] > 0
    assert first["device_bytes_offloaded"] == 0  # on CPU: none of the component's bytes outside its host buffers


def test_the_real_size_config_is_openvla_7b() -> None:
    config = VLAConfig.from_dict(vla_real_size.OPENVLA_7B)
    assert config.vocab_size == 32000 and config.num_patches == 256 and config.llama_config().num_hidden_layers == 32
