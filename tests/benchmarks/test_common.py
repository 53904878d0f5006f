"""What every benchmark result records about how and where it ran."""

from __future__ import annotations

import sys

import pytest

import benchmarks.common as common
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


def test_a_result_is_named_after_its_benchmark_its_variant_and_the_users_name(tmp_path, monkeypatch):
    import argparse

    from benchmarks.common import add_output_args, beside, result_path

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    parser = argparse.ArgumentParser()
    add_output_args(parser, "m2flow_sweep")
    assert result_path("m2flow_sweep", parser.parse_args([])) == tmp_path / "m2flow_sweep.json"
    assert result_path("m2flow_sweep", parser.parse_args([]), "quick") == tmp_path / "m2flow_sweep_quick.json"
    assert result_path("m2flow_sweep", parser.parse_args(["--name", "epyc"]), "trace") == tmp_path / "m2flow_sweep_trace_epyc.json"
    # a name that already carries the stem is not repeated
    assert result_path("m2flow_sweep", parser.parse_args(["--name", "m2flow_sweep_quiet"])) == tmp_path / "m2flow_sweep_quiet.json"
    assert result_path("m2flow_sweep", parser.parse_args(["--name", "m2flow_sweep"])) == tmp_path / "m2flow_sweep.json"
    out = tmp_path / "elsewhere" / "mine.json"
    assert result_path("m2flow_sweep", parser.parse_args(["--out", str(out), "--name", "x"]), "quick") == out
    assert beside(out, "_timeline.png") == tmp_path / "elsewhere" / "mine_timeline.png" and out.parent.is_dir()


def test_a_saved_result_says_what_ran_where_and_at_which_commit(tmp_path, capsys):
    import json

    from benchmarks.common import commit_info, save_result

    path = save_result(tmp_path / "r" / "weight_sync.json", "weight_sync", ["--repeats", "2"], {"sync_s": 0.5},
                       also=(tmp_path / "r" / "weight_sync.png",))
    saved = json.loads(path.read_text())
    assert saved["benchmark"] == "weight_sync" and saved["command"] == "python -m benchmarks.weight_sync --repeats 2"
    assert saved["machine"]["cpu_cores"] >= 1 and saved["sync_s"] == 0.5
    assert saved["commit"] == commit_info() and set(saved["commit"]) == {"commit", "dirty"}
    if saved["commit"]["commit"] is not None:  # a git checkout
        assert len(saved["commit"]["commit"]) == 40 and isinstance(saved["commit"]["dirty"], bool)
    assert capsys.readouterr().out == f"wrote {path} and {tmp_path / 'r' / 'weight_sync.png'}\n"
