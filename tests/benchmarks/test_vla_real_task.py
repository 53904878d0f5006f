"""benchmarks.vla_real_task: the steps a user runs, skipped when done, and the result it writes
from their outputs (the run's curve, the paired before/after evaluation)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from benchmarks import vla_real_task  # noqa: E402


def test_result_from_finished_steps(tmp_path, monkeypatch):
    demos = tmp_path / "demos.h5"
    demos.write_text("")
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "recipe.yaml").write_text("")
    (sft / "sft.json").write_text(json.dumps({"metrics": {"sft/val_nll_first": 5.8, "sft/val_nll_best": 1.7, "sft/epochs": []}}))
    run = tmp_path / "ppo"
    (run / "eval").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"env_steps": 800, "wall_s": 60.0}))
    rows = [{"env_steps": 400, "train/success_rate": 0.3}, {"env_steps": 800, "eval/success_rate": 0.5}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    before = tmp_path / "before.json"
    before.write_text(json.dumps({"metrics": {"eval/success_rate": 0.4, "eval/episodes": 50}}))
    ran = []

    def fake_run(cmd):  # only the "after" evaluation is left to run
        ran.append(cmd)
        (run / "eval" / "after.json").write_text(json.dumps({"metrics": {"eval/success_rate": 0.66, "eval/episodes": 50}}))

    monkeypatch.setattr(vla_real_task, "run", fake_run)
    out = tmp_path / "result.json"
    assert vla_real_task.main(["--demos", str(demos), "--sft", str(sft), "--run", str(run), "--before", str(before),
                               "--out", str(out)]) == 0
    assert [cmd[0] for cmd in ran] == ["eval"] and ran[0][1] == str(run)
    result = json.loads(out.read_text())
    assert result["before"]["success_rate"] == 0.4 and result["after"]["success_rate"] == 0.66
    assert result["delta_points"] == 26.0
    assert result["rl"]["curve"] == [{"env_steps": 800, "success": 0.5}]
    assert result["sft"] == {"sft/val_nll_first": 5.8, "sft/val_nll_best": 1.7}
    assert (tmp_path / "result.png").stat().st_size > 0
