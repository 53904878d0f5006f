"""The M2Flow sweep's trace (``python -m benchmarks.m2flow_sweep RECIPE --trace``): every iteration
of a real run against the prediction it logged, and how well windows of the settled plan's
iterations know its time."""

from __future__ import annotations

import json
import os

import pytest

import benchmarks.common as common
import benchmarks.m2flow_sweep as m2flow_sweep
from benchmarks.m2flow_sweep import trace


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


def _row(took: float, predicted: float | None, calibrating: bool = False) -> dict:
    return {"iteration_s": took, "predicted_s": predicted, "calibrating": calibrating}


def test_the_settled_prediction_is_judged_on_the_first_window_after_calibration():
    # a warm-up, three calibration iterations (not judged), then the settled plan's: 0.5 s
    # predicted, taking 0.4 s for 10 s, then 1.0 s (outside a 3.9 s window: ten iterations)
    rows = [_row(2.0, 0.5), *[_row(0.45, 0.5, calibrating=True)] * 3, *[_row(0.4, 0.5)] * 25, *[_row(1.0, 0.5)] * 10]
    held = trace.settled_error(rows, window_s=3.9)
    assert held["iterations"] == 10 and held["calibration_iterations"] == 3
    assert held["predicted_s"] == 0.5 and held["measured_s"] == 0.4 and held["error"] == pytest.approx(0.25)
    # the whole settled run: the median iteration is still 0.4 s, the slow tail in the spread only
    assert trace.settled_error(rows, window_s=1e9)["iterations"] == 35
    # iterations the run logged no prediction for are not judged; fewer than two settled: nothing to judge
    assert trace.settled_error([_row(1.0, 0.5), _row(0.4, None), _row(0.4, 0.5)]) is None
    # a run that did not calibrate: all but its first iteration (resets, first calls)
    plain = trace.settled_error([_row(9.0, 1.0), _row(1.0, 1.1), _row(1.0, 1.1)])
    assert plain["iterations"] == 2 and plain["calibration_iterations"] == 0 and plain["error"] == pytest.approx(0.1)


def test_the_settled_seconds_count_only_after_calibration():
    assert trace.settled_s([]) == (0, 0.0)
    calibrating = [_row(2.0, 0.5, calibrating=True), _row(0.45, 0.5, calibrating=True)]
    assert trace.settled_s(calibrating) == (0, 0.0)
    assert trace.settled_s([*calibrating, _row(0.4, 0.5), _row(0.5, 0.5)]) == (2, pytest.approx(0.9))
    assert trace.settled_s([_row(9.0, 1.0), _row(1.0, 1.0)]) == (1, 1.0)  # not calibrating: all but the first


def test_the_errors_of_several_runs_are_summarised_with_how_many_hold():
    spread = trace.spread_of_errors([0.05, -0.10, 0.20, 0.01])
    assert spread["runs"] == 4 and spread["median"] == pytest.approx(0.03) and spread["mean"] == pytest.approx(0.04)
    assert spread["largest"] == pytest.approx(0.20) and spread["within"] == 0.15 and spread["runs_within"] == 3
    assert trace.spread_of_errors([0.3])["stdev"] == 0 and trace.spread_of_errors([0.3])["runs_within"] == 0


@pytest.mark.slow
def test_a_run_is_traced_iteration_by_iteration(tmp_path, monkeypatch, ray_cluster):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    out = tmp_path / "trace.jsonl"
    result = m2flow_sweep.main(["cartpole_ppo", "--trace", "algo.total_env_steps=4096", "algo.epochs=2", "plan.max_chunks=1",
                                "plan.calibrate=0", "plan.learn=true", "--jsonl", str(out)])
    rows = result["rows"]
    assert [r["iteration"] for r in rows] == list(range(1, 17))  # 4096 steps of 8 envs x 32
    assert all(r["decisions"] == 32 and r["samples"] == 256 and r["iteration_s"] > 0 for r in rows)
    # the prediction the run logs, before any re-planning (off in a trace): the planner's, unchanged
    assert len({r["predicted_s"] for r in rows}) == 1 and rows[0]["predicted_s"] > 0
    trained = [r for r in rows if r["train_s"] is not None]
    assert trained and all(set(r["factors"]) == {"env", "rollout", "trainer"} for r in trained)
    assert not any(r["calibrating"] for r in rows)
    # the hypervisor's share of the CPU time during each iteration, where /proc/stat tells it
    if os.path.exists("/proc/stat"):
        assert all(r["steal"] is not None and 0.0 <= r["steal"] <= 1.0 for r in rows)
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    # asked to, it learned as a run does: the cached profile records the run's measured costs for the next run
    cached = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "profiles").glob("*.json")]
    assert len(cached) == 1 and cached[0]["meta"].get("learned")
    # the planner's prediction against the first 16 s of iterations after the first
    held = result["runs"][0]["settled_error"]
    assert held["calibration_iterations"] == 0 and held["iterations"] >= 2 and held["predicted_s"] == rows[0]["predicted_s"]
    assert result["errors"]["runs"] == 1 and result["errors"]["median"] == held["error"]


@pytest.mark.slow
def test_repeated_runs_each_profile_afresh_and_are_written_with_their_errors(tmp_path, monkeypatch, ray_cluster):
    cache = tmp_path / "cache"
    monkeypatch.setenv("EMBODIED_CACHE", str(cache))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    # 8 iterations of 8 envs x 32 steps; each run goes on past them until 1.5 s of them ran
    result = m2flow_sweep.main(["cartpole_ppo", "--trace", "algo.total_env_steps=2048", "algo.epochs=1", "plan.max_chunks=1",
                                "--runs", "2", "--fresh-cache", "--settled-s", "1.5", "--name", "repeats"])
    assert len(result["runs"]) == 2
    for run in result["runs"]:
        n, seconds = trace.settled_s(run["rows"])
        assert seconds >= 1.5 and seconds - run["rows"][-1]["iteration_s"] < 1.5 and len(run["rows"]) > 8
        assert run["settled_error"]["iterations"] == n
    assert result["errors"]["runs"] == 2 and result["fresh_cache"]
    # each run profiled in a cache of its own, gone after it: the user's cache untouched
    assert not cache.exists()
    assert os.environ["EMBODIED_CACHE"] == str(cache)
    saved = json.loads((tmp_path / "m2flow_sweep_trace_repeats.json").read_text())
    assert saved["benchmark"] == "m2flow_sweep" and saved["mode"] == "trace" and len(saved["runs"]) == 2
    assert saved["command"].startswith("python -m benchmarks.m2flow_sweep cartpole_ppo --trace") and "--runs 2" in saved["command"]
    assert saved["errors"] == pytest.approx(result["errors"]) and saved["machine"]["cpu_cores"] > 0

