"""Where `embodied plan` draws its timeline (never into the current directory by default), and what
it says of a simulator on a described GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from pipelines.plan_cli import cmd_plan, default_plot_path
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


def test_plan_for_described_gpus_says_how_the_simulator_shares_its_gpu(tmp_path, monkeypatch, capsys):
    """``--gpus 1`` with the env on CUDA (measured on this machine's CPU): the candidates include
    both ways of sharing the GPU, and the chosen line names the one chosen."""
    monkeypatch.setenv("EMBODIED_CACHE", fresh_cache())
    assert cmd_plan(["gym_ppo", "env.id=tests.pipelines.reach_env:Reach1D", "env.num_envs=4", "algo.rollout_steps=8",
                     "cluster.backend=local", "workers.env_device=cuda", "workers.rollout_device=cuda",
                     "workers.trainer_device=cuda", "--gpus", "1", "--out", str(tmp_path / "plan.png")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"workflow: .*1 gpu devices.*\(described: --gpus\)", out)
    chosen = next(line for line in out.splitlines() if line.startswith("chosen:"))
    assert re.search(r", gpu sharing (switch \(one component at a time|overlap \(env and rollout side by side)", chosen), chosen
    assert "gpu=switch" in out and "gpu=overlap" in out  # the table's candidates
    # the sequential plan puts each component on the device it runs on, as the chosen plan does
    chosen_s, sequential_s = map(float, re.search(r"predicted ([\d.]+) s/iteration vs sequential ([\d.]+) s", out).groups())
    assert chosen_s <= sequential_s
