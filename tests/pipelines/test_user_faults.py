"""What a user runs into at the terminal, through the real `embodied` CLI (a subprocess): a closed
pipe, a mistyped key, an env package that is not importable, resuming a finished run or one that
failed before its first checkpoint, a run dir with spaces, and the terminal closing (SIGHUP) or
two quick Ctrl-Cs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.harness import TINY, Run, assert_every_iteration_once, cli_env

ROOT = Path(__file__).resolve().parents[2]
#: A short CartPole run: 16 iterations of 128 env steps, the workers as threads of the CLI.
SHORT = ["cartpole_ppo", "algo.total_env_steps=2048", "plan.profile=false", "cluster.backend=local",
         "logging.wandb=false", "eval.episodes=2"]


def embodied(*args: str, timeout: int = 300, cwd: Path = ROOT, pythonpath: str = str(ROOT)) -> subprocess.CompletedProcess:
    """`embodied ARGS` as a user runs it, from ``cwd``: like the `embodied` console script, without
    the current directory on ``sys.path`` (``-P``; ``python -m`` would put it there)."""
    env = {**cli_env(), "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-P", "-m", "pipelines.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture
def start(tmp_path):
    """``start(run_dir, *args)``: `embodied train` watched by the fault suite's harness, cleaned up after."""
    runs: list[Run] = []

    def _start(run_dir: Path, *args: str) -> Run:
        runs.append(Run(run_dir, *args, tmp=tmp_path))
        return runs[-1]

    yield _start
    for run in runs:
        run.close()


def error_logs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("embodied-error-*.log"))


# --- 1. a closed pipe ----------------------------------------------------------------------------
def test_config_into_a_pipe_closed_by_its_reader_ends_quietly_with_141(tmp_path):
    """`embodied config RECIPE | head`: the reader goes away before the output is written. The
    command ends as a program the shell's SIGPIPE ended (128 + 13), with nothing on stderr and no
    error log written."""
    env = {**cli_env(), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "config", "cartpole_ppo"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone (head read its lines and exited)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""
    assert error_logs(tmp_path) == []


# --- 2. a mistyped key ---------------------------------------------------------------------------
@pytest.mark.parametrize("key, suggestion", [
    ("algo.learning_rate", "'algo.lr'"),       # another framework's name for it
    ("algo.total_timesteps", "'algo.total_env_steps'"),
    ("algo.clip_range", "'algo.clip_ratio'"),
    ("env.n_envs", "'env.num_envs'"),
])
def test_a_key_from_another_framework_suggests_ours(tmp_path, key, suggestion):
    result = embodied("train", "cartpole_ppo", f"{key}=1", f"run.dir={tmp_path / 'never'}")
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    assert f"Unknown config key '{key}'. Did you mean {suggestion}?" in text, text
    assert not (tmp_path / "never").exists()


def test_key_suggestions_match_synonyms_initials_and_word_parts():
    from embodied.config import all_keys
    from embodied.errors import closest_keys
    from pipelines.config import EmbodiedConfig

    keys = all_keys(EmbodiedConfig)
    assert closest_keys("algo.learning_rate", keys) == ["algo.lr"]
    assert closest_keys("algo.LR", keys) == ["algo.lr"]
    assert closest_keys("algo.ent_coef", keys) == ["algo.entropy_coeff"]
    assert closest_keys("algo.lambda", keys) == ["algo.gae_lambda"]
    assert closest_keys("algo.clip", keys)[0] == "algo.clip_ratio"
    assert closest_keys("algo.lrr", keys)[0] == "algo.lr"  # spelled alike, as before
    assert closest_keys("seeed", keys) == ["seed"]


# --- 3. an env package that is not importable ----------------------------------------------------
@pytest.mark.slow
def test_an_env_module_off_the_python_path_says_to_put_its_folder_on_pythonpath(tmp_path):
    """`env.id=mypkg.envs:MyEnv` run from the folder holding mypkg/: the `embodied` command does
    not search the current directory, so the message names the module, the directory and the
    PYTHONPATH that works (or installing it)."""
    project = tmp_path / "my project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "envs.py").write_text(
        "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n\nclass MyEnv(CartPoleEnv):\n    pass\n")
    result = embodied("train", "cartpole_ppo", "env.id=mypkg.envs:MyEnv", f"run.dir={tmp_path / 'never'}",
                      cwd=project)
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    assert "cannot import module 'mypkg.envs'" in text and "no module named 'mypkg'" in text, text
    assert f"the current directory {project}" in text and f"`PYTHONPATH='{project}' embodied train ...`" in text, text
    assert "pip install -e ." in text
    elsewhere = embodied("train", "cartpole_ppo", "env.id=mypkg.envs:MyEnv", f"run.dir={tmp_path / 'never'}",
                         cwd=tmp_path)
    text = " ".join(elsewhere.stderr.split())
    assert elsewhere.returncode == 2 and f"the current directory is {tmp_path}" in text and "PYTHONPATH" in text, text
    # the advice works: with its folder on PYTHONPATH the env trains
    run = tmp_path / "run"
    found = embodied("train", *[a for a in SHORT if "total_env_steps" not in a], "algo.total_env_steps=256",
                     "env.id=mypkg.envs:MyEnv", f"run.dir={run}", cwd=project,
                     pythonpath=os.pathsep.join([str(project), str(ROOT)]))
    assert found.returncode == 0, found.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["env_steps"] == 256


