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
    saved = json.loads((tmp_path / "quick.json").read_text())
    assert saved["side_by_side_over_alone"] == result["side_by_side_over_alone"]
    assert set(result["alone_s"]) == {"env", "rollout", "matmul"} and all(s > 0 for s in result["alone_s"].values())
    assert set(result["side_by_side_over_alone"]) == {"env+rollout", "env+matmul", "rollout+matmul"}
    for key, ratios in result["side_by_side_over_alone"].items():
        assert set(ratios) == set(key.split("+")) and all(r > 0 for r in ratios.values())
        # each ratio is the pair's median over the job's median alone
        for job, ratio in ratios.items():
            assert ratio == pytest.approx(result["runs_s"][key][0][job] / result["alone_s"][job])
