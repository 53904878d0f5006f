"""What every benchmark result records about how and where it ran."""

from __future__ import annotations

import sys

import pytest

from benchmarks.common import command_of, cpu_times, machine_info, steal_share


def test_the_command_is_the_one_that_ran(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["m2flow_pipelining.py", "--reprofile", "--name", "r2"])
    assert command_of("m2flow_pipelining", None) == "python -m benchmarks.m2flow_pipelining --reprofile --name r2"
    assert command_of("m2flow_pipelining", ["--iterations", "3"]) == "python -m benchmarks.m2flow_pipelining --iterations 3"
    assert command_of("m2flow_pipelining", []) == "python -m benchmarks.m2flow_pipelining"


def test_machine_info_names_the_cpu_model_and_its_vector_units():
    info = machine_info()
    assert info["cpu_cores"] >= 1 and isinstance(info["cpu_model"], str) and info["cpu_model"]
    assert set(info["cpu_vector_units"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}


def test_steal_share_is_the_hypervisors_part_of_the_cpu_time_between_two_readings():
    before = dict.fromkeys(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), 100)
    after = {**before, "user": 160, "idle": 130, "steal": 110}  # 60 + 30 + 10 ticks, 10 of them stolen
    assert steal_share(before, after) == pytest.approx(0.1)
    assert steal_share(before, before) is None and steal_share(None, after) is None
    now = cpu_times()
    if now is not None:  # Linux
        assert set(now) == set(before) and all(v >= 0 for v in now.values())
