"""The co-running benchmark times each job alone and side by side, on its own core."""

from __future__ import annotations

import json
import os

import pytest

import benchmarks.common as common
import benchmarks.co_running as co_running


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_each_job_is_timed_alone_and_beside_every_other(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    result = co_running.main(["--recipe", "cartpole_ppo", "--envs", "4", "--calls", "5", "--repeats", "1", "--name", "quick"])
    saved = json.loads((tmp_path / "co_running_quick.json").read_text())
    assert saved["side_by_side_over_alone"] == result["side_by_side_over_alone"]
    assert set(result["alone_s"]) == {"env", "rollout", "stream.env", "stream.rollout", "matmul"}
    assert all(s > 0 for s in result["alone_s"].values())
    assert set(result["side_by_side_over_alone"]) == {"env+rollout", "env+env", "rollout+rollout", "stream+stream",
                                                       "env+matmul", "rollout+matmul"}
    for key, ratios in result["side_by_side_over_alone"].items():
        parts = {part for job in key.split("+") for part in co_running.PARTS[job]}
        assert set(ratios) == parts and all(r > 0 for r in ratios.values())
        # each ratio is the pair's median over the part's median alone
        for part, ratio in ratios.items():
            assert ratio == pytest.approx(result["runs_s"][key][0][part] / result["alone_s"][part])
    # a stream's halves against the same calls made back to back
    assert result["stream_alone_over_separate"]["env"] == pytest.approx(result["alone_s"]["stream.env"] / result["alone_s"]["env"])
