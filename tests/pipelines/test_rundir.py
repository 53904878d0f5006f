"""The run dir: checks before anything is written, and one trainer per dir (a lock that a dead run
never leaves behind)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from embodied.errors import UserError
from pipelines.cli import build_train_config
from pipelines.rundir import LOCK_FILE, RunDir, RunDirLock

REPO = Path(__file__).resolve().parents[2]


def cfg_for(path: Path):
    return build_train_config(["cartpole_ppo", f"run.dir={path}"])


def test_new_run_dir_gets_the_config_and_a_lock_naming_this_process(tmp_path):
    path = tmp_path / "runs" / "a"
    run = RunDir.create(cfg_for(path))
    try:
        assert sorted(p.name for p in path.iterdir()) == [LOCK_FILE, "config.yaml"]
        assert run.lock is not None and run.lock.held
        holder = RunDirLock.holder(path)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(UserError) as info:
            RunDir.create(cfg_for(path), resume=True)
        assert str(info.value).startswith(
            f"Run dir {str(path)!r} is in use by pid {os.getpid()} on host {socket.gethostname()} (started ")
    finally:
        run.close()
    assert not run.lock.held
    RunDir.create(cfg_for(path), resume=True).close()  # free again once the first run closed


HOLDER = textwrap.dedent("""
    import sys, time
    from pipelines.rundir import RunDirLock
    lock = RunDirLock.acquire(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_run_still_training_refuses_resume_and_a_killed_one_leaves_no_lock(tmp_path):
    path = tmp_path / "run"
    RunDir.create(cfg_for(path)).close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=f"is in use by pid {holder.pid} on host "):
            RunDir.create(cfg_for(path), resume=True)
        with pytest.raises(UserError, match="is in use by"):  # a second trainer into the same dir: refused too
            RunDir.create(build_train_config(["cartpole_ppo", f"run.dir={path}", "seed=3"]), resume=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    run = RunDir.create(cfg_for(path), resume=True)  # the kernel dropped the dead holder's lock
    assert RunDirLock.holder(path)["pid"] == os.getpid()
    run.close()


def test_run_dir_that_is_a_file_is_a_user_error_and_untouched(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    with pytest.raises(UserError, match=r"run.dir '.*notes.txt' is a file, not a directory"):
        RunDir.create(cfg_for(file))
    with pytest.raises(UserError, match=r"run.dir's parent '.*notes.txt' is a file"):
        RunDir.create(cfg_for(file / "run"))
    assert file.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_existing_run_and_non_run_are_refused_with_nothing_written(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UserError, match="already exists and is not empty"):
        RunDir.create(cfg_for(taken))
    with pytest.raises(UserError, match="is not a run dir"):
        RunDir.create(cfg_for(taken), resume=True)
    assert sorted(p.name for p in taken.iterdir()) == ["metrics.jsonl"]
    with pytest.raises(UserError, match="is not a run dir"):
        RunDir.create(cfg_for(tmp_path / "missing"), resume=True)
    assert not (tmp_path / "missing").exists()


def test_an_empty_dir_or_one_with_only_a_stale_lock_is_usable(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    RunDir.create(cfg_for(empty)).close()
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / LOCK_FILE).write_text('{"pid": 1, "host": "gone"}\n')
    with RunDir.create(cfg_for(stale)) as run:
        assert (run.path / "config.yaml").is_file()
