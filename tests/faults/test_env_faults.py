"""The user's env fails: it raises, returns NaN/inf, or hangs, mid-run or while being profiled.

Each case trains CartPole through `python -m pipelines.cli train` with the fault injected into
env index 1 (``fault_seed=1``); each must end with ONE paragraph naming the env, its index and
seed (and where it ran), the documented exit code, no traceback on the terminal, and no process
of the run left running."""

from __future__ import annotations

import math

import pytest

from tests.faults.harness import FAULTY_ENV, TINY, assert_every_iteration_once

pytestmark = pytest.mark.slow

ENV = f"env {FAULTY_ENV} (env index 1, seed 1)"


def injected(start, tmp_path, fault: str, *extra: str, mid_run: bool = True, env_index: int = 1):
    """A run whose env ``env_index`` gets ``fault``: once 2 iterations are logged (``mid_run``),
    or from the start (then during profiling)."""
    run_dir, trigger = tmp_path / "run", tmp_path / "fault-now"
    kwargs = [f"env.kwargs.fault={fault}", f"env.kwargs.fault_seed={env_index}"]
    if mid_run:
        kwargs.append(f"env.kwargs.trigger={trigger}")
    run = start(run_dir, *TINY, f"run.dir={run_dir}", "algo.total_env_steps=100000", "checkpoint.every=1", *kwargs, *extra)
    if mid_run:
        run.wait_rows(2)
        trigger.touch()
    return run


def assert_clean_end(run, code: int) -> str:
    """The exit code, one paragraph and no traceback on the terminal, nothing left running."""
    assert run.finish() == code, run.stderr
    assert "Traceback" not in run.terminal, run.terminal
    assert run.leftovers() == []
    return run.paragraph()


@pytest.mark.parametrize("backend", ["inprocess", "multiprocess"])
def test_an_env_that_raises_mid_run_is_named(start, tmp_path, backend):
    run = injected(start, tmp_path, "raise_step", f"env.backend={backend}", "env.num_procs=2")
    text = assert_clean_end(run, 3)
    assert text.startswith(f"embodied: error: The env failed (exit code 3): {ENV} raised RuntimeError: the simulator's "
                           "solver diverged while stepping (step()). This is a failure of the env, not of Embodied or the "
                           "policy"), text
    assert "worker group env, rank 0" in text and "It happened while running iteration" in text
    if backend == "multiprocess":  # the env process hosting envs 0..1 and its own log
        assert "env process 0" in text and "logs/env-0-shard" in text
    assert_every_iteration_once(tmp_path / "run")  # what was logged before the failure, once


def test_an_env_whose_reset_raises_while_profiled_is_named(start, tmp_path):
    run = injected(start, tmp_path, "raise_reset", "plan.profile=true", "plan.reprofile=true", mid_run=False)
    text = assert_clean_end(run, 3)
    assert text.startswith(f"embodied: error: The env failed (exit code 3): {ENV} raised RuntimeError: the simulator "
                           "could not load its scene while resetting (reset())."), text
    assert "worker group profile-env" in text and "It happened while profiling and planning" in text


@pytest.mark.parametrize("fault, backend, what", [
    ("nan_obs", "inprocess", "its observation 'state' holds NaN"),
    ("inf_reward", "multiprocess", "its reward holds +inf"),
])
def test_nan_or_inf_from_the_env_is_the_envs_error_not_the_policys(start, tmp_path, fault, backend, what):
    """The env worker steps its 4 envs in 2 chunks: env 3 is env 1 of the second chunk, and the
    message names it as env index 3. The inprocess case (the envs inside the env worker) runs on
    the local backend, the workers as threads of the driver: the check is in the env chunks, not in
    Ray; the multiprocess case and the other tests here fail through Ray workers."""
    local = ["cluster.backend=local"] if backend == "inprocess" else []
    run = injected(start, tmp_path, fault, f"env.backend={backend}", "env.num_procs=1", "plan.chunks=2", *local,
                   env_index=3)
    text = assert_clean_end(run, 3)
    env = f"env {FAULTY_ENV} (env index 3, seed 3)"
    assert text.startswith(f"embodied: error: The env failed (exit code 3): {env} returned NaN/inf at step 5 of its "
                           f"episode: {what}."), text
    assert "env.nonfinite=drop ends such episodes instead" in text
    assert "logits" not in run.terminal and "invalid values" not in run.terminal


