"""Processes die or are told to stop: kill -9 of every kind of worker and of the CLI itself,
Ctrl-C (SIGINT to the process group) and SIGTERM, a second Ctrl-C. Nothing of the run may keep
running, nothing logged may be lost or doubled, and ``resume=`` continues."""

from __future__ import annotations

import json
import signal
import time

import pytest

from embodied.checkpoint import iteration_of, latest_checkpoint
from tests.faults.harness import TINY, assert_every_iteration_once, read_rows

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

#: The env of these runs steps in 2 env processes, so every kind of process exists.
LONG = [*TINY, "env.backend=multiprocess", "env.num_procs=2", "checkpoint.every=1", "algo.total_env_steps=100000"]


def resume_and_finish(start, run_dir, steps_after: int = 256) -> list[dict]:
    """``resume=RUN`` to a budget a little past what was logged; every iteration once after."""
    total = (read_rows(run_dir) or [{"env_steps": 0}])[-1]["env_steps"] + steps_after
    run = start(run_dir, f"resume={run_dir}", f"algo.total_env_steps={total}")
    assert run.finish() == 0, run.stderr
    assert "resumed from" in run.stderr and "Traceback" not in run.terminal
    assert run.leftovers() == []
    return assert_every_iteration_once(run_dir)


def test_kill_9_of_each_kind_of_process_then_resume(start, tmp_path):
    """Kill, in turn, a Ray worker (the env worker) and one of its env processes (not a Ray
    process), each mid-run (resuming in between): each ends the run with exit 3 and a paragraph
    naming the group and the death, leaves no process behind and loses no logged iteration (the
    rollout and trainer workers are Ray workers too, their deaths noticed by the same path: a
    killed trainer is test_rank_faults, which kills rank 1 of two and resumes on one and on two
    ranks).
    Then kill -9 of the driver: the watchdog stops Ray's processes, the workers and the env
    processes within seconds (Ray's agents alone would linger for about a minute); the run dir's
    lock died with the driver, so resume= continues. While it ran, every listening TCP socket of
    the run was on loopback."""
    run_dir = tmp_path / "run"
    died = "failed: the worker process died (Worker unexpectedly exits with a connection error code 2"
    victims = [  # the call that notices (interact, generate, load_weights, train, ...) depends on timing
        ("ray::EnvWorker", "A worker failed (exit code 3): ", [died, "worker group env"]),
        ("embodied::env-0-shard", "The env failed (exit code 3): env process", ["killed by signal 9", "worker group env"]),
    ]
    for i, (name, headline, needles) in enumerate(victims):
        args = [*LONG, f"run.dir={run_dir}"] if i == 0 else [f"resume={run_dir}"]
        run = start(run_dir, *args)
        run.wait_rows(len(read_rows(run_dir)) + 2)
        run.kill(run.find(name))
        assert run.finish() == 3, run.stderr
        text = run.paragraph()
        assert text.startswith(f"embodied: error: {headline}"), text
        assert all(n in text for n in needles) and f"Resume with `embodied train resume={run_dir}`" in text, text
        assert "Traceback" not in run.terminal
        assert run.leftovers() == [], name
        assert_every_iteration_once(run_dir)

    run = start(run_dir, f"resume={run_dir}")
    run.wait_rows(len(read_rows(run_dir)) + 2)
    run.record_listening()
    assert run.listening, "no listening socket seen: can psutil see them?"
    assert all(ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for _, ip in run.listening), run.listening
    names = {name for _, name in run.seen.values()}
    assert {"gcs_server", "raylet", "ray::EnvWorker", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
    t0 = time.monotonic()
    run.kill()
    assert run.finish() == -signal.SIGKILL
    assert run.leftovers(within_s=15) == []
    seconds = time.monotonic() - t0
    print(f"kill -9 of the CLI: every process of the run gone after {seconds:.1f} s")
    assert seconds < 15
    rows = resume_and_finish(start, run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["iterations"] == len(rows)


def test_sigint_then_sigterm_stop_after_the_iteration_with_a_checkpoint(start, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it), then, on the resumed
    run, SIGTERM to the driver: each time the run finishes its iteration, saves a checkpoint and
    summary.json, stops everything and exits 130 / 143; resume= continues from that iteration
    (the SIGTERM run is the resume of the SIGINT one, every iteration logged once across both)."""
    run_dir = tmp_path / "run"
    for i, (sig, code, to_group) in enumerate([(signal.SIGINT, 130, True), (signal.SIGTERM, 143, False)]):
        run = start(run_dir, *LONG, f"run.dir={run_dir}") if i == 0 else start(run_dir, f"resume={run_dir}")
        run.wait_rows(len(read_rows(run_dir)) + 2)
        run.signal_group(sig) if to_group else run.kill(sig=sig)
        assert run.finish() == code, run.stderr
        name = signal.Signals(sig).name
        assert f"{name}: stopping after the current iteration" in run.stderr
        assert "Traceback" not in run.terminal
        if i > 0:
            assert "resumed from" in run.stderr
        rows = assert_every_iteration_once(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["interrupted"] == name and summary["iterations"] == len(rows)
        assert iteration_of(latest_checkpoint(run_dir)) == len(rows)  # nothing after the checkpoint to lose
        assert run.leftovers() == []


def test_a_second_ctrl_c_aborts_at_once(start, tmp_path):
    """Iterations of ~10 s (a slow env): after the first Ctrl-C the run would finish its
    iteration; a second one aborts within seconds, without a summary, leaving nothing running."""
    run_dir = tmp_path / "run"
    run = start(run_dir, *TINY, f"run.dir={run_dir}", "algo.total_env_steps=100000", "env.kwargs.delay_s=0.08")
    run.wait_for("[train]")  # the first iteration runs
    run.signal_group(signal.SIGINT)
    run.wait_for("SIGINT: stopping after the current iteration")
    t0 = time.monotonic()
    run.signal_group(signal.SIGINT)
    assert run.finish() == 130, run.stderr
    assert time.monotonic() - t0 < 8, "the second Ctrl-C did not abort at once"
    assert not (run_dir / "summary.json").exists()
    assert "Interrupted (exit code 130)" in run.paragraph() and "Traceback" not in run.terminal
    assert run.leftovers() == []
