"""Plain progress lines (what a run logs when stdout is not a terminal)."""

from __future__ import annotations

import logging
import re

from embodied.progress import Progress


def test_lines_report_steps_rate_and_a_non_negative_eta(caplog):
    caplog.set_level(logging.INFO, logger="embodied.progress")
    progress = Progress(1000, mode="lines", log_every_s=0.0)
    progress.update(400, {"train/episode_return": 1.5, "train/success_rate": 0.25})
    progress.update(1200, {}, force=True)  # past the total: never a negative ETA
    progress.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "embodied.progress"]
    assert lines[0].startswith("[train] 400/1,000 steps (40%)") and "return 1.5" in lines[0] and "success 0.25" in lines[0]
    etas = [float(re.search(r"ETA (-?\d+)s", line).group(1)) for line in lines]
    assert all(eta >= 0 for eta in etas) and etas[-1] == 0


def test_lines_name_the_workflows_unit_and_headline_metrics(caplog):
    caplog.set_level(logging.INFO, logger="embodied.progress")
    progress = Progress(64, mode="lines", log_every_s=0.0, unit="prompts",
                        shown=(("reward", "reward/mean"), ("acc", "reward/acc")))
    progress.update(32, {"reward/mean": 0.40625})
    progress.close()
    [line] = [r.getMessage() for r in caplog.records if r.name == "embodied.progress"]
    assert line.startswith("[train] 32/64 prompts (50%)") and "prompts/s" in line
    assert "reward 0.406 | acc -" in line and "return" not in line
