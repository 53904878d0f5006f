"""What every benchmark result records about how and where it ran."""

from __future__ import annotations

import sys

from benchmarks.common import command_of, machine_info


def test_the_command_is_the_one_that_ran(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["m2flow_pipelining.py", "--reprofile", "--name", "r2"])
    assert command_of("m2flow_pipelining", None) == "python -m benchmarks.m2flow_pipelining --reprofile --name r2"
    assert command_of("m2flow_pipelining", ["--iterations", "3"]) == "python -m benchmarks.m2flow_pipelining --iterations 3"
    assert command_of("m2flow_pipelining", []) == "python -m benchmarks.m2flow_pipelining"


def test_machine_info_names_the_cpu_model_and_its_vector_units():
    info = machine_info()
    assert info["cpu_cores"] >= 1 and isinstance(info["cpu_model"], str) and info["cpu_model"]
    assert set(info["cpu_vector_units"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
