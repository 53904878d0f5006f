"""Measuring components for the M2Flow planner: timed probes, cost-model fits, and a cache.

The pipeline-specific probes (which env, which policy) live with the pipeline; this module holds
what every probe shares: warm-up then median timing, fitting ``scheduler`` cost models to the
samples, a hardware fingerprint, and a JSON cache so a second run with the same env, policy and
hardware starts at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler import CostModel, Profile, fit_cost_model


def time_call(fn: Callable[[], Any], warmup: int = 2, repeats: int = 5) -> float:
    """Median wall seconds of ``fn()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class Probe:
    """Collects ``(batch, n_devices, seconds)`` samples of one component and fits its cost."""

    def __init__(self, name: str, scaling_exponent: float | None = None) -> None:
        self.name = name
        self.samples: list[tuple[int, int, float]] = []
        #: known device scaling (e.g. 0.0: runs in one process whatever it is given); None: fitted
        self.scaling_exponent = scaling_exponent

    def add(self, batch: int, n_devices: int, seconds: float) -> None:
        self.samples.append((int(batch), int(n_devices), float(seconds)))

    def fit(self) -> CostModel:
        if not self.samples:
            raise ValueError(f"probe {self.name!r} has no samples")
        return fit_cost_model(self.samples, self.scaling_exponent)


def hardware_fingerprint() -> dict[str, Any]:
    """What makes a profile valid: CPU model and count, GPU model, torch version."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["gpus"] = torch.cuda.device_count()
    except ImportError:
        info["torch"] = None
    return info


def cache_dir() -> Path:
    """``$EMBODIED_CACHE/profiles`` (default ``~/.cache/embodied/profiles``)."""
    root = os.environ.get("EMBODIED_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "embodied")
    return Path(root) / "profiles"


def cache_key(what: dict[str, Any]) -> str:
    """A stable key of the measured setup (env, policy, sizes) and this machine's hardware."""
    blob = json.dumps({"setup": what, "hardware": hardware_fingerprint()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def load_cached(key: str) -> dict[str, Any] | None:
    path = cache_dir() / f"{key}.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a corrupt cache entry is re-measured


def load_cached_profile(key: str, log: Callable[[str], None] = print) -> Profile | None:
    """The cached :class:`~scheduler.Profile` under ``key``; None where there is none, and where
    the file does not load in this version (e.g. keys a newer embodied writes): ``log`` gets one
    line naming the file and the problem, and the caller measures again. A file without keys
    added since it was written loads with their defaults."""
    data = load_cached(key)
    if data is None:
        return None
    try:
        return Profile.from_dict(data)
    except (ValueError, TypeError, KeyError) as err:
        log(f"[m2flow] the cached profile {cache_dir() / f'{key}.json'} does not load in this version of embodied "
            f"({err}); a newer version may have written it: measuring again")
        return None


def store_cached(key: str, data: dict[str, Any]) -> Path:
    path = cache_dir() / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
    return path
