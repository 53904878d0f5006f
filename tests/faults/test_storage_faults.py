"""The run dir under stress: a corrupt latest checkpoint, a full disk, two trainers on one dir,
a resume whose config builds another model. Nothing written before must be lost or changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from embodied.checkpoint import checkpoint_problems, iteration_of, latest_checkpoint, list_checkpoints
from tests.embodied.small_disk import tmpfs_available
from tests.faults.harness import ROOT, TINY, assert_every_iteration_once, cli, cli_env, read_rows, snapshot

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 4-iteration run with a checkpoint after every iteration (3 kept). On the local
    backend (its config.yaml keeps it for the resumes): what these tests check is the run dir and
    its checkpoints, which the driver writes on either backend; a full disk and two trainers on a
    dir run on Ray below."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    result = cli("train", *TINY, f"run.dir={run_dir}", "algo.total_env_steps=512", "checkpoint.every=1",
                 "cluster.backend=local")
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture
def copy_of(finished, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    return run_dir


@pytest.mark.xdist_group("finished_run")  # one worker trains the module's finished run once
def test_a_corrupt_latest_checkpoint_names_the_intact_one_then_falls_back(copy_of):
    run_dir = copy_of
    latest = latest_checkpoint(run_dir)
    model = latest / "model.safetensors"
    with open(model, "r+b") as f:  # a write torn by a crash: the file ends early
        f.truncate(model.stat().st_size // 2)
    before = snapshot(run_dir)
    result = cli("train", f"resume={run_dir}")
    assert result.returncode == 4, result.stderr
    text = " ".join(result.stderr.split())
    intact = run_dir / "checkpoints" / "iter_000003"
    assert f"The latest checkpoint {latest} is corrupt" in text and "model.safetensors is" in text, text
    assert f"The newest intact one is {intact} (iteration 3)" in text and "resume_fallback=true" in text, text
    assert "Traceback" not in result.stdout + result.stderr
    assert snapshot(run_dir) == before  # refused before anything was written
    result = cli("train", f"resume={run_dir}", "resume_fallback=true", "algo.total_env_steps=768")
    assert result.returncode == 0, result.stderr
    rows = assert_every_iteration_once(run_dir, iterations=6)  # 1..3 kept, 4 run again, 5 and 6 new
    assert rows[-1]["env_steps"] == 768 and iteration_of(latest_checkpoint(run_dir)) == 6
    assert all(checkpoint_problems(c) == [] for c in list_checkpoints(run_dir / "checkpoints"))


@pytest.mark.xdist_group("finished_run")  # one worker trains the module's finished run once
def test_a_resume_whose_model_differs_changes_nothing_then_a_plain_resume_works(copy_of):
    run_dir = copy_of
    before = snapshot(run_dir)
    result = cli("train", f"resume={run_dir}", "policy.hidden_sizes=[8]")
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    assert "does not fit" in text or "differ" in text, text
    assert "(64, 4)" in text and "(8, 4)" in text, text  # the first layer's weight: checkpoint vs config
    assert "Traceback" not in result.stdout + result.stderr
    assert snapshot(run_dir) == before  # config.yaml (and every other file) byte-identical
    result = cli("train", f"resume={run_dir}", "algo.total_env_steps=768")
    assert result.returncode == 0, result.stderr
    assert_every_iteration_once(run_dir, iterations=6)


def test_a_second_trainer_on_a_run_dir_is_refused_while_the_first_goes_on(start, tmp_path):
    run_dir = tmp_path / "run"
    first = start(run_dir, *TINY, f"run.dir={run_dir}", "algo.total_env_steps=4096", "env.kwargs.delay_s=0.002")
    first.wait_rows(1)
    for args, needle in (
        ([*TINY, f"run.dir={run_dir}"], f"Run dir '{run_dir}' already exists and is not empty"),
        ([f"resume={run_dir}"], f"Run dir '{run_dir}' is in use by pid {first.proc.pid}"),
    ):
        second = cli("train", *args)
        assert second.returncode == 2, second.stderr
        assert needle in " ".join(second.stderr.split()), second.stderr
        assert "Traceback" not in second.stderr
        assert first.proc.poll() is None, "the first run stopped"
    assert first.finish() == 0, first.stderr
    assert_every_iteration_once(run_dir, iterations=32)
    assert first.leftovers() == []


FILL = textwrap.dedent("""
    # run `embodied train` with its run dir on a small tmpfs (this process's mount namespace);
    # once 2 iterations are logged, fill the disk; afterwards copy the run dir out (minus the filler)
    import json, os, subprocess, sys, time
    from pathlib import Path
    disk, out, args = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    run_dir = disk / "run"
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "train", *args, f"run.dir={run_dir}"],
                            stdout=open(out / "stdout", "w"), stderr=open(out / "stderr", "w"))
    metrics = run_dir / "metrics.jsonl"
    while proc.poll() is None and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.1)
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\\0" * 65536)
        except OSError:  # full
            pass
    code = proc.wait(timeout=300)
    (out / "rc").write_text(str(code))
    filler.unlink()
    subprocess.run(["cp", "-a", str(run_dir), str(out / "run")], check=True)
""")


@pytest.mark.skipif(not tmpfs_available(), reason="no private tmpfs here (unshare -rm); tests/embodied/test_checkpoint.py "
                                                  "covers a full disk with a file size limit")
def test_a_full_disk_ends_with_exit_4_and_keeps_the_last_checkpoint(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    disk = tmp_path / "disk"
    disk.mkdir()
    args = [*TINY, "algo.total_env_steps=100000", "checkpoint.every=1"]
    cmd = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=16m tmpfs "$1" && shift && exec "$@"', "sh",
           str(disk), sys.executable, "-c", FILL, str(disk), str(out), *args]
    subprocess.run(cmd, cwd=ROOT, env=cli_env(), timeout=600, check=True)
    code, stderr = int((out / "rc").read_text()), (out / "stderr").read_text()
    assert code == 4, stderr
    text = " ".join(stderr[stderr.rindex("embodied: error: "):].split())
    assert text.startswith("embodied: error: Storage failed (exit code 4): "), text
    assert "No space left on device" in text and "free on its file system" in text, text
    assert "Traceback" not in stderr + (out / "stdout").read_text(), stderr[-4000:]
    run_dir = out / "run"
    rows = assert_every_iteration_once(run_dir)  # complete rows only, no torn line
    ckpts = list_checkpoints(run_dir / "checkpoints")
    assert ckpts and all(checkpoint_problems(c) == [] for c in ckpts)
    assert not list((run_dir / "checkpoints").glob(".tmp-*")), "a temporary checkpoint dir was left"
    assert iteration_of(latest_checkpoint(run_dir)) >= len(rows) - 1
    result = cli("train", f"resume={run_dir}", f"algo.total_env_steps={rows[-1]['env_steps'] + 256}")
    assert result.returncode == 0, result.stderr
    assert_every_iteration_once(run_dir)