def test_nan_with_drop_ends_the_episode_and_training_goes_on(start, tmp_path):
    """env.nonfinite=drop: env 1's episodes end at their 5th step with NaN; the run completes,
    counts them, warns, and the learner sees only finite numbers. On the local backend (the workers
    in the driver): what is checked is what the env chunks and the learner do, not Ray."""
    run = start(tmp_path / "run", *TINY, f"run.dir={tmp_path / 'run'}", "algo.total_env_steps=1024",
                "env.kwargs.fault=nan_obs", "env.kwargs.fault_seed=1", "env.nonfinite=drop", "cluster.backend=local")
    assert run.finish() == 0, run.stderr
    assert "Traceback" not in run.terminal
    assert "episode(s) ended on NaN/inf from the env" in run.stderr and "(env.nonfinite=drop)" in run.stderr
    rows = assert_every_iteration_once(tmp_path / "run")
    dropped = sum(r["env/nonfinite_episodes"] for r in rows)
    # env 1 runs 32 steps per iteration and every episode of it is dropped at its 5th step
    assert dropped >= len(rows) * (32 // 5), dropped
    for r in rows:
        for key in ("losses/value", "losses/policy", "losses/explained_variance"):
            if key in r:
                assert r[key] is not None and math.isfinite(r[key]), (key, r)
    # the dropped steps do not count: every iteration took 128 steps minus its dropped ones
    steps = [b["env_steps"] - a["env_steps"] for a, b in zip([{"env_steps": 0}, *rows], rows)]
    assert steps == [128 - r["env/nonfinite_episodes"] for r in rows]
    assert run.leftovers() == []


def test_an_env_process_that_hangs_times_out_naming_env_timeout_s(start, tmp_path):
    run = injected(start, tmp_path, "hang_step", "env.backend=multiprocess", "env.num_procs=2", "env.timeout_s=3")
    text = assert_clean_end(run, 5)
    assert text.startswith("embodied: error: Timed out (exit code 5): env process 0 (envs 0..1, seeds 0..1) did not "
                           "answer 'step' within 3 s (env.timeout_s): an env's step may hang"), text
    log = text.split("Its Python stack is at the end of ", 1)[1].split(". ", 1)[0]
    stack = open(log).read()
    assert "faulty_env.py" in stack and "in step" in stack, stack[-2000:]


def test_an_env_that_hangs_in_an_env_worker_times_out_naming_cluster_timeout_s(start, tmp_path):
    run = injected(start, tmp_path, "hang_step", "env.backend=inprocess", "cluster.timeout_s=5")
    text = assert_clean_end(run, 5)
    assert text.startswith("embodied: error: Timed out (exit code 5): "), text
    assert "no answer within 5 s (cluster.timeout_s)" in text and "Worker group env is stuck or dead" in text, text


def test_an_env_that_hangs_while_profiled_times_out(start, tmp_path):
    run = injected(start, tmp_path, "hang_reset", "plan.profile=true", "plan.reprofile=true", "cluster.timeout_s=8",
                   mid_run=False)
    text = assert_clean_end(run, 5)
    assert text.startswith(f"embodied: error: Timed out (exit code 5): measure() failed: profiling env {FAULTY_ENV}: "
                           "the env probe (build 2 env(s) in 1 process(es) on 1 core(s), reset with seed 0, 11 steps) "
                           "got no answer within 8 s (cluster.timeout_s)"), text
    assert "It happened while profiling and planning" in text
