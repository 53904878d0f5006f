"""The run's log: what reaches the terminal and what only the log file gets; worker processes'
own log files; process titles."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from embodied import logs

REPO = Path(__file__).resolve().parents[2]
TOKEN_NOTICE = ("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out. "
                "For more information, see https://docs.ray.io/en/latest/ray-security/token-auth.html")


def _emit_one_of_each() -> None:
    logging.getLogger("embodied.pipeline").info("iteration 3 done")
    logging.getLogger("embodied.pipeline").debug("weights synced in 0.1 ms")
    logging.getLogger("embodied").warning("plan drifted")
    logging.getLogger("somelib").info("somelib chatter")
    logging.getLogger("somelib").warning("somelib warning")
    logging.getLogger("somelib").error("somelib broke")
    logging.getLogger("ray._private.authentication.authentication_token_setup").warning(TOKEN_NOTICE)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("Box bound precision lowered by casting to float32", UserWarning)


@pytest.fixture
def no_debug(monkeypatch):
    monkeypatch.delenv(logs.DEBUG_ENV, raising=False)


def test_terminal_gets_project_info_and_errors_while_the_file_gets_everything(tmp_path, no_debug):
    terminal = io.StringIO()
    with logs.open_run_log(tmp_path, terminal=terminal) as run_log:
        assert run_log.path == tmp_path / "logs" / "driver.log"
        _emit_one_of_each()
    shown = terminal.getvalue().splitlines()
    assert shown == ["iteration 3 done", "warning: plan drifted", "error (somelib): somelib broke"]
    text = run_log.path.read_text()
    for needle in ("iteration 3 done", "weights synced in 0.1 ms", "plan drifted", "somelib chatter",
                   "somelib warning", "somelib broke", TOKEN_NOTICE, "Box bound precision lowered by casting to float32"):
        assert needle in text, needle
    assert " DEBUG   " in text and " py.warnings: " in text


@pytest.mark.parametrize("how", ["argument", "env"])
def test_debug_shows_everything_on_the_terminal(tmp_path, monkeypatch, how):
    monkeypatch.setenv(logs.DEBUG_ENV, "1" if how == "env" else "0")
    terminal = io.StringIO()
    with logs.open_run_log(tmp_path, terminal=terminal, debug=True if how == "argument" else None):
        _emit_one_of_each()
    shown = terminal.getvalue()
    for needle in ("weights synced in 0.1 ms", "somelib chatter", TOKEN_NOTICE, "Box bound precision"):
        assert needle in shown, needle


def test_close_restores_logging_and_the_environment(tmp_path, no_debug, monkeypatch):
    monkeypatch.delenv(logs.RUN_DIR_ENV, raising=False)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    run_log = logs.open_run_log(tmp_path, terminal=io.StringIO())
    assert os.environ[logs.RUN_DIR_ENV] == str(tmp_path.resolve())
    assert logs.current_run_log() is run_log
    run_log.close()
    assert logs.current_run_log() is None and logs.RUN_DIR_ENV not in os.environ
    assert root.level == level and root.handlers == handlers
    logging.getLogger("embodied").warning("after close")
    assert "after close" not in run_log.path.read_text()


def test_log_failure_writes_the_traceback_to_the_file_only(tmp_path, no_debug):
    terminal = io.StringIO()
    with logs.open_run_log(tmp_path, terminal=terminal) as run_log:
        try:
            {}["missing"]
        except KeyError as exc:
            where = logs.log_failure(exc, "collecting rollouts in iteration 4")
    assert where == run_log.path
    assert terminal.getvalue() == ""
    text = run_log.path.read_text()
    assert "failure while collecting rollouts in iteration 4: KeyError: 'missing'" in text
    assert "Traceback (most recent call last)" in text and "test_log_failure_writes_the_traceback" in text
    assert logs.log_failure(ValueError("no run log open")) is None


def _run(script: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    full.pop(logs.DEBUG_ENV, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=full, capture_output=True, text=True,
                          timeout=timeout)


def test_worker_output_goes_to_its_log_and_children_log_next_to_it(tmp_path):
    """A worker process's prints, logging, warnings and uncaught-in-thread output go to
    logs/<label>.log; a process it starts derives its label from it."""
    result = _run("""
        import logging, os, subprocess, sys, warnings
        from embodied import logs
        path = logs.redirect_worker_output("env-0")
        print("printed to stdout")
        print("printed to stderr", file=sys.stderr)
        logging.getLogger("somelib").debug("a debug line")
        warnings.warn("float64 cast to float32", UserWarning)
        child = "from embodied import logs; logs.redirect_worker_output(logs.child_label('shard1')); print('child says hi')"
        subprocess.run([sys.executable, "-c", child], check=True)
        sys.__stdout__.write(str(path))
    """, {logs.RUN_DIR_ENV: str(tmp_path), logs.LABEL_ENV: ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout == str(tmp_path.resolve() / "logs" / "env-0.log")  # nothing else reached stdout
    assert result.stderr == ""
    text = (tmp_path / "logs" / "env-0.log").read_text()
    for needle in ("--- env-0: pid", "printed to stdout", "printed to stderr", "a debug line", "float64 cast to float32"):
        assert needle in text, needle
    assert "child says hi" in (tmp_path / "logs" / "env-0-shard1.log").read_text()


def test_without_a_run_dir_worker_output_is_left_alone(tmp_path):
    result = _run("""
        from embodied import logs
        assert logs.redirect_worker_output("env-0") is None
        print("still on stdout")
    """, {logs.RUN_DIR_ENV: ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "still on stdout\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process titles via /proc and prctl are Linux-only")
def test_process_title_shows_in_ps_comm_and_cmdline():
    result = _run("""
        import os, subprocess, sys
        from embodied import logs
        logs.set_process_title("embodied::env-0-shard1 with a long tail", comm="env-0-shard1")
        pid = str(os.getpid())
        comm = subprocess.run(["ps", "-o", "comm=", "-p", pid], capture_output=True, text=True).stdout.strip()
        args = subprocess.run(["ps", "-o", "args=", "-p", pid], capture_output=True, text=True).stdout.strip()
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[0].decode()
        print(comm, args, cmdline, sep="|")
    """, {})
    assert result.returncode == 0, result.stderr
    comm, args, cmdline = result.stdout.strip().split("|")
    assert comm == "env-0-shard1"
    assert args == "embodied::env-0-shard1 with a long tail"
    assert cmdline == "embodied::env-0-shard1 with a long tail"


def test_report_failure_logs_the_traceback_prints_one_paragraph_and_returns_the_exit_code(tmp_path, no_debug):
    from embodied.errors import FailureContext, StorageError, UserError

    terminal, stream = io.StringIO(), io.StringIO()
    with logs.open_run_log(tmp_path, terminal=terminal) as run_log:
        try:
            raise StorageError("Writing metrics.jsonl failed at r/metrics.jsonl: No space left on device.", "r/metrics.jsonl")
        except StorageError as exc:
            code = logs.report_failure(exc, FailureContext(doing="logging iteration 7", run_dir=tmp_path), stream=stream,
                                       prefix="embodied train: error: ")
        user = logs.report_failure(UserError("Unknown key 'algo.lrr'."), stream=stream)
    assert (code, user) == (4, 2)
    assert terminal.getvalue() == ""  # only the paragraphs, on the given stream
    lines = stream.getvalue().splitlines()
    text = " ".join(lines[:-1])
    assert text.startswith("embodied train: error: Storage failed (exit code 4): Writing metrics.jsonl failed")
    assert "It happened while logging iteration 7." in text and f"Full traceback in {run_log.path}." in text
    assert all(len(line) <= 100 or " " not in line.strip() for line in lines)
    assert lines[-1] == "embodied: error: Unknown key 'algo.lrr'."
    log_text = run_log.path.read_text()
    assert "failure while logging iteration 7: StorageError" in log_text and "Traceback (most recent call last)" in log_text
    assert "Storage failed (exit code 4)" in log_text and "Unknown key" in log_text
