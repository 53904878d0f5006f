"""The reasoning workflow end to end through the `embodied` CLI: the tiny recipe trains, checkpoints
and resumes; the warm-start gate refuses a weak start; `embodied plan` plans it; and (slow,
learning) GRPO raises the tiny model's held-out accuracy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fresh_cache import fresh_cache

ROOT = Path(__file__).resolve().parents[3]
CACHE = fresh_cache()  # profiles measured fresh by this test run
#: a 5-step SFT of a one-layer model on one-digit sums: seconds, and far from its accuracy target
TINY_SFT = ["warm_start.sft.steps=5", "warm_start.sft.model.num_layers=1", "warm_start.sft.data.digits=1",
            "warm_start.sft.data.test_size=20", "warm_start.sft.eval_problems=20", "warm_start.sft.val_problems=10",
            "warm_start.sft.check_every=5"]


def embodied(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT), "EMBODIED_CACHE": CACHE}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_warm_start_short_of_its_target_refuses_grpo(tmp_path) -> None:
    run = tmp_path / "never"
    result = embodied("train", "reasoning_grpo_tiny", f"run.dir={run}", f"warm_start.cache_dir={tmp_path / 'sft'}", *TINY_SFT)
    assert result.returncode == 2, result.stderr[-3000:]
    message = " ".join(result.stderr.split())
    assert "The SFT warm start did not reach its target" in message and "stopped by 'steps'" in message
    assert "warm_start.require_target=false" in message
    assert not run.exists()


def test_missing_model_or_files_are_user_errors(tmp_path) -> None:
    result = embodied("train", "reasoning_grpo", f"run.dir={tmp_path / 'never'}")
    assert result.returncode == 2 and "policy.kwargs.model_path is not set" in " ".join(result.stderr.split())
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
def test_tiny_recipe_trains_checkpoints_and_resumes(tmp_path) -> None:
    run = tmp_path / "tiny"
    common = [f"warm_start.cache_dir={tmp_path / 'sft'}", "warm_start.require_target=false", *TINY_SFT,
              "eval.problems=10", "eval.samples=2", "checkpoint.every=1", "logging.wandb=false",
              "cluster.backend=local"]  # the Ray path: test_reasoning_pipeline and the learning test
    result = embodied("train", "reasoning_grpo_tiny", f"run.dir={run}", "algo.iterations=2", *common)
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert Path(config["policy"]["kwargs"]["model_path"]).is_dir()  # the warm start's model, recorded
    assert config["data"]["train_files"] and config["data"]["val_files"]
    assert sorted(p.name for p in (run / "checkpoints").glob("iter_*")) == ["iter_000001", "iter_000002"]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["workflow"]["kind"] == "reasoning" and plan["candidates"] and (run / "profile.json").is_file()
    first = rows(run)
    assert [r["iteration"] for r in first] == [1, 2] and first[-1]["env_steps"] == 64  # prompts
    assert first[0]["warm_start/stop_reason"] == "steps"
    for key in ("reward/mean", "reward/acc", "reward/frac_reward_zero_std", "response_length/mean", "response_length/clip_ratio",
                "losses/entropy", "losses/ppo_kl", "losses/pg_clipfrac", "perf/rollout_tokens_per_s",
                "perf/trainer_tokens_per_s", "plan/predicted_iteration_s"):
        assert first[-1][key] is not None, key
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations"] == 2 and 0 <= summary["eval/greedy_acc"] <= 1 and "eval/pass@2" in summary
    assert 0 <= summary["reward/acc"] <= 1 and summary["perf/samples_per_s"] > 0 and "train/episode_return" not in summary
    assert "[train] 64/64 prompts (100%)" in result.stderr and "| reward " in result.stderr  # the progress line

    result = embodied("train", f"resume={run}", "algo.iterations=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr and "at iteration 2" in result.stderr
    assert [r["iteration"] for r in rows(run)] == [1, 2, 3]
    assert json.loads((run / "summary.json").read_text())["iterations"] == 3
    assert rows(run)[-1]["weights/version"] == 2  # the trainer's version continued from the checkpoint


@pytest.mark.slow
def test_plan_command_plans_the_reasoning_workflow(tmp_path) -> None:
    out, data = tmp_path / "plan.png", tmp_path / "plan.json"
    result = embodied("plan", "reasoning_grpo_tiny", f"warm_start.cache_dir={tmp_path / 'sft'}",
                      "warm_start.require_target=false", *TINY_SFT, "--out", str(out), "--json", str(data))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "workflow: 32 prompts x 8 responses" in result.stdout
    assert "predicted_s" in result.stdout and "chosen:" in result.stdout and "lower bound for any plan:" in result.stdout
    # the message probe ran between two worker processes on Ray and timed something
    latency = re.search(r"message latency ([0-9.]+) ms, ([0-9.]+) ms/MiB", result.stdout + result.stderr)
    assert latency and float(latency[1]) > 0, result.stdout[-2000:]
    assert out.stat().st_size > 10_000
    saved = json.loads(data.read_text())
    assert 0 < saved["bound"]["iteration_s"] <= saved["plan"]["predicted_iteration_s"] <= saved["sequential"]["predicted_iteration_s"]
    assert set(saved["bound"]["work_device_s"]) == {"rollout", "reward", "trainer"}


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.long_learning  # make test-learning: ~3 minutes of the suite's 30
def test_grpo_raises_the_tiny_models_held_out_accuracy(tmp_path) -> None:
    """The recipe as shipped (the calibrated, cached SFT warm start; Ray workers; the planner's plan),
    cut to 100 GRPO iterations: greedy and sampled accuracy on the same 500 held-out problems rise.

    The SFT stops at a sampled accuracy of ~30% by its rule, but the greedy accuracy it leaves
    depends on the host's floating-point sums (the same config on one thread: 625 steps and 67.6%
    in docs/reasoning.md, 690 steps and 80.2% on an AVX2-only AMD EPYC host), and so does the
    headroom above it. Measured from the 80.2% start: +4.6 greedy
    points after 60 iterations, +2.4 to +9.4 after 100 (sampled +11.4 to +13.5; a planned run's
    thread counts come from timings, so runs differ); from 67.6% (the learning benchmark): +17.4 and
    +11.5. The test asks for +6 sampled points (what GRPO's reward counts: 30 of the 500 problems,
    half the smallest gain measured) and +1 greedy point (greedy decoding is not what GRPO samples;
    a fresh-clone CI run on 2026-11-27 gained 2.4 of them after 100 iterations)."""
    run = tmp_path / "learn"
    result = embodied("train", "reasoning_grpo_tiny", f"run.dir={run}", "algo.iterations=100", "eval.every=0",
                      "eval.samples=4", "checkpoint.every=0", "logging.wandb=false", "logging.tensorboard=false",
                      "plan.replan_threshold=0", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    first, last = rows(run)[0], rows(run)[-1]
    # the SFT's greedy and sampled (pass@1) accuracy on the same 500 problems
    greedy, sampled = first["warm_start/eval_greedy_acc"], first["warm_start/eval_sampled_acc"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations"] == 100 and summary["eval/problems"] == 500
    gains = {"greedy": summary["eval/greedy_acc"] - greedy, "sampled": summary["eval/sampled_acc"] - sampled}
    assert gains["sampled"] >= 0.06 and gains["greedy"] >= 0.01, (gains, greedy, sampled)
    assert last["reward/frac_reward_zero_std"] < 0.5 and last["losses/non_finite_steps"] == 0
