"""Fixtures of the fault-injection suite: ``start(run_dir, *args)`` starts `embodied train` and
cleans up after the test whatever it asserted."""

from __future__ import annotations

import pytest

from tests.faults.harness import Run


@pytest.fixture
def start(tmp_path):
    runs: list[Run] = []

    def _start(run_dir, *args: str) -> Run:
        run = Run(run_dir, *args, tmp=tmp_path)
        runs.append(run)
        return run

    yield _start
    for run in runs:
        run.close()
