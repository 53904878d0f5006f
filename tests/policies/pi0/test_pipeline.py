"""One PPO iteration of a tiny π0 and one GRPO iteration of a tiny π0.5 through the Ray pipeline
(`embodied train`, env / rollout / trainer workers) on ColorReach-v0: the flow policies fit the
Policy contract the algorithms and workers use."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]
COMMON = """\
env: {id: ColorReach-v0, num_envs: 8, obs_mode: state+rgb, image_size: 32}
eval: {episodes: 2, num_envs: 2, deterministic: true}
logging: {wandb: false, tensorboard: false}
checkpoint: {every: 0}
plan: {profile: false}
"""
RECIPES = {
    "ppo": "policy: {name: pi0, kwargs: {tiny: {}, noise_method: flow_sde}}\n"
           "algo: {name: ppo, total_env_steps: 32, rollout_steps: 4, epochs: 1, num_minibatches: 2, gamma: 0.9}\n",
    "grpo": "policy: {name: pi05, kwargs: {tiny: {}, add_value_head: 0, noise_method: flow_noise}}\n"
            "algo: {name: grpo, group_size: 4, outcome: return, total_env_steps: 96, rollout_steps: 12, epochs: 1,"
            " num_minibatches: 2, gamma: 0.9}\n",
}


@pytest.mark.slow
@pytest.mark.heavy  # Ray workers start: about a minute each
@pytest.mark.timeout(900)
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_one_iteration_through_the_ray_pipeline(tmp_path: Path, algo: str) -> None:
    recipe = tmp_path / f"pi0_{algo}.yaml"
    recipe.write_text(f"description: one {algo} iteration of a tiny flow policy\n" + COMMON + RECIPES[algo])
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", str(recipe), f"run.dir={run}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=800, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = next(m for m in metrics if "losses/policy" in m)
    assert math.isfinite(losses["losses/policy"]) and losses["losses/non_finite_steps"] == 0
    assert ("losses/value" in losses) == (algo == "ppo")
    assert abs(losses["losses/ratio_mean"] - 1.0) < 0.05  # act and evaluate score the same chain
