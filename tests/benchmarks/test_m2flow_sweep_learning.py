"""The M2Flow sweep's ``--learning``: the prediction a run of the default job settles on, judged on
the run's iterations after its warm-up and calibration."""

from __future__ import annotations

import pytest

from benchmarks.m2flow_sweep import learning


def _row(took: float, mode: str, chunks: int, predicted: float, ratio: float | None = None, calibrating: bool = False) -> dict:
    return {"time/iteration_s": took, "plan/mode": mode, "plan/chunks": chunks, "plan/predicted_iteration_s": predicted,
            "plan/measured_over_predicted": ratio, "plan/calibrating": calibrating}


def test_the_settled_prediction_is_judged_after_the_warm_up_and_calibration():
    rows = [_row(3.0, "hybrid", 2, 0.8),  # the warm-up: the probes' first choice
            _row(0.9, "hybrid", 2, 0.8, 0.9 / 0.8, calibrating=True), _row(1.0, "streams", 4, 1.0, 1.0, calibrating=True),
            *[_row(t, "streams", 4, 1.1, t / 1.1) for t in (1.0, 1.2, 1.0)]]
    output = "step 1\n[m2flow] calibrated: streams 4ch\nstep 2"
    r = learning.summarize(rows, output)
    assert r["plan"] == "streams, 4 chunk(s)" and r["predicted_s"] == 1.1 and r["measured_s"] == 1.0
    assert r["error"] == pytest.approx(0.1) and r["measured_all_s"] == [3.0, 0.9, 1.0, 1.0, 1.2, 1.0]
    assert r["first_choice"] == "hybrid, 2 chunk(s)" and r["profiled_predicted_s"] == 0.8
    assert r["calibration_iterations"] == 2 and r["m2flow_lines"] == ["[m2flow] calibrated: streams 4ch"]
    with pytest.raises(RuntimeError, match="raise --iterations"):
        learning.summarize(rows[:3], output)  # calibration took every iteration after the warm-up
