"""The M2Flow sweep benchmark measures what it claims: every candidate (and the sequential plan)
under exactly that plan, the choice against the measured best, the share of the gap to the bound."""

from __future__ import annotations

import json
import statistics

import pytest

import benchmarks.common as common
import benchmarks.m2flow_sweep as m2flow_sweep
from benchmarks.m2flow_sweep import sweep
from scheduler import Plan, PlanResult, Timeline


def measured_as_quick_measures(times: list[float], at_least: int) -> bool:
    """Whether ``times`` are the iterations ``--quick`` times a plan for: at least ``at_least``,
    then more until they took QUICK_MEASURE_S seconds (what they took, not the full iterations an
    episodic one stands for), at most QUICK_MAX_ITERATIONS."""
    n, enough, most = len(times), sweep.QUICK_MEASURE_S, sweep.QUICK_MAX_ITERATIONS
    done = n >= at_least and (sum(times) >= enough or n >= most)
    one_fewer_was_not = n == at_least or (sum(times[:-1]) < enough and n - 1 < most)
    return done and one_fewer_was_not


def _plan(mode: str, chunks: int, t: float, placement=None) -> Plan:
    return Plan(mode, placement or {"env": (0,), "rollout": (1,), "trainer": (0, 1)}, chunks, None, (), t)


def test_candidates_are_distinct_capped_and_include_sequential_and_choice():
    empty = Timeline((), 0.0, {})
    best = _plan("hybrid", 2, 1.0)
    seq = _plan("colocated", 1, 2.0, {"env": (0, 1), "rollout": (0, 1), "trainer": (0, 1)})
    cands = [best, _plan("hybrid", 2, 1.0), _plan("hybrid", 3, 1.2), _plan("hybrid", 1, 1.5)]
    result = PlanResult(best, empty, [(p, empty) for p in cands])
    plans = sweep.candidates(result, seq, max_chunks=2)
    assert [(p.mode, p.num_chunks) for p in plans] == [("hybrid", 2), ("hybrid", 1), ("colocated", 1)]


def test_rounds_interleave_the_plans_forward_then_backward():
    """Each plan once per round; a host that slows down steadily through the sweep gives every
    plan the same mean slowdown over two rounds (over one round, the old sweep, the last plan
    measured took the whole drift)."""
    order = sweep.schedule(3, 2)
    assert order == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    assert sweep.schedule(2, 1) == [(0, 0), (0, 1)]
    slot = {entry: t for t, entry in enumerate(order)}  # the host's slowdown grows with time: 1 + 0.1 t
    mean_slowdown = {i: statistics.fmean(1 + 0.1 * slot[(r, i)] for r in range(2)) for i in range(3)}
    assert len({round(v, 9) for v in mean_slowdown.values()}) == 1
    assert sorted({i for _, i in sweep.schedule(4, 3)}) == [0, 1, 2, 3] and len(sweep.schedule(4, 3)) == 12


def test_a_plans_rounds_pool_into_one_measurement():
    rounds = [[{"time/iteration_s": 1.0}, {"time/iteration_s": 1.2}], [{"time/iteration_s": 0.9}]]
    ran, host = sweep.pooled(rounds, [{"reference_s": 0.1, "steal": 0.02}, {"reference_s": 0.3, "steal": 0.04}])
    assert [m["time/iteration_s"] for m in ran] == [1.0, 1.2, 0.9]
    assert host == pytest.approx({"reference_s": 0.2, "steal": 0.03})
    assert sweep.pooled(rounds, [{"reference_s": 0.1, "steal": None}, {"reference_s": 0.1, "steal": 0.5}])[1]["steal"] is None


def test_each_round_compares_the_choice_with_that_rounds_fastest():
    rows = [
        _row("streams 2ch", 1.0, [1.0, 1.3], [1.0, 1.0], chosen=True, sequential=True, first_choice=True,
             measured_rounds_s=[1.0, 1.3]),
        _row("hybrid 2ch", 1.1, [1.1, 1.2], [1.0, 1.0], measured_rounds_s=[1.1, 1.2]),
    ]
    summary = sweep.summarize(rows, bound_s=None, calibration_iterations=3)
    assert summary["chosen_over_best_rounds"] == pytest.approx([1.0, 1.3 / 1.2])
    for r in rows:
        del r["measured_rounds_s"]  # rows of sweeps before the rounds
    assert sweep.summarize(rows, bound_s=None, calibration_iterations=3)["chosen_over_best_rounds"] == []


