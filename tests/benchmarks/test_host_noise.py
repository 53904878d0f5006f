"""The host-noise benchmark times identical work: the same physics in every block and process,
and its spreads are what its rows say."""

from __future__ import annotations

import json

import pytest

import benchmarks.common as common
import benchmarks.host_noise as host_noise


def _block(wall: float, cpu: float, checksum: float = 1.5) -> dict:
    return {"wall_s": wall, "env_cpu_s": cpu, "checksum": checksum, "steal": 0.01, "reference_s": 0.1}


def test_spreads_within_and_across_processes():
    processes = [[_block(1.0, 2.0), _block(1.2, 2.4), _block(1.1, 2.2)], [_block(2.0, 3.0), _block(2.0, 3.0), _block(1.6, 3.0)]]
    s = host_noise.summarize(processes)
    assert s["spread"] == pytest.approx(2.0) and s["median_s"] == pytest.approx(1.4)
    assert s["within_process_spread"] == pytest.approx((1.2 + 1.25) / 2)  # median of 1.2x and 1.25x
    assert s["across_process_spread"] == pytest.approx(2.0 / 1.1)
    assert s["cpu_spread"] == pytest.approx(1.5) and s["largest_deviation_from_median"] == pytest.approx(0.6 / 1.4)
    assert s["same_work"]
    assert not host_noise.summarize([[_block(1.0, 1.0), _block(1.0, 1.0, checksum=2.5)]])["same_work"]


def test_cartpole_blocks_in_fresh_processes_simulate_the_same_physics(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    result = host_noise.main(["--recipe", "cartpole_ppo", "--processes", "2", "--blocks", "2", "--steps", "30", "--name", "t"])
    assert [len(p) for p in result["processes"]] == [2, 2]
    assert result["summary"]["same_work"]  # a fixed seed and fixed actions: identical blocks
    assert all(b["wall_s"] > 0 and b["env_cpu_s"] > 0 and b["reference_s"] > 0 for p in result["processes"] for b in p)
    stored = json.loads((tmp_path / "host_noise_t.json").read_text())
    assert stored["summary"] == result["summary"] and (tmp_path / "host_noise_t.png").stat().st_size > 0
    assert stored["command"].startswith("python -m benchmarks.host_noise --recipe cartpole_ppo")


def test_sizes_below_one_are_refused():
    with pytest.raises(SystemExit):
        host_noise.main(["--steps", "0"])
