"""Faults at scale: a data-parallel trainer rank is killed mid-run. The run stops within the
configured timeout (no rank waits forever in a collective) with exit 3 and a paragraph naming
the group, the rank and its node; nothing keeps running; ``resume=`` continues on another
number of ranks, and on the same number."""

from __future__ import annotations

import json
import time

import pytest

from tests.faults.harness import TINY, assert_every_iteration_once, read_rows

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

#: Every collective of the trainer ranks (gloo) and every wait is bounded by this.
TIMEOUT_S = 30
RANKS = [*TINY, "workers.trainer=2", "workers.trainer_cpus=0.25", "checkpoint.every=1", "algo.total_env_steps=100000",
         f"cluster.timeout_s={TIMEOUT_S}"]


def test_a_killed_trainer_rank_stops_the_run_naming_it_then_resume_on_one_and_two_ranks(start, tmp_path):
    run_dir = tmp_path / "run"
    run = start(run_dir, *RANKS, f"run.dir={run_dir}")
    run.wait_rows(2)
    run.record_listening()  # the ranks' rendezvous store and gloo listen on loopback only, as Ray does
    assert run.listening and all(ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for _, ip in run.listening), run.listening
    workers = json.loads((run_dir / "plan.json").read_text())["workers"]["trainer"]
    victim = workers[1]
    assert victim["rank"] == 1 and victim["pid"] != workers[0]["pid"]
    run.kill(next(p for p in run.tree() if p.pid == victim["pid"]))
    t0 = time.monotonic()
    assert run.finish() == 3, run.stderr
    seconds = time.monotonic() - t0
    print(f"trainer rank 1 killed: the run ended {seconds:.1f} s later")
    assert seconds < TIMEOUT_S, "a rank waited for its dead peer past the timeout"
    text = run.paragraph()
    assert text.startswith("embodied: error: A worker failed (exit code 3): "), text
    assert "the worker process died" in text, text
    assert f"worker group trainer, rank 1, node {victim['host']}, pid {victim['pid']}" in text, text
    assert f"Resume with `embodied train resume={run_dir}`" in text and "Traceback" not in run.terminal
    assert run.leftovers() == []
    before = assert_every_iteration_once(run_dir)

    # the same run continues on one rank, then on two again
    for ranks, more in ((1, 2), (2, 2)):
        total = read_rows(run_dir)[-1]["env_steps"] + more * 128
        resumed = start(run_dir, f"resume={run_dir}", f"workers.trainer={ranks}", f"algo.total_env_steps={total}")
        assert resumed.finish() == 0, resumed.stderr
        assert "resumed from" in resumed.stderr and "Traceback" not in resumed.terminal
        assert resumed.leftovers() == []
    rows = assert_every_iteration_once(run_dir)
    assert len(rows) == len(before) + 4
    versions = [r["weights/version"] for r in rows]
    assert versions == list(range(len(rows))), versions  # the weights carried on through both resumes
