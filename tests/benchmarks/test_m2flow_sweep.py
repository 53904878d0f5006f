"""The M2Flow sweep benchmark measures what it claims: every candidate (and the sequential plan)
under exactly that plan, the choice against the measured best, the share of the gap to the bound."""

from __future__ import annotations

import json

import pytest

import benchmarks.common as common
import benchmarks.m2flow_sweep as sweep
from pipelines.calibrate import iterations_for
from scheduler import Plan, PlanResult, Timeline


def iterations_for_row(row: dict) -> int:
    return iterations_for(row["predicted_s"])


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


def test_table_reports_choice_vs_best_and_the_gap_captured():
    rows = [
        {"plan": "colocated 1ch", "predicted_s": 2.0, "measured_s": 2.0, "error": 0.0, "chosen": False, "sequential": True},
        {"plan": "hybrid 2ch", "predicted_s": 1.5, "measured_s": 1.6, "error": -0.0625, "chosen": True, "sequential": False},
        {"plan": "hybrid 3ch", "predicted_s": 1.6, "measured_s": 1.5, "error": 0.0667, "chosen": False, "sequential": False},
    ]
    summary = {"chosen": "hybrid 2ch", "best": "hybrid 3ch", "chosen_measured_s": 1.6, "best_measured_s": 1.5,
               "chosen_over_best": 1.6 / 1.5, "chosen_error": -0.0625, "max_abs_error": 0.0667,
               "first_choice": "colocated 1ch", "first_choice_profiled_error": -0.25, "calibration_iterations": 6,
               "sequential_measured_s": 2.0, "speedup_vs_sequential": 1.25, "bound_s": 1.2, "gap_captured": 0.5}
    md = sweep.table([{"label": "toy", "candidates": rows, "summary": summary}])
    assert md.splitlines()[-1] == ("| toy | hybrid 2ch | 1.500 | 1.600 | -6.2% | colocated 1ch (-25.0%) | 1.500 (hybrid 3ch) "
                                   "| +6.7% | 2.000 | 1.200 | 50% | 6 |")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_sweep_measures_every_candidate_of_a_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(sweep, "RESULTS", tmp_path)
    # one chunk at most: the placements of the table (colocated, hybrid, disaggregated), each built
    # and run once (the whole sweep's path, in ~1 min on 2 quiet cores)
    out = sweep.main(["--quick", "--recipes", "cartpole_ppo", "--warmup", "0", "--max-chunks", "1", "algo.rollout_steps=8"])
    (recipe,) = out["recipes"]
    rows = recipe["candidates"]
    assert sum(r["chosen"] for r in rows) == 1 and sum(r["sequential"] for r in rows) == 1
    assert len(rows) >= 2 and all(r["chunks"] == 1 and r["measured_s"] > 0 for r in rows)
    # CartPole's iterations take milliseconds: each plan is timed as often as calibration measures one
    assert all(len(r["measured_all_s"]) == iterations_for_row(r) for r in rows)
    assert len({r["plan"] + str(r["train_microbatch"]) for r in rows}) == len(rows)
    summary = recipe["summary"]
    # calibration ran as in a run of the recipe: the choice is a plan it measured, priced by what it measured
    chosen = next(r for r in rows if r["chosen"])
    assert summary["calibration_iterations"] >= 2 and chosen["calibrated"]
    assert chosen["predicted_s"] != chosen["profiled_s"]
    assert summary["best_measured_s"] == min(r["measured_s"] for r in rows)
    assert summary["chosen_over_best"] >= 1.0
    saved = json.loads((tmp_path / "m2flow_sweep_quick.json").read_text())
    assert saved["table_md"].count("\n") == 2 and (tmp_path / "m2flow_sweep_quick.png").stat().st_size > 0
