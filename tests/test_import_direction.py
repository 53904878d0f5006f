"""The import direction scheduler <- embodied <- (envs | policies) <- pipelines, checked by
import-linter; and proof that the check fails on a wrong-way import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["scheduler", "embodied", "envs", "policies", "pipelines"]


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), "--config", str(cwd / "pyproject.toml")], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_contracts_hold():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_wrong_way_import_is_caught(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "embodied" / "zz_wrong_way.py").write_text("import pipelines.config\n")
    (tmp_path / "scheduler" / "zz_impure.py").write_text("import torch\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "embodied.zz_wrong_way -> pipelines.config" in result.stdout
    assert "scheduler is not allowed to import torch" in result.stdout