def _row(plan: str, predicted: float, times: list[float], scales: list[float], **flags) -> dict:
    """A measured candidate as sweep_recipe records it (medians of its iterations)."""
    measured = statistics.median(times)
    return {"plan": plan, "predicted_s": predicted, "measured_s": measured, "error": (predicted - measured) / measured,
            "profiled_error": -0.25, "measured_full_s": statistics.median(t / s for t, s in zip(times, scales)),
            "chosen": False, "sequential": False, "first_choice": False, **flags}


def test_table_reports_choice_vs_best_and_the_gap_captured():
    rows = [
        _row("colocated 1ch", 2.0, [2.0], [1.0], sequential=True, first_choice=True),
        _row("hybrid 2ch", 1.5, [1.6], [1.0], chosen=True),
        _row("hybrid 3ch", 1.6, [1.5], [1.0]),
    ]
    summary = sweep.summarize(rows, bound_s=1.2, calibration_iterations=6)
    assert summary["best"] == "hybrid 3ch" and summary["chosen_over_best"] == pytest.approx(1.6 / 1.5)
    assert summary["gap_captured"] == pytest.approx(0.5) and summary["speedup_vs_sequential"] == pytest.approx(1.25)
    md = sweep.table([{"label": "toy", "candidates": rows, "summary": summary}])
    assert md.splitlines()[-1] == ("| toy | hybrid 2ch | 1.500 | 1.600 | -6.3% | - | colocated 1ch (-25.0%) | 1.600 | 1.500 "
                                   "(hybrid 3ch) | +6.7% | 2.000 | 1.200 | 50% | 6 |")
    # the run's own iterations after calibration, against the prediction it logged for each
    summary.update(sweep.run_error([{"time/iteration_s": t, "plan/measured_over_predicted": t / 1.5} for t in (1.4, 1.5, 1.7)]))
    assert summary["run_measured_s"] == 1.5 and summary["run_predicted_s"] == pytest.approx(1.5)
    assert summary["run_error"] == pytest.approx(0.0)
    md = sweep.table([{"label": "toy", "candidates": rows, "summary": summary}])
    assert "| -6.3% | 1.500 (+0.0%) | colocated 1ch (-25.0%) |" in md
    assert sweep.run_error([])["run_error"] is None  # no iteration carried a prediction: the column says "-"


def test_choice_vs_best_carries_its_standard_error():
    """Two plans a few percent apart on iterations that spread: the table says how well the ratio
    is known, from each median's relative standard error."""
    from pipelines.calibrate import relative_standard_error
    chosen_times, best_times = [0.14, 0.15, 0.18, 0.18], [0.14, 0.15, 0.16, 0.19]
    rows = [
        _row("streams 2ch", 0.15, chosen_times, [1.0] * 4, chosen=True, sequential=True, first_choice=True,
             measured_rse=relative_standard_error(chosen_times)),
        _row("colocated 2ch", 0.19, best_times, [1.0] * 4, measured_rse=relative_standard_error(best_times)),
    ]
    summary = sweep.summarize(rows, bound_s=None, calibration_iterations=6)
    assert summary["best"] == "colocated 2ch" and summary["chosen_over_best"] == pytest.approx(0.165 / 0.155)
    expected = (rows[0]["measured_rse"] ** 2 + rows[1]["measured_rse"] ** 2) ** 0.5
    assert summary["chosen_over_best_rse"] == pytest.approx(expected) and expected > 0.05
    assert f"| +6.5% (+-{100 * expected:.1f}%) |" in sweep.table([{"label": "toy", "candidates": rows, "summary": summary}])
    # the choice measured best: nothing to qualify
    rows[1]["measured_full_s"] = 0.2
    assert sweep.summarize(rows, bound_s=None, calibration_iterations=6)["chosen_over_best_rse"] is None


