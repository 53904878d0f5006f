"""A run's learning curve (embodied/learning_curve.py) reads the run dir and names what the run trained."""

from __future__ import annotations

import json

import pytest
import yaml

from embodied.learning_curve import curve, default_title


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


def test_any_key_of_the_metrics_is_a_curve_and_an_unknown_one_is_a_user_error(tmp_path):
    from embodied.errors import UserError
    from embodied.learning_curve import default_metric, logged_metrics

    rows = [{"wall_s": 5.0 * i, "env_steps": 100 * i, "train/episode_return": 10.0 * i, "losses/pg": 0.5 / i}
            for i in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert logged_metrics(rows, {}) == ["episode_return", "train/episode_return", "losses/pg"]
    assert default_metric(tmp_path) == "episode_return"  # no success rate logged: the return
    pg = curve(tmp_path, "losses/pg", target=None)
    assert pg["train"] == [(5.0, 100, 0.5), (10.0, 200, 0.25)] and pg["eval"] == [] and pg["first_eval_at_target"] is None
    with pytest.raises(UserError, match=r"logged no metric 'episode_retrun'\. Did you mean 'episode_return'"):
        curve(tmp_path, "episode_retrun")
    with pytest.raises(UserError, match="is not a run dir: it does not exist"):
        curve(tmp_path / "nope")
