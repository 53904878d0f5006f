"""Shared checks for the env tests: exact comparison of batched results, Vulkan availability."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from envs.base import EpisodeStats


def assert_same(a: Any, b: Any, path: str = "result") -> None:
    """Recursively assert two results (dataclasses, dicts, arrays, None) are identical."""
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b) if isinstance(b, dict) else b}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif a is None or b is None:
        assert a is None and b is None, f"{path}: {a!r} vs {b!r}"
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        np.testing.assert_array_equal(a, b, err_msg=path)


def assert_same_step(a: Any, b: Any, path: str = "step") -> None:
    """Like :func:`assert_same`, but final_obs is compared only on the rows that finished
    (the contract leaves the other rows unspecified)."""
    done = np.asarray(b.episodes.done)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "final_obs" and x is not None and y is not None:
            assert set(x) == set(y)
            for k in x:
                np.testing.assert_array_equal(np.asarray(x[k])[done], np.asarray(y[k])[done], err_msg=f"{path}.final_obs[{k}]")
        else:
            assert_same(x, y, f"{path}.{f.name}")


def no_episodes(n: int) -> EpisodeStats:
    return EpisodeStats(np.zeros(n, bool), np.zeros(n, np.float32), np.zeros(n, np.int64))


@functools.lru_cache(maxsize=1)
def vulkan_problem() -> str | None:
    """None when ManiSkill can create its (Vulkan) render device here, else the reason.

    Probed in a subprocess: a failing Vulkan driver can abort the process that tries it.
    """
    from envs.vulkan import ensure_vulkan_env

    ensure_vulkan_env()
    code = "import envs.vulkan as v; v.ensure_vulkan_env(); import sapien; sapien.render.RenderSystem()"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=dict(os.environ),
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )
    except subprocess.TimeoutExpired:
        return "probing the Vulkan device timed out"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return (
            "ManiSkill needs a Vulkan device and none works here "
            f"({tail[0]}); run scripts/setup_vulkan.sh (make test does) to fetch Mesa lavapipe."
        )
    return None


@pytest.fixture
def vulkan() -> None:
    """Skip the test cleanly when no Vulkan device is available for ManiSkill."""
    problem = vulkan_problem()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture
def same():
    return assert_same


@pytest.fixture
def same_step():
    return assert_same_step
