"""The SB3 comparison's harness runs both sides (one iteration of its settings each: 8 envs x 256 steps; the
numbers are the benchmark's)."""

from __future__ import annotations

import pytest

from benchmarks import sb3_comparison


@pytest.mark.slow
def test_both_sides_train_and_report_throughput(tmp_path, monkeypatch):
    pytest.importorskip("stable_baselines3")
    sb3 = sb3_comparison.run_sb3(2048)
    assert sb3["steps"] >= 2048 and sb3["env_steps_per_s"] > 0
    ours = sb3_comparison.run_embodied(2048, staleness=1, seed=0, cache=str(tmp_path / "cache"), run_dir=tmp_path / "run")
    assert ours["steps"] >= 2048 and ours["env_steps_per_s"] > 0 and ours["eval_return"] is not None