def test_the_host_drift_is_reported_beside_the_error():
    """The chosen plan measured while the host ran a fixed workload 1.25x slower than during
    calibration: the error stays the verdict, the error at calibration's speed stands beside it."""
    chosen = _row("hybrid 2ch", 1.0, [1.25], [1.0], chosen=True, sequential=True, first_choice=True)
    chosen.update(host_reference_s=0.125, host_drift=1.25,
                  error_at_calibration_speed=sweep.error([1.0 * 1.25], [1.25]))
    summary = sweep.summarize([chosen], bound_s=None, calibration_iterations=2)
    assert summary["chosen_error"] == pytest.approx(-0.2) and summary["chosen_error_at_calibration_speed"] == pytest.approx(0.0)
    md = sweep.table([{"label": "toy", "candidates": [chosen], "summary": summary}])
    assert "| -20.0% (host x1.25: +0.0%) |" in md.splitlines()[-1]


def test_early_ended_iterations_are_compared_per_full_iteration():
    # a GRPO iteration ends with its episodes, at another point under each plan: the plan that did a
    # smaller share of its iteration (0.1 against 0.25) is not the faster one for measuring less
    rows = [
        _row("colocated 1ch", 0.16, [0.16, 0.16], [0.25, 0.25], sequential=True, first_choice=True),
        _row("streams 2ch", 0.06, [0.06, 0.06], [0.1, 0.1]),
        _row("hybrid 2ch", 0.09, [0.09, 0.09], [0.25, 0.25], chosen=True),
    ]
    summary = sweep.summarize(rows, bound_s=0.2, calibration_iterations=3)
    assert summary["best"] == "hybrid 2ch" and summary["chosen_over_best"] == 1.0
    assert summary["chosen_full_s"] == pytest.approx(0.36) and summary["sequential_full_s"] == pytest.approx(0.64)
    # the bound is per full iteration: 0.2 s against 0.64 s sequential and 0.36 s chosen
    assert summary["gap_captured"] == pytest.approx((0.64 - 0.36) / (0.64 - 0.2))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_sweep_measures_every_candidate_of_a_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    # one chunk at most: the placements of the table (colocated, hybrid, disaggregated), each built
    # and run once (the whole sweep's path, in ~1 min on 2 quiet cores)
    out = m2flow_sweep.main(["--quick", "--recipes", "cartpole_ppo", "--warmup", "0", "--max-chunks", "1", "algo.rollout_steps=8"])
    (recipe,) = out["recipes"]
    rows = recipe["candidates"]
    assert sum(r["chosen"] for r in rows) == 1 and sum(r["sequential"] for r in rows) == 1
    assert len(rows) >= 2 and all(r["chunks"] == 1 and r["measured_s"] > 0 for r in rows)
    # CartPole's iterations take milliseconds: each plan is timed as calibration measures one
    # (--quick: one round; the full sweep interleaves two, each a part of the seconds)
    assert out["settings"]["rounds"] == 1 and all(r["measured_rounds_n"] == [len(r["measured_all_s"])] for r in rows)
    assert all(measured_as_quick_measures(r["measured_all_s"], at_least=1) for r in rows)
    assert all(r["measured_rounds_s"] == [pytest.approx(r["measured_full_s"])] for r in rows)
    assert len(recipe["summary"]["chosen_over_best_rounds"]) == 1
    assert len({r["plan"] + str(r["train_microbatch"]) for r in rows}) == len(rows)
    summary = recipe["summary"]
    # calibration ran as in a run of the recipe: the choice is a plan it measured, priced by what it measured
    chosen = next(r for r in rows if r["chosen"])
    assert summary["calibration_iterations"] >= 2 and chosen["calibrated"]
    assert chosen["predicted_s"] != chosen["profiled_s"]
    # ... and the run went on under the plan it settled on: its own iterations, timed as a plan is,
    # against the prediction it logged for each (full iterations here: the settled prediction)
    own = summary["run_measured_all_s"]
    assert measured_as_quick_measures(own, at_least=1)
    assert summary["run_measured_s"] == pytest.approx(statistics.median(own))
    assert summary["run_predicted_s"] == pytest.approx(chosen["predicted_s"])
    assert summary["run_error"] == pytest.approx(statistics.median((summary["run_predicted_s"] - t) / t for t in own))
    # every candidate was measured on the policy the run had reached (its trainer state), not a fresh one
    assert summary["run_policy_version"] >= summary["calibration_iterations"]
    assert all(r["policy_versions"] == [summary["run_policy_version"]] for r in rows)
    # CartPole PPO iterations are full ones: per full iteration is as measured
    assert all(r["measured_full_s"] == pytest.approx(r["measured_s"]) for r in rows)
    assert summary["best_full_s"] == min(r["measured_full_s"] for r in rows)
    assert summary["chosen_over_best"] >= 1.0
    # the host's speed timed beside calibration and every measurement
    assert summary["calibration_host_reference_s"] > 0 and all(r["host_reference_s"] > 0 and r["host_drift"] > 0 for r in rows)
    assert all(r["host_steal"] is None or 0 <= r["host_steal"] <= 1 for r in rows)
    assert all(r["measured_rse"] >= 0 for r in rows if len(r["measured_all_s"]) > 1)
    # where each plan's iteration went: collection and the update, each within the iteration
    for r in rows:
        parts = r["measured_parts_s"]
        assert 0 < parts["rollout_s"] < r["measured_s"] and 0 < parts["train_s"] < r["measured_s"], parts
    saved = json.loads((tmp_path / "m2flow_sweep_quick.json").read_text())
    assert saved["table_md"].count("\n") == 2 and "(%+.1f%%)" % (100 * summary["run_error"]) in saved["table_md"] and (tmp_path / "m2flow_sweep_quick.png").stat().st_size > 0


