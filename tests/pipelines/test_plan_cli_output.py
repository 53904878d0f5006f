"""Where `embodied plan` draws its timeline: never into the current directory by default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from pipelines.plan_cli import default_plot_path
from tests.fresh_cache import fresh_cache

ROOT = Path(__file__).resolve().parents[2]


def test_plan_draws_into_runs_plans_not_the_current_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": fresh_cache(), "WANDB_MODE": "offline"}
    env.pop("RAY_AUTH_MODE", None)
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "plan", "gym_ppo", "env.id=tests.pipelines.reach_env:Reach1D",
         "env.num_envs=4", "algo.rollout_steps=8", "cluster.backend=local"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    png = Path("runs") / "plans" / "gym_ppo.png"
    assert f"timeline: {png}" in result.stdout
    assert (tmp_path / png).stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]  # nothing else in the current directory


def test_plan_of_an_existing_run_draws_into_the_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: gym_ppo\n")
    assert default_plot_path(SimpleNamespace(recipe="gym_ppo", run=SimpleNamespace(dir=str(run)))) == run / "plan.png"
    fresh = tmp_path / "not-yet"  # a run dir that `embodied train` will create must stay empty
    assert default_plot_path(SimpleNamespace(recipe="gym_ppo", run=SimpleNamespace(dir=str(fresh)))) == Path("runs/plans/gym_ppo.png")
    assert default_plot_path(SimpleNamespace(recipe="gym_ppo", run=SimpleNamespace(dir=None))) == Path("runs/plans/gym_ppo.png")
