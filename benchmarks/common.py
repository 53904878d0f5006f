"""Helpers shared by the benchmarks: machine info and result files."""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def machine_info() -> dict[str, Any]:
    versions = {}
    for pkg in ("torch", "ray", "gymnasium", "mujoco", "mani_skill", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        gpu = None
    return {
        "cpu_cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": gpu,
        "python": platform.python_version(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d"),
    }


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine_info(), **result}, indent=2) + "\n")
    return path
