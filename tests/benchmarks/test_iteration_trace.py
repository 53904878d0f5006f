"""The iteration trace (benchmarks/iteration_trace.py): every iteration of a real run against the
prediction it logged, and how well windows of the settled plan's iterations know its time."""

from __future__ import annotations

import json

import pytest

import benchmarks.iteration_trace as trace


def test_window_spread_of_a_steady_plan_is_zero_and_of_a_slow_spell_is_its_share():
    assert trace.window_spread([]) == []
    steady = trace.window_spread([0.2] * 400)
    assert [w["window_s"] for w in steady] == [4.0, 8.0, 16.0] and [w["iterations"] for w in steady] == [20, 40, 80]
    assert all(w["spread"] == 0 and w["largest"] == 0 for w in steady)
    # 80 iterations at 0.2 s then 80 at 0.3 s: every 4 s window sits in one spell; a 16 s one
    # (of 0.25 s iterations, the median's length, 64 of them) straddles them once
    spells = [0.2] * 80 + [0.3] * 80
    (four, eight, sixteen) = trace.window_spread(spells)
    assert four["iterations"] == 16 and four["windows"] == 10
    assert four["deviations"] == pytest.approx([0.2 / 0.25 - 1] * 5 + [0.3 / 0.25 - 1] * 5)
    assert four["spread"] == pytest.approx(0.2) and four["largest"] == pytest.approx(0.2)
    assert sixteen["windows"] == 2 and sixteen["deviations"] == pytest.approx([-0.2, 0.2])
    # a length that leaves fewer than two windows is left out
    assert [w["window_s"] for w in trace.window_spread([0.2] * 40)] == [4.0]


@pytest.mark.slow
def test_a_run_is_traced_iteration_by_iteration(tmp_path, monkeypatch, ray_cluster):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "trace.jsonl"
    result = trace.main(["cartpole_ppo", "algo.total_env_steps=4096", "algo.epochs=2", "plan.max_chunks=1",
                         "plan.calibrate=0", "--out", str(out)])
    rows = result["rows"]
    assert [r["iteration"] for r in rows] == list(range(1, 17))  # 4096 steps of 8 envs x 32
    assert all(r["decisions"] == 32 and r["samples"] == 256 and r["iteration_s"] > 0 for r in rows)
    # the prediction the run logs, before any re-planning (off in a trace): the planner's, unchanged
    assert len({r["predicted_s"] for r in rows}) == 1 and rows[0]["predicted_s"] > 0
    trained = [r for r in rows if r["train_s"] is not None]
    assert trained and all(set(r["factors"]) == {"env", "rollout", "trainer"} for r in trained)
    assert not any(r["calibrating"] for r in rows)
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