# --- 5. resume of a finished run -----------------------------------------------------------------
@pytest.mark.slow
def test_resuming_a_finished_run_says_so_and_leaves_its_summary(tmp_path):
    run = tmp_path / "run"
    first = embodied("train", *SHORT, f"run.dir={run}")
    assert first.returncode == 0, first.stderr[-3000:]
    summary = (run / "summary.json").read_bytes()
    files = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert json.loads(summary)["train/episode_return"] is not None
    for budget in ([], ["algo.total_env_steps=1024"]):  # the same budget; a smaller one
        again = embodied("train", f"resume={run}", *budget)
        assert again.returncode == 0, again.stderr
        lines = [line for line in again.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, again.stderr
        assert f"{run} is finished: it trained 2,048 env steps" in lines[0], lines[0]
        assert f"`embodied train resume={run} algo.total_env_steps=4096`" in lines[0], lines[0]
        assert (run / "summary.json").read_bytes() == summary
        assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == files  # nothing written
    longer = embodied("train", f"resume={run}", "algo.total_env_steps=2560")
    assert longer.returncode == 0, longer.stderr[-3000:]
    after = json.loads((run / "summary.json").read_text())
    assert after["env_steps"] == 2560 and after["train/episode_return"] is not None


# --- 4. the progress line ------------------------------------------------------------------------
@pytest.mark.slow
def test_progress_lines_stay_within_100_percent_and_show_the_summarys_rate(tmp_path):
    """A budget that is not a whole number of iterations (2,000 of 128-step iterations: the run
    does 2,048): no line shows more than 100% or a count above its total, and the last line's
    steps/s is summary.json's perf/env_steps_per_s."""
    run = tmp_path / "run"
    result = embodied("train", *[a for a in SHORT if "total_env_steps" not in a], "algo.total_env_steps=2000",
                      "run.log_every_s=0.001", f"run.dir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    import re

    lines = re.findall(r"\[train\] ([\d,]+)/([\d,]+) steps \((\d+)%\) \| ([\d,]+) steps/s", result.stderr)
    assert lines, result.stderr
    for done, total, pct, _ in lines:
        assert int(done.replace(",", "")) <= int(total.replace(",", "")) and int(pct) <= 100, lines
    assert lines[-1][:3] == ("2,048", "2,048", "100")
    summary = json.loads((run / "summary.json").read_text())
    assert lines[-1][3] == f"{summary['perf/env_steps_per_s']:,.0f}", (lines[-1], summary)


# --- 7 and 9. a failure before the first checkpoint, in a run dir with spaces --------------------
@pytest.mark.slow
def test_a_run_that_failed_before_its_first_checkpoint_starts_again_with_the_printed_command(tmp_path):
    """The env raises in the first iteration: no checkpoint. The paragraph's command (quoted for
    the shell: the run dir has spaces) starts the run again in the same dir; it then finishes,
    every iteration logged once."""
    run = tmp_path / "my runs" / "it's one"
    trigger = tmp_path / "armed"
    trigger.touch()
    failing = embodied("train", *TINY, f"run.dir={run}", "algo.total_env_steps=512", "cluster.backend=local",
                       "env.kwargs.fault=raise_step", f"env.kwargs.trigger={trigger}")
    assert failing.returncode == 3, failing.stderr[-3000:]
    text = " ".join(failing.stderr.split())
    command = "embodied train resume='" + str(run).replace("'", "'\"'\"'") + "'"
    assert f"No checkpoint was saved yet: `{command}` starts the run again from its beginning" in text, text
    same = embodied("train", *TINY, f"run.dir={run}")  # the same command again: refused, naming it
    assert same.returncode == 2 and f"`{command}`" in " ".join(same.stderr.split()), same.stderr
    trigger.unlink()  # the env is fixed
    import shlex

    args = shlex.split(command)[2:]  # the printed command, as the shell splits it
    again = embodied("train", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = assert_every_iteration_once(run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 512 and summary["iterations"] == len(rows) == 4


def test_the_resume_command_is_quoted_for_the_shell():
    from embodied.errors import FailureContext, WorkerFailure, format_failure, resume_command

    assert resume_command(Path("runs/x")) == "embodied train resume=runs/x"
    assert resume_command(Path("my runs/x y")) == "embodied train resume='my runs/x y'"
    text = format_failure(WorkerFailure("boom"), FailureContext(run_dir=Path("my runs/a b"),
                                                                checkpoint=Path("my runs/a b/checkpoints/iter_000002"),
                                                                checkpoint_iteration=2))
    assert "Resume with `embodied train resume='my runs/a b'`." in text, text


# --- 6 and 8. signals ----------------------------------------------------------------------------
#: Iterations of a few seconds (a slow env), a checkpoint after each; the Ray pipeline with env
#: processes, so that a signal to the process group reaches every kind of process.
SLOW = [*TINY, "env.backend=multiprocess", "env.num_procs=2", "checkpoint.every=1", "algo.total_env_steps=100000"]


@pytest.mark.slow
@pytest.mark.heavy
def test_sighup_to_the_process_group_stops_after_the_iteration_with_exit_129(start, tmp_path):
    """The terminal closes: SIGHUP to the whole process group (the driver, Ray's processes, the
    workers and their env processes). The run finishes its iteration, writes a checkpoint and
    summary.json, says so in driver.log, leaves nothing running and exits 129."""
    run_dir = tmp_path / "run"
    run = start(run_dir, *SLOW, f"run.dir={run_dir}")
    run.wait_rows(2)
    run.signal_group(signal.SIGHUP)
    assert run.finish() == 129, run.stderr
    log = (run_dir / "logs" / "driver.log").read_text()
    assert "SIGHUP: stopping after the current iteration" in log
    assert "Stopped (exit code 129): stopped by SIGHUP." in log and "Traceback" not in run.terminal
    rows = assert_every_iteration_once(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] == "SIGHUP" and summary["iterations"] == len(rows)
    from embodied.checkpoint import iteration_of, latest_checkpoint

    assert iteration_of(latest_checkpoint(run_dir)) == len(rows)
    assert run.leftovers() == []


@pytest.mark.slow
@pytest.mark.heavy
def test_two_ctrl_cs_0_2_s_apart_always_abort(start, tmp_path):
    """Two SIGINTs to the process group 0.2 s apart, each while the driver waits on Ray (which
    looks at signals about once a second): the second one is never lost. The abort is said at
    once, the run ends with 130 without finishing its iteration (no summary.json), nothing left."""
    for i in range(3):
        run_dir = tmp_path / f"run{i}"
        run = start(run_dir, *TINY, f"run.dir={run_dir}", "algo.total_env_steps=100000", "env.kwargs.delay_s=0.08")
        run.wait_for("[train]")  # the second iteration runs: ~10 s
        time.sleep(0.5)
        run.signal_group(signal.SIGINT)
        time.sleep(0.2)
        t0 = time.monotonic()
        run.signal_group(signal.SIGINT)
        run.wait_for("SIGINT: aborting now", timeout_s=2)
        said_s = time.monotonic() - t0
        assert run.finish() == 130, run.stderr
        assert said_s < 2 and time.monotonic() - t0 < 10, (said_s, run.stderr)
        assert not (run_dir / "summary.json").exists(), f"try {i}: the run finished its iteration"
        assert "Interrupted (exit code 130)" in run.paragraph() and "Traceback" not in run.terminal
        assert run.leftovers() == []


# --- 11. make train ------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [0, 3])
def test_make_train_ends_with_the_hint_to_activate_the_venv(tmp_path, code):
    """However the run ends (its failure still fails make), the last line says how to use
    `embodied` without make. The venv is a stand-in whose `embodied` only echoes; setup is skipped
    (``-o setup-train``)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "embodied").write_text(f"#!/bin/sh\necho \"ran embodied $*\"\nexit {code}\n")
    (venv / "bin" / "embodied").chmod(0o755)
    result = subprocess.run(["make", "-s", "-o", "setup-train", "train", f"VENV={venv}", "RECIPE=cartpole_ppo"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (result.returncode == 0) == (code == 0), result
    lines = result.stdout.strip().splitlines()
    assert "ran embodied train cartpole_ppo" in lines
    assert lines[-1] == f"[make] to use `embodied` directly (embodied train, eval, config ...): . {venv}/bin/activate"


# --- 10. Ray's "(raylet) A worker died" line -----------------------------------------------------
KILLED_WORKER = """
import os, signal, sys, time
from pathlib import Path
from embodied import logs
from embodied.runtime import Cluster, ClusterConfig, RankResources, WorkerGroup
from tests.embodied.test_reliability_ray import EnvWorker

run_dir = Path(sys.argv[1])
with logs.open_run_log(run_dir):
    with Cluster(ClusterConfig(backend="ray", num_cpus=1, timeout_s=120), run_dir=run_dir) as cluster:
        group = WorkerGroup(cluster, EnvWorker, 1, name="env", resources=RankResources(num_cpus=0.5))
        os.kill(group.remote.pid().result(), signal.SIGKILL)
        deadline = time.monotonic() + 60  # Ray's driver thread gets the raylet's message within seconds
        while "(raylet)" not in (run_dir / "logs" / "driver.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
print("done")
"""


@pytest.mark.slow
def test_the_raylets_worker_died_message_goes_to_driver_log_not_the_terminal(tmp_path):
    """A Ray worker killed with SIGKILL: Ray's driver prints "(raylet) A worker died ..." (in
    colour) whatever log_to_driver says; with a run dir it goes to driver.log, uncoloured."""
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", KILLED_WORKER, str(run_dir)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**cli_env(), "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "done\n" and "raylet" not in result.stderr, (result.stdout, result.stderr)
    log = (run_dir / "logs" / "driver.log").read_text()
    assert "ray.raylet: (raylet) A worker died or was killed" in log and "\x1b[" not in log


def test_checking_a_run_dirs_lock_names_its_holder_and_writes_nothing(tmp_path):
    """What `resume=` of a finished run checks first: a run still closing after its summary holds
    the lock, and is "in use", not "finished"."""
    from embodied.errors import UserError
    from pipelines.rundir import LOCK_FILE, RunDirLock

    RunDirLock.ensure_free(tmp_path)  # no lock file: free
    lock = RunDirLock.acquire(tmp_path)
    before = (tmp_path / LOCK_FILE).read_bytes()
    with pytest.raises(UserError, match=f"is in use by pid {os.getpid()}"):
        RunDirLock.ensure_free(tmp_path)
    assert (tmp_path / LOCK_FILE).read_bytes() == before
    lock.release()
    RunDirLock.ensure_free(tmp_path)
