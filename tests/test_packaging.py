"""`pip install .` installs the five library packages (and the recipes), never benchmarks or tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_holds_only_the_library_packages(tmp_path):
    # Build from a copy of the files git knows (a stale build/ dir must not leak into the wheel).
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    src = tmp_path / "src"
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )
    wheel = next(tmp_path.glob("embodied-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"embodied", "envs", "policies", "pipelines", "scheduler"}
    assert "pipelines/recipes/maniskill_pushcube_ppo.yaml" in names  # recipes travel with the package
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "embodied = pipelines.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
