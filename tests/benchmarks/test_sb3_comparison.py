"""The SB3 comparison's harness runs both sides (a few thousand steps; the numbers are the benchmark's)."""

from __future__ import annotations

import pytest

from benchmarks import sb3_comparison


@pytest.mark.slow
def test_both_sides_train_and_report_throughput(tmp_path, monkeypatch):
    pytest.importorskip("stable_baselines3")
    sb3 = sb3_comparison.run_sb3(4096)
    assert sb3["steps"] >= 4096 and sb3["env_steps_per_s"] > 0
    ours = sb3_comparison.run_embodied(4096, staleness=1, seed=0, cache=str(tmp_path / "cache"), run_dir=tmp_path / "run")
    assert ours["steps"] >= 4096 and ours["env_steps_per_s"] > 0 and ours["eval_return"] is not None