def test_each_mode_gets_its_recipes_overrides_and_result_name(monkeypatch, tmp_path):
    """Positional words with ``=`` are overrides, the others recipes; each mode writes
    ``m2flow_sweep[_<mode>][_<name>].json``; an option of another mode is an error."""
    from benchmarks.m2flow_sweep import learning, trace

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    calls: list[tuple] = []
    monkeypatch.setattr(sweep, "run", lambda args, argv: calls.append(("sweep", args, args.recipes)) or {})
    monkeypatch.setattr(trace, "run", lambda args, argv, recipe, overrides: calls.append(("trace", args, recipe)) or {})
    monkeypatch.setattr(learning, "run", lambda args, argv, recipe, overrides: calls.append(("learning", args, recipe)) or {})

    m2flow_sweep.main(["cartpole_ppo", "--trace", "plan.max_chunks=2", "--runs", "3", "--settled-s", "16"])
    mode, args, recipe = calls[-1]
    assert (mode, recipe, args.overrides, args.runs, args.settled_s) == ("trace", "cartpole_ppo", ["plan.max_chunks=2"], 3, 16.0)
    assert common.result_path("m2flow_sweep", args, "trace") == tmp_path / "m2flow_sweep_trace.json"
    m2flow_sweep.main(["--learning", "--name", "epyc"])
    mode, args, recipe = calls[-1]
    assert (mode, recipe) == ("learning", learning.DEFAULT_RECIPE)
    assert common.result_path("m2flow_sweep", args, "learning") == tmp_path / "m2flow_sweep_learning_epyc.json"
    m2flow_sweep.main(["cartpole_ppo", "algo.epochs=1", "halfcheetah_ppo", "--rounds", "3"])
    mode, args, recipes = calls[-1]
    assert (mode, recipes, args.overrides, args.rounds) == ("sweep", ["cartpole_ppo", "halfcheetah_ppo"], ["algo.epochs=1"], 3)
    assert common.result_path("m2flow_sweep", args) == tmp_path / "m2flow_sweep.json"
    out = tmp_path / "elsewhere" / "sweep.json"
    m2flow_sweep.main(["--quick", "--out", str(out)])
    assert common.result_path("m2flow_sweep", calls[-1][1], "quick") == out
    n = len(calls)
    for wrong in (["--trace"], ["a", "b", "--trace"], ["cartpole_ppo", "--runs", "2"], ["--learning", "--quick"],
                  ["a", "--trace", "--learning"], ["--rounds", "0"]):
        with pytest.raises(SystemExit) as exit_:
            m2flow_sweep.main(wrong)
        assert exit_.value.code == 2, wrong
    assert len(calls) == n
