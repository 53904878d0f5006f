"""M2Flow on the job users run first: the prediction before any re-planning, from a cold cache and
from the cache the first run refined (``plan.learn``, :mod:`pipelines.learn`).

Runs the first ``--iterations`` iterations of ``embodied train RECIPE`` twice, as a user would, on a
fresh profile cache: the first run profiles (cold), plans, calibrates (:mod:`pipelines.calibrate`,
with the iteration budget of the whole run: ``plan.calibrate`` of the recipe's iterations) and,
after its first iterations, refines the cached profile with what it measured; the second run plans
from that (warm). Re-planning is off (``plan.replan_threshold=0``). Per run it reports the plan
the run settled on, its predicted seconds per iteration and the measured ones after calibration,
the error, and the probes' prediction of the planner's first choice (what the run would predict
without calibration).

    python -m benchmarks.m2flow_sweep --learning                     # the default job, 32 iterations per run (~8 min)
    python -m benchmarks.m2flow_sweep halfcheetah_ppo --learning --iterations 20
    python -m benchmarks.m2flow_sweep --learning plan.calibrate=0    # the probes' prediction alone

Writes ``benchmarks/results/m2flow_sweep_learning.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import result_path, save_result
from embodied.config import apply_overrides
from pipelines.config import EmbodiedConfig
from pipelines.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[2]
#: the recipe of the default job, which users run first
DEFAULT_RECIPE = "maniskill_pushcube_ppo"
#: training iterations per run: calibration measures the planner's choice for ~16 s (a quarter of
#: the run at most) besides the other candidates, and needs iterations after it to be judged on
ITERATIONS = 32


def train(recipe: str, run_dir: Path, cache: Path, overrides: list[str]) -> tuple[list[dict[str, Any]], str]:
    """One ``embodied train`` run; its metrics rows and its output."""
    env = {**os.environ, "EMBODIED_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pipelines.cli", "train", recipe, f"run.dir={run_dir}", *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, proc.stdout + proc.stderr


def summarize(rows: list[dict[str, Any]], output: str) -> dict[str, Any]:
    """The prediction the run settled on against the iterations after the warm-up and calibration."""
    timed = [r for r in rows[1:] if r.get("plan/measured_over_predicted") is not None and not r.get("plan/calibrating")]
    if not timed:
        raise RuntimeError("no iteration ran after calibration: raise --iterations")
    measured = statistics.median(r["time/iteration_s"] for r in timed)
    predicted = timed[0]["plan/predicted_iteration_s"]
    return {
        "plan": f"{timed[0]['plan/mode']}, {timed[0]['plan/chunks']} chunk(s)",
        "predicted_s": predicted,
        "measured_s": measured,
        "measured_all_s": [r["time/iteration_s"] for r in rows],
        "error": (predicted - measured) / measured,
        "first_choice": f"{rows[0]['plan/mode']}, {rows[0]['plan/chunks']} chunk(s)",
        "profiled_predicted_s": rows[0]["plan/predicted_iteration_s"],
        "calibration_iterations": sum(1 for r in rows if r.get("plan/calibrating")),
        "m2flow_lines": [line for line in output.splitlines() if "[m2flow]" in line],
    }


def run(args: argparse.Namespace, argv: list[str] | None, recipe: str, overrides: list[str]) -> dict[str, Any]:
    """Two runs of ``recipe`` (``args.iterations`` iterations each, :data:`ITERATIONS` by default)
    on one fresh profile cache, cold then warm, with ``overrides``; prints and writes what each
    settled on and how its prediction held."""
    iterations = args.iterations or ITERATIONS
    _, data = load_recipe(recipe)
    cfg = apply_overrides(EmbodiedConfig, data, overrides)
    steps = iterations * cfg.steps_per_iteration
    # the whole run's calibration budget over the shorter run
    share = min(1.0, cfg.plan.calibrate * (cfg.algo.total_env_steps // cfg.steps_per_iteration) / iterations)
    fixed = [f"algo.total_env_steps={steps}", f"plan.calibrate={share:.4f}", "plan.replan_threshold=0", "eval.episodes=1",
             "eval.num_envs=1", "eval.video=false", "checkpoint.every=0", "logging.tensorboard=false",
             "logging.wandb=false", "logging.progress=none", *overrides]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for name in ("cold", "warm"):
            print(f"{name} cache: embodied train {recipe} ({iterations} iterations) ...", flush=True)
            rows, output = train(recipe, Path(tmp) / name, cache, fixed)
            runs[name] = summarize(rows, output)
            r = runs[name]
            print(f"  {r['plan']}: predicted {r['predicted_s']:.3f} s, measured {r['measured_s']:.3f} s "
                  f"({100 * r['error']:+.1f}%); the probes priced the first choice ({r['first_choice']}) at "
                  f"{r['profiled_predicted_s']:.3f} s; {r['calibration_iterations']} calibration iteration(s)", flush=True)
            for line in r["m2flow_lines"]:
                print(f"    {line}", flush=True)
    result = {"mode": "learning", "recipe": recipe, "iterations": iterations, "overrides": fixed, "runs": runs}
    save_result(result_path("m2flow_sweep", args, "learning"), "m2flow_sweep", argv, result)
    return result
