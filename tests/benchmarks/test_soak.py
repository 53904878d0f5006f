"""The soak check's sampling and analysis (``benchmarks/soak.py``), on a job of a few seconds."""

from __future__ import annotations

import sys

import pytest

from benchmarks.soak import TARGET_PCT, analyze, growth, soak


def _samples(rss: list[float], fds: list[int], shm: float = 8.0) -> list[dict]:
    return [{"t_s": float(t), "shm_mib": shm, "dev_shm_used_mib": 100.0,
             "processes": {"1": {"name": "driver", "rss_mib": r, "open_fds": f},
                           "2": {"name": "worker", "rss_mib": 50.0, "open_fds": 10}}}
            for t, (r, f) in enumerate(zip(rss, fds))]


def test_growth_compares_the_medians_of_the_first_and_last_windows():
    # 30 samples: windows of 3; a peak inside the first window does not move its median
    values = [100.0, 500.0, 100.0] + [100.0] * 24 + [104.0, 104.0, 104.0]
    assert growth(values) == {"start": 100.0, "end": 104.0, "growth_pct": 4.0, "max": 500.0}
    assert growth([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # fewer than two windows


def test_a_flat_job_passes_and_a_growing_one_fails():
    flat = analyze(_samples([200.0] * 40, [30] * 40), warmup_s=10)
    assert flat["ok"] is True and flat["samples_after_warmup"] == 30
    assert flat["job"]["rss_mib"]["growth_pct"] == 0.0 and flat["job"]["processes"]["end"] == 2
    # the driver's RSS climbs 150 -> 250 MiB after the warm-up: the job's total (plus 50 of the
    # worker) goes from 200 to 300, +50%
    leaking = analyze(_samples([100.0] * 10 + [150.0 + 100.0 * i / 29 for i in range(30)], [30] * 40), warmup_s=10)
    assert leaking["ok"] is False
    job = leaking["job"]["rss_mib"]
    assert job["start"] == pytest.approx(203.45, abs=0.01) and job["end"] == pytest.approx(296.55, abs=0.01)
    assert job["growth_pct"] > TARGET_PCT
    driver = next(p for p in leaking["processes"] if p["name"] == "driver")
    assert driver["rss_mib"]["growth_pct"] == pytest.approx(60.67, abs=0.01)  # 153.45 -> 246.55 (samples 1 and 28)


#: A job of two processes: the parent maps 3 MiB of shared memory, then allocates memory and opens
#: files as it runs; its child sleeps.
LEAKY_JOB = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
from multiprocessing import shared_memory
shm = shared_memory.SharedMemory(create=True, size=3 * 1024 * 1024)
shm.unlink()  # unlinked, still mapped: still counted
time.sleep(0.5)
open(sys.argv[1], "w").close()  # ready: the warm-up counts from here
kept, files = [], []
while True:
    kept.append(bytearray(2 * 1024 * 1024))
    files.append(open(os.devnull))
    time.sleep(0.05)
"""


def test_soak_samples_a_real_process_tree_and_sees_its_growth(tmp_path):
    ready = tmp_path / "ready"
    result = soak([sys.executable, "-c", LEAKY_JOB, str(ready)], seconds=3.5, interval_s=0.1, warmup_s=0.3,
                  ready=ready.exists)
    assert result["samples"] >= 15 and result["ended_before_the_end"] is False
    assert result["ready_after_s"] >= 0.4 and result["samples_after_warmup"] < result["samples"]
    assert result["job"]["processes"]["end"] == 3  # the parent, its child and multiprocessing's resource tracker
    assert result["job"]["rss_mib"]["growth_pct"] > 20 and result["job"]["open_fds"]["growth_pct"] > 20
    assert result["job"]["shm_mib"]["end"] == 3.0 and result["job"]["shm_mib"]["growth_pct"] == 0.0
    assert result["ok"] is False
    assert result["exit_code"] != 0  # stopped by its Ctrl-C
    assert len(result["series"]) == result["samples"] and result["series"][0]["t_s"] == 0.0


def test_a_training_job_is_settled_once_it_logs_an_iteration_off_calibration(tmp_path):
    from benchmarks.soak import training_settled

    assert not training_settled(tmp_path)
    rows = tmp_path / "metrics.jsonl"
    rows.write_text('{"iteration": 1, "plan/calibrating": true}\n')
    assert not training_settled(tmp_path)
    rows.write_text(rows.read_text() + '{"iteration": 2}\n{"iteration": 3, "env_st')  # a torn last row
    assert training_settled(tmp_path)
