"""A GRPO iteration whose groups all have equal rewards says so on the driver's terminal (the
trainer's own warning reaches only its log on Ray)."""

from __future__ import annotations

import logging
from typing import Any

from pipelines.rundir import RunDir
from pipelines.runner import Runner
from tests.pipelines.test_workflow_contract import CountWorkflow, count_config


class FlatRewards(CountWorkflow):
    """Every iteration's groups have no reward spread until the last one."""

    def iterate(self, iteration: int, lr: float, last: bool) -> dict[str, Any]:
        metrics = super().iterate(iteration, lr, last)
        return {**metrics, "grpo/frac_reward_zero_std": 0.5 if last else 1.0}


def test_an_iteration_without_reward_spread_is_warned_about_once(tmp_path, caplog):
    cfg = count_config(tmp_path)
    cfg.total = 40  # four iterations: three without spread, then one with
    with caplog.at_level(logging.WARNING, logger="embodied"), RunDir.create(cfg) as run:
        Runner(cfg, run, FlatRewards(cfg)).run()
    warnings = [r.getMessage() for r in caplog.records if "no learning signal" in r.getMessage()]
    assert len(warnings) == 1, warnings  # the first time, then at most once per 50 iterations
    assert warnings[0].startswith("[grpo] no learning signal: all the groups of iteration 1 have equal rewards")
    assert "algo.group_size" in warnings[0]


def test_an_iteration_with_reward_spread_is_not_warned_about(tmp_path, caplog):
    cfg = count_config(tmp_path)
    with caplog.at_level(logging.WARNING, logger="embodied"), RunDir.create(cfg) as run:
        Runner(cfg, run, CountWorkflow(cfg)).run()
    assert not [r for r in caplog.records if "no learning signal" in r.getMessage()]
