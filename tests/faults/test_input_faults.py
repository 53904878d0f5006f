"""Bad input is caught before anything is written: one paragraph, exit 2, no run dir."""

from __future__ import annotations

import pytest

from embodied.runtime.cluster import dashboard_missing
from tests.faults.harness import TINY, cli


@pytest.mark.parametrize("override, needle", [
    ("env.num_envs=0", "env.num_envs must be >= 1 (got 0)"),
    ("env.num_envs=-1", "env.num_envs must be >= 1 (got -1)"),
    ("algo.lr=-1", "algo.lr must be > 0 (got -1.0)"),
    ("algo.total_env_steps=0", "algo.total_env_steps must be >= 1 (got 0)"),
    ("env.timeout_s=0", "env.timeout_s must be > 0 seconds (got 0.0)"),
    ("env.nonfinite=ignore", "env.nonfinite"),
    ("cluster.timeout_s=-5", "cluster.timeout_s must be > 0 seconds (got -5.0)"),
    ("plan.calibrate_margin=-0.1", "plan.calibrate_margin must be >= 0 (got -0.1)"),
])
def test_bad_values_are_refused_before_a_run_dir_exists(tmp_path, override, needle):
    run_dir = tmp_path / "run"
    result = cli("train", *TINY, f"run.dir={run_dir}", override, timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert needle in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not run_dir.exists()


def test_a_run_dir_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("not a run")
    result = cli("train", *TINY, f"run.dir={target}", timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert f"run.dir '{target}' is a file, not a directory" in " ".join(result.stderr.split())
    assert target.read_text() == "not a run" and "Traceback" not in result.stderr


@pytest.mark.skipif(dashboard_missing() is None, reason="Ray's dashboard is installed here: it starts")
def test_a_dashboard_without_its_packages_says_what_to_install(tmp_path):
    run_dir = tmp_path / "run"
    result = cli("train", *TINY, f"run.dir={run_dir}", "cluster.dashboard=true", timeout_s=120)
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    assert "cluster.dashboard=true needs Ray's dashboard, which is not installed here (No module named" in text, text
    assert 'pip install "ray[default]==' in text and "or set cluster.dashboard=false" in text, text
    assert "Traceback" not in result.stdout + result.stderr and not run_dir.exists()
