"""RL improves a behaviour-cloned tiny OpenVLA on ColorReach-v0, through `embodied train`.

The short version of ``benchmarks/vla_rl.py``: the warm start clones the careless expert (it heads
for the instructed target in 70% of its episodes, failures kept) from a few hundred
demonstrations, so the clone often heads for the wrong target; then `embodied train` (Ray workers,
the Runner, the run dir, the recipe's PPO or GRPO) runs a short RL phase, and the run's final
checkpoint is evaluated on the same sampled episodes as the warm start. The gain must be far
outside what chance gives (see MARGIN). To be short, every episode asks for the red target
(``env.kwargs.goal=red``): RL has to move the clone's choice to red, without the instruction to
read (the benchmark asks for both colours).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from embodied.checkpoint import load_checkpoint
from pipelines.cli import build_train_config, warm_start
from pipelines.embodied import evaluate_weights
from pipelines.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
EPISODES = 256
#: The required gain in sampled success. Before and after are evaluated on the same EPISODES
#: episodes (same seeds); even for two independent samples of success rates near 0.5 the standard
#: error of the difference is sqrt(2 * 0.25 / 256) = 0.044, so 0.15 is 3.4 standard errors.
MARGIN = 0.15
#: A warm start of a few hundred demonstrations and a short RL budget (minutes on 2 cores).
SHORT = ("env.kwargs.goal=red", "warmstart.episodes=600", "warmstart.epochs=4", "warmstart.stop_at_success=0", "seed=0",
         f"eval.episodes={EPISODES}", "eval.num_envs=32", "eval.deterministic=false",
         "logging.wandb=false", "logging.tensorboard=false", "checkpoint.every=0")
RL = {"grpo": ("colorreach_openvla_grpo_tiny", ("algo.total_env_steps=6144",)),
      "ppo": ("colorreach_openvla_ppo_tiny", ("algo.total_env_steps=8192",))}


def sampled_success(cfg, spaces, state) -> float:
    return evaluate_weights(cfg, *spaces, state, None)["eval/success_rate"]


def embodied_train(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=env)


def learns(algo: str, tmp_path: Path, monkeypatch) -> tuple[float, float]:
    """(sampled success of the warm start, of the RL run's final checkpoint) on one set of episodes."""
    recipe, budget = RL[algo]
    args = [recipe, *SHORT, *budget]
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))  # a fresh warm start, which the run then loads
    cfg, warm = warm_start(build_train_config(args))
    assert warm is not None and not warm.cached and warm.metrics["bc/episodes"] == 600
    spaces = preflight(cfg)
    before = sampled_success(cfg, spaces, None)
    run = tmp_path / "run"
    result = embodied_train([*args, f"run.dir={run}"], tmp_path / "cache")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "behaviour cloning from cache" in result.stdout + result.stderr  # the run started from that warm start
    model, _, _ = load_checkpoint(run)
    after = sampled_success(cfg, spaces, model)
    return before, after


@pytest.mark.slow
@pytest.mark.learning
def test_grpo_raises_the_success_of_a_behaviour_cloned_vla(tmp_path, monkeypatch):
    before, after = learns("grpo", tmp_path, monkeypatch)
    assert after >= before + MARGIN, (before, after)


@pytest.mark.slow
@pytest.mark.learning
def test_ppo_raises_the_success_of_a_behaviour_cloned_vla(tmp_path, monkeypatch):
    before, after = learns("ppo", tmp_path, monkeypatch)
    assert after >= before + MARGIN, (before, after)
