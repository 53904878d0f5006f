"""``embodied plot RUN_DIR``: a run's learning curve into the run dir, or where ``--out`` says;
a wrong run dir or metric is a user error (exit code 2) that writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from embodied.metrics import MetricsLogger
from pipelines.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run dir as a run leaves it: metrics.jsonl and summary.json written by the run's own
    MetricsLogger, and its config.yaml."""
    run = tmp_path / "runs" / "cartpole_ppo-20261201-120000"
    run.mkdir(parents=True)
    config = {"recipe": "cartpole_ppo", "env": {"id": "CartPole-v1", "obs_mode": "state"}, "algo": {"name": "ppo"},
              "eval": {"episodes": 8, "deterministic": True}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    logger = MetricsLogger(run, config, tensorboard=False, wandb=False)
    for i in range(1, 6):
        row = {"iteration": i, "env_steps": 256 * i, "wall_s": 2.0 * i, "train/episode_return": 20.0 * i,
               "train/success_rate": 0.2 * i, "losses/pg": 0.1 / i}
        if i == 3:
            row.update({"eval/success_rate": 0.5, "eval/episode_return": 60.0})
        logger.log(row)
    logger.summary({"recipe": "cartpole_ppo", "iterations": 5, "env_steps": 1280, "wall_s": 10.5,
                    "eval/success_rate": 0.875, "eval/episode_return": 95.0})
    logger.close()
    return run


def _results_files() -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in RESULTS.glob("*")} if RESULTS.is_dir() else {}


def test_the_curve_goes_into_the_run_dir(run_dir, capsys):
    before = _results_files()
    assert main(["plot", str(run_dir)]) == 0
    png, points = run_dir / "learning_curve.png", run_dir / "learning_curve.json"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
    data = json.loads(points.read_text())
    (success,) = data["curves"]
    assert success["metric"] == "success_rate" and success["target"] == 0.8
    assert [v for _, _, v in success["train"]] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    # the evaluation during the run, then the final one of summary.json
    assert success["eval"] == [[6.0, 768, 0.5], [10.5, 1280, 0.875]]
    assert success["first_eval_at_target"] == {"wall_s": 10.5, "env_steps": 1280}
    assert data["run"] == {"env": "CartPole-v1", "obs_mode": "state", "algo": "ppo"} and data["png"] == "learning_curve.png"
    assert f"wrote {png}" in capsys.readouterr().out
    assert _results_files() == before  # nothing of benchmarks/results/ touched


def test_out_puts_the_picture_where_asked_with_a_panel_per_metric(run_dir, tmp_path):
    out = tmp_path / "figures" / "cartpole.png"
    assert main(["plot", str(run_dir), "--out", str(out), "--metric", "success_rate", "episode_return", "losses/pg"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    data = json.loads(out.with_suffix(".json").read_text())
    assert [c["metric"] for c in data["curves"]] == ["success_rate", "episode_return", "losses/pg"]
    assert [c["target"] for c in data["curves"]] == [0.8, None, None]
    assert data["curves"][1]["eval"][-1] == [10.5, 1280, 95.0] and len(data["curves"][2]["train"]) == 5
    assert not (run_dir / "learning_curve.png").exists()
    # a folder: the picture's default name in it
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "figures"), "--target", "50"]) == 0
    assert json.loads((tmp_path / "figures" / "learning_curve.json").read_text())["curves"][0]["target"] == 50


@pytest.mark.parametrize("args, says", [
    (["{missing}"], "is not a run dir: it does not exist"),
    (["{empty}"], "is not a run dir: it has no metrics.jsonl"),
    (["{run}", "--metric", "succes_rate"], "Did you mean 'success_rate'"),
    (["{run}", "--out", "{tmp}/curve.json"], "must end in .png, .svg, .pdf"),
])
def test_a_wrong_run_dir_metric_or_out_is_one_paragraph_and_exit_code_2(run_dir, tmp_path, capsys, args, says):
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "no-such-run", "empty": tmp_path / "empty", "run": run_dir, "tmp": tmp_path}
    before = sorted(p for p in tmp_path.rglob("*"))
    assert main(["plot", *(a.format(**paths) for a in args)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("embodied plot: error:") and says in err.replace("\n", " ") and "\n\n" not in err.strip()
    assert "Traceback" not in err
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written
