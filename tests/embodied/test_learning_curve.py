"""The learning-curve benchmark reads a run dir and names what the run trained."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks.learning_curve import curve, default_title


def test_a_curve_has_its_runs_points_and_a_title_naming_the_runs_algorithm(tmp_path):
    rows = [{"wall_s": 10.0 * i, "env_steps": 3200 * i, "train/success_rate": 0.3 * i} for i in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"wall_s": 31.0, "env_steps": 9600, "eval/success_rate": 0.84}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "env": {"id": "PushCube-v1", "obs_mode": "state"}, "algo": {"name": "grpo"}, "eval": {"episodes": 32}}))
    data = curve(tmp_path, "success_rate", target=0.8)
    assert [v for _, _, v in data["train"]] == pytest.approx([0.3, 0.6, 0.9])
    assert data["eval"] == [(31.0, 9600, 0.84)] and data["first_eval_at_target"] == {"wall_s": 31.0, "env_steps": 9600}
    assert default_title(data, cores=2) == "PushCube-v1 (state), GRPO, 2 CPU cores: success rate vs wall time"
