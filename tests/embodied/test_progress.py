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


def test_lines_never_pass_100_percent_and_show_the_mean_rate_summary_json_reports(caplog):
    """The last iteration passes the budget (2,048 of 2,000): the line shows what the run did as
    its total; the rate is the mean of the iterations' perf/env_steps_per_s, those before a
    resume included (as summary.json's)."""
    caplog.set_level(logging.INFO, logger="embodied.progress")
    progress = Progress(2000, mode="lines", log_every_s=0.0, start_steps=512, rate_key="perf/env_steps_per_s",
                        rates=[600.0])
    progress.update(1024, {"perf/env_steps_per_s": 100.0})
    progress.update(2048, {"perf/env_steps_per_s": 200.0})
    progress.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "embodied.progress"]
    assert lines[0].startswith("[train] 1,024/2,000 steps (51%) | 350 steps/s")
    assert lines[1].startswith("[train] 2,048/2,048 steps (100%) | 300 steps/s"), lines[1]
