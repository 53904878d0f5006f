"""The profile cache across versions: an older file loads, a newer one is measured again with one
line that says why (never a traceback in the middle of a run)."""

from __future__ import annotations

import json

from embodied.profiler import cache_dir, load_cached_profile, store_cached
from scheduler import ComponentProfile, CostModel, Profile

PROFILE = Profile({"env": ComponentProfile("env", CostModel(0.0, 0.1, 1.0))}, gpu_switch_s=0.002, gpu_contention=1.2)


def test_a_cached_profile_without_the_gpu_keys_loads_with_their_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path))
    store_cached("older", {k: v for k, v in PROFILE.to_dict().items() if not k.startswith("gpu_")})
    loaded = load_cached_profile("older", log=lambda line: None)
    assert loaded is not None and loaded.components == PROFILE.components
    assert (loaded.gpu_switch_s, loaded.gpu_contention) == (0.0, 1.5)
    assert load_cached_profile("absent") is None


def test_a_cached_profile_with_keys_of_a_newer_version_is_measured_again_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path))
    store_cached("newer", {**PROFILE.to_dict(), "gpu_mps": True})
    lines: list[str] = []
    assert load_cached_profile("newer", log=lines.append) is None
    assert len(lines) == 1
    assert str(cache_dir() / "newer.json") in lines[0]
    assert "unknown key(s) ['gpu_mps']" in lines[0] and "newer version" in lines[0] and "measuring again" in lines[0]
    assert json.loads((cache_dir() / "newer.json").read_text())["gpu_mps"] is True  # left for the newer version until re-measured
