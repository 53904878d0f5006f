"""Exit codes, the one-paragraph failure message, errors that survive pickling, SIGTERM -> 143."""

from __future__ import annotations

import errno
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from embodied.errors import (
    ConfigError,
    ExitCode,
    FailureContext,
    RunTimeout,
    StorageError,
    Terminated,
    UserError,
    WorkerFailure,
    exit_code_of,
    first_paragraph,
    format_bytes,
    format_failure,
    storage_error,
)
from embodied.runtime.mailbox import ChannelTimeout
from embodied.runtime.worker import WorkerError, WorkerTimeout, WorkerUserError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "exc, code",
    [
        (UserError("bad key"), 2),
        (ConfigError("bad key"), 2),
        (WorkerUserError("unknown env id"), 2),
        (WorkerFailure("env died"), 3),
        (WorkerError("env", 0, "interact", "ValueError: x"), 3),
        (StorageError("disk full", "/tmp/x"), 4),
        (OSError(errno.ENOSPC, "No space left on device"), 4),
        (RunTimeout("no answer"), 5),
        (WorkerTimeout("env", 1, "interact", "no answer"), 5),
        (ChannelTimeout("nothing on channel"), 5),
        (KeyboardInterrupt(), 130),
        (Terminated(signal.SIGTERM), 143),
        (Terminated(signal.SIGHUP), 129),
        (ValueError("a bug"), 1),
        (OSError(errno.ENOENT, "No such file"), 1),
    ],
)
def test_every_kind_of_failure_has_its_exit_code(exc, code):
    assert exit_code_of(exc) == code
    assert ExitCode.SIGTERM == 128 + signal.SIGTERM


def test_worker_failure_paragraph_names_what_where_doing_checkpoint_resume_and_log(tmp_path):
    err = WorkerError(
        "env", 0, "interact", "ValueError: bad action", "Traceback (most recent call last):\n  boom\n",
        where={"node": "host-1", "pid": 4242, "env_index": 3, "seed": 7, "log": "runs/x/logs/env-0.log"},
    )
    ctx = FailureContext(
        doing="collecting rollouts in iteration 12",
        run_dir=Path("runs/x"),
        checkpoint=Path("runs/x/checkpoints/iter_000010"),
        checkpoint_iteration=10,
        log_path=Path("runs/x/logs/driver.log"),
    )
    text = format_failure(err, ctx)
    assert text == (
        "A worker failed (exit code 3): interact() failed: ValueError: bad action. "
        "Where: worker group env, rank 0, node host-1, pid 4242, env index 3, seed 7. "
        "Its output is in runs/x/logs/env-0.log. "
        "It happened while collecting rollouts in iteration 12. "
        "Last checkpoint: runs/x/checkpoints/iter_000010 (iteration 10). "
        "Resume with `embodied train resume=runs/x`. "
        "Full traceback in runs/x/logs/driver.log."
    )
    assert "\n" not in text and "boom" not in text  # one paragraph; the traceback stays in the log


def test_paragraph_without_checkpoint_gives_the_command_that_starts_it_again():
    text = format_failure(StorageError("Writing metrics.jsonl failed at runs/x/metrics.jsonl: No space left on device; "
                                       "0 B free on its file system.", "runs/x/metrics.jsonl"),
                          FailureContext(run_dir=Path("runs/x")))
    assert text.startswith("Storage failed (exit code 4): Writing metrics.jsonl failed at runs/x/metrics.jsonl")
    assert text.endswith("No checkpoint was saved yet: `embodied train resume=runs/x` starts the run again from its "
                         "beginning, in the same run dir.")


def test_user_error_paragraph_is_its_message_alone():
    assert format_failure(UserError("Unknown key 'algo.lrr'. Did you mean 'algo.lr'?"),
                          FailureContext(run_dir=Path("r"))) == "Unknown key 'algo.lrr'. Did you mean 'algo.lr'?"


def test_unexpected_error_is_called_a_bug_and_interrupts_are_named():
    bug = format_failure(KeyError("x"), FailureContext(log_path=Path("l.log")))
    assert bug.startswith("Unexpected error (a bug: please report it with the log file) (exit code 1): KeyError: 'x'.")
    assert format_failure(Terminated(signal.SIGTERM)).startswith("Stopped (exit code 143): stopped by SIGTERM.")
    assert format_failure(KeyboardInterrupt()).startswith("Interrupted (exit code 130): Ctrl-C (SIGINT).")


def test_env_worker_error_index_is_reported_as_env_process():
    class EnvProcessError(RuntimeError):
        worker_index = 1

    assert "Where: env process 1." in format_failure(EnvProcessError("died"))


def test_first_paragraph_drops_the_attached_traceback():
    assert first_paragraph("worker x failed: boom\n--- traceback in the worker ---\nTraceback...") == "worker x failed: boom"
    assert first_paragraph("one\ntwo\n\nthree") == "one two"


def test_storage_error_names_path_cause_and_free_space(tmp_path):
    err = storage_error("Saving checkpoint iter_000002", tmp_path / "iter_000002", OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(err, StorageError) and err.path == tmp_path / "iter_000002"
    assert err.free_bytes is not None and err.free_bytes > 0
    assert str(err).startswith(f"Saving checkpoint iter_000002 failed at {tmp_path / 'iter_000002'}: No space left on device; ")
    assert f"{format_bytes(err.free_bytes)} free on its file system." in str(err)
    assert "Free some space" in str(err)


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"


def test_errors_survive_pickling_with_their_fields():
    err = WorkerError("env", 2, "step", "ValueError: x", "tb", where={"node": "n", "seed": 5})
    back = pickle.loads(pickle.dumps(err))
    assert (back.group, back.rank, back.method, back.where) == ("env", 2, "step", err.where)
    assert str(back) == str(err) and exit_code_of(back) == 3
    st = pickle.loads(pickle.dumps(StorageError("full", "/x", 12)))
    assert (st.path, st.free_bytes, str(st)) == (Path("/x"), 12, "full")
    assert pickle.loads(pickle.dumps(Terminated(signal.SIGTERM))).exit_code == 143


def test_sigterm_runs_cleanup_and_exits_143(tmp_path):
    """A SIGTERM inside ``exit_on_signals`` raises Terminated: ``finally`` blocks run, and a main
    that maps it with exit_code_of exits 143."""
    marker = tmp_path / "cleaned"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from embodied.errors import exit_code_of, exit_on_signals
        def main():
            with exit_on_signals():
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(10)
                finally:
                    open({str(marker)!r}, "w").write("yes")
        try:
            main()
        except BaseException as exc:
            sys.exit(exit_code_of(exc))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, timeout=60)
    assert result.returncode == 143
    assert marker.read_text() == "yes"
