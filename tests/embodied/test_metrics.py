"""Every iteration exactly once in metrics.jsonl, TensorBoard and wandb, across crashes, resumes and
full disks."""

from __future__ import annotations

import json
import logging
import textwrap

import pytest

from embodied.metrics import MetricsLogger, ResumePoint, read_metrics, repair_metrics
from tests.embodied.small_disk import run_on_small_disk


def _row(iteration: int, value: float) -> dict:
    return {"iteration": iteration, "env_steps": iteration * 100, "train/episode_return": value}


def _logger(run_dir, resume_from=None, tensorboard=False, wandb=False):
    return MetricsLogger(run_dir, {"seed": 1}, tensorboard=tensorboard, wandb=wandb, wandb_mode="offline",
                         resume_from=resume_from)


def test_resume_keeps_every_iteration_exactly_once(tmp_path):
    with _logger(tmp_path) as logger:
        for it in range(1, 6):
            logger.log(_row(it, float(it)))
    with open(tmp_path / "metrics.jsonl", "a") as f:  # the crash tore the next row
        f.write('{"iteration": 6, "env_st')
    # the last checkpoint was iteration 3: iterations 4.. run again
    with _logger(tmp_path, ResumePoint(iteration=3, step=300)) as logger:
        for it in range(4, 8):
            logger.log(_row(it, 10.0 * it))
    rows = read_metrics(tmp_path)
    assert rows.skipped == 0
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["train/episode_return"] for r in rows] == [1.0, 2.0, 3.0, 40.0, 50.0, 60.0, 70.0]


def test_a_torn_last_line_never_crashes_a_reader_and_is_counted(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_row(1, 1.0)) + "\n" + json.dumps(_row(2, 2.0)) + "\n" + '{"iteration": 3, "env')
    with caplog.at_level(logging.WARNING, logger="embodied.metrics"):
        rows = read_metrics(tmp_path)
    assert [r["iteration"] for r in rows] == [1, 2] and rows.skipped == 1
    assert "skipped 1 unreadable line(s) (line 3)" in caplog.text
    # a complete JSON object without its newline is a cut write too
    path.write_text(json.dumps(_row(1, 1.0)) + "\n" + json.dumps(_row(2, 2.0)))
    rows = read_metrics(tmp_path)
    assert [r["iteration"] for r in rows] == [1] and rows.skipped == 1
    assert read_metrics(tmp_path / "nope") == [] and read_metrics(tmp_path / "nope").skipped == 0


def test_opening_drops_a_torn_line_so_new_rows_do_not_merge_into_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_row(1, 1.0)) + "\n" + '{"iteration": 2, "env_st')
    with _logger(tmp_path) as logger:
        logger.log(_row(2, 2.0))
    assert path.read_text() == json.dumps(_row(1, 1.0)) + "\n" + json.dumps(_row(2, 2.0)) + "\n"


def test_repair_is_a_no_op_on_a_clean_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_row(1, 1.0)) + "\n")
    before = path.stat().st_mtime_ns
    assert repair_metrics(tmp_path, keep_through=5) == 0
    assert path.stat().st_mtime_ns == before


def test_tensorboard_replaces_the_abandoned_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with _logger(tmp_path, tensorboard=True) as logger:
        for it in range(1, 6):
            logger.log(_row(it, float(it)))
    with _logger(tmp_path, ResumePoint(iteration=3, step=300), tensorboard=True) as logger:
        for it in range(4, 7):
            logger.log(_row(it, 10.0 * it))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("train/episode_return")
    assert [(e.step, e.value) for e in events] == [(100, 1.0), (200, 2.0), (300, 3.0), (400, 40.0), (500, 50.0), (600, 60.0)]


def test_wandb_continues_the_same_run_rewound_after_the_resume_point(tmp_path):
    with _logger(tmp_path, wandb=True) as logger:
        first_id = logger.wandb_run.id
        for it in range(1, 4):
            logger.log(_row(it, float(it)))
    with _logger(tmp_path, ResumePoint(iteration=2, step=200), wandb=True) as logger:
        run = logger.wandb_run
        assert run.id == first_id
        moment = run.settings.resume_from
        assert (moment.run, moment.metric, moment.value) == (first_id, "_step", 201)
        logger.log(_row(3, 30.0))


def test_a_full_disk_raises_storage_error_without_a_torn_row():
    """Rows are appended until the (real, tiny) disk is full: the write that fails raises
    StorageError naming the file and the free space, and the file still ends with a complete
    row that a reader takes in full."""
    script = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from embodied.errors import StorageError, exit_code_of
        from embodied.metrics import MetricsLogger, read_metrics
        run = Path(sys.argv[1])
        logger = MetricsLogger(run, {}, tensorboard=False, wandb=False)
        out = {"written": 0}
        try:
            for it in range(1, 100_000):
                logger.log({"iteration": it, "env_steps": it, "pad": "x" * 500})
                out["written"] = it
        except StorageError as err:
            out["error"], out["code"] = str(err), exit_code_of(err)
        logger.close()
        text = (run / "metrics.jsonl").read_bytes()
        rows = read_metrics(run)
        out["ends_with_newline"] = text.endswith(b"\\n")
        out["rows"], out["skipped"], out["last"] = len(rows), rows.skipped, rows[-1]["iteration"]
        print(json.dumps(out))
    """)
    result, how = run_on_small_disk(script, size_kib=256)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["code"] == 4 and out["written"] > 100
    assert out["error"].startswith("Writing metrics.jsonl failed at ") and "metrics.jsonl: " in out["error"]
    assert "free on its file system" in out["error"]
    assert out["ends_with_newline"] and out["skipped"] == 0
    assert out["rows"] == out["written"] == out["last"]
