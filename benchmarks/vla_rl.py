"""Learning benchmark: PPO and GRPO raise a behaviour-cloned tiny OpenVLA's success on ColorReach-v0.

    python -m benchmarks.vla_rl [--algos ppo grpo] [--eval-every-steps 5000] [--seed 0] [key=value ...]

For each algorithm, its recipe (``colorreach_openvla_ppo_tiny``, ``colorreach_openvla_grpo_tiny``):

1. the warm start: behaviour cloning of the recipe's ``warmstart.expert`` (cached, as
   ``embodied train`` does it; ``pipelines/warmstart.py``);
2. "before": the cloned policy evaluated on ``eval.episodes`` (100) episodes, greedy (the recipe's
   ``eval.deterministic``) and sampled at the policy's temperature;
3. RL: ``embodied train RECIPE`` in a subprocess, exactly as a user runs it (Ray workers, the
   Runner, the run dir), with an evaluation every ``--eval-every-steps`` env steps: the learning
   curve is the run's own ``eval/success_rate`` in ``metrics.jsonl`` and ``summary.json``;
4. "after": the run's final checkpoint evaluated as in 2 (its greedy number must equal the run's
   own final evaluation: the same episodes, a consistency check).

Before and after use the same protocol and the same evaluation episodes (seeds ``seed +
10_000_000 + i``, apart from training's and from the warm start's), so the delta is paired.

Target (issue 16): +20 points of greedy success for both algorithms.
Writes ``benchmarks/results/vla_rl.json`` and the curves beside it, ``vla_rl.png`` (``--name N``:
``vla_rl_N.{json,png}``; ``--combine FILE ...`` merges such results of one algorithm each).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.common import add_output_args, beside, result_path, save_result  # noqa: E402
from embodied.checkpoint import load_checkpoint  # noqa: E402
from embodied.config import to_dict  # noqa: E402
from embodied.metrics import read_metrics  # noqa: E402
from pipelines.cli import build_train_config, warm_start  # noqa: E402
from pipelines.config import EmbodiedConfig  # noqa: E402
from pipelines.onpolicy.workflow import EVAL_SEED_OFFSET, evaluate_weights  # noqa: E402
from pipelines.preflight import preflight  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"ppo": "colorreach_openvla_ppo_tiny", "grpo": "colorreach_openvla_grpo_tiny"}
COLORS = {"ppo": "#08519c", "grpo": "#a63603"}
TARGET_POINTS = 20.0
#: Overrides of every run: no wandb / TensorBoard files, checkpoints only at the end.
RUN_OVERRIDES = ("logging.wandb=false", "logging.tensorboard=false", "checkpoint.every=0")


def evaluate(cfg: EmbodiedConfig, spaces: tuple[Any, Any], state: dict[str, Any] | None) -> dict[str, Any]:
    """Greedy and sampled success of ``state`` (None: the config's ``policy.init``) on
    ``cfg.eval.episodes`` episodes of the same seeds; the success count and a 95% interval."""
    out: dict[str, Any] = {}
    for mode, deterministic in (("greedy", True), ("sampled", False)):
        run_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, deterministic=deterministic))
        stats = evaluate_weights(run_cfg, *spaces, state, None)
        rate = stats["eval/success_rate"]
        out[mode] = {"success_rate": rate, "successes": round(rate * cfg.eval.episodes),
                     "ci95": wilson(rate, cfg.eval.episodes), "episode_length": stats["eval/episode_length"]}
    return out


def headline_mode(cfg: EmbodiedConfig) -> str:
    """The evaluation the run itself does (``eval.deterministic``): its curve and the target's."""
    return "greedy" if cfg.eval.deterministic else "sampled"


def wilson(rate: float, n: int, z: float = 1.96) -> list[float]:
    """The Wilson score interval of a success rate over ``n`` episodes."""
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def train(recipe: str, overrides: list[str], run_dir: Path) -> float:
    """``embodied train RECIPE OVERRIDES run.dir=RUN_DIR`` in a subprocess (its progress lines on
    this terminal); returns its wall time. Raises on a failed run."""
    cmd = [sys.executable, "-m", "pipelines.cli", "train", recipe, *overrides, f"run.dir={run_dir}"]
    print("  $ embodied train " + " ".join(cmd[4:]), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    tick = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"embodied train {recipe} failed (exit {result.returncode}); see {run_dir / 'logs'}")
    return time.perf_counter() - tick


def learning_curve(run_dir: Path, before: float) -> dict[str, list]:
    """The run's evaluations ``(env_steps, wall_s, eval/success_rate)``, the warm start's at 0
    first and the final one last, and its training episodes' ``train/success_rate`` (the last 20
    episodes to finish: under GRPO, where every env runs one episode per iteration, these are the
    iteration's slowest, i.e. mostly its failures, so it reads low; not plotted)."""
    rows = read_metrics(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = [(0, 0.0, before)]
    evals += [(r["env_steps"], r["wall_s"], r["eval/success_rate"]) for r in rows if r.get("eval/success_rate") is not None]
    evals.append((summary["env_steps"], summary["wall_s"], summary["eval/success_rate"]))
    train_rows = [(r["env_steps"], r["wall_s"], r["train/success_rate"]) for r in rows if r.get("train/success_rate") is not None]
    return {"eval": evals, "train": train_rows}


def run_algorithm(name: str, args: argparse.Namespace, run_root: Path) -> dict[str, Any]:
    recipe = RECIPES[name]
    print(f"[{name}] {recipe}", flush=True)
    cfg = build_train_config([recipe, f"seed={args.seed}", *RUN_OVERRIDES, *args.overrides])
    every = max(1, round(args.eval_every_steps / cfg.steps_per_iteration))
    overrides = [f"seed={args.seed}", *RUN_OVERRIDES, f"eval.every={every}", *args.overrides]
    cfg = build_train_config([recipe, *overrides])
    t0 = time.perf_counter()
    print(f"[{name}] warm start (behaviour cloning of {cfg.warmstart.expert}, cached) ...", flush=True)
    cfg_init, warm = warm_start(cfg)
    assert warm is not None, f"{recipe} has no warmstart.expert"
    warm_s = time.perf_counter() - t0
    spaces = preflight(cfg_init)
    before = evaluate(cfg_init, spaces, None)
    print(f"[{name}] before RL: greedy {before['greedy']['success_rate']:.2f}, sampled "
          f"{before['sampled']['success_rate']:.2f} ({cfg.eval.episodes} episodes)", flush=True)
    run_dir = run_root / f"{name}-seed{args.seed}"
    train_s = train(recipe, overrides, run_dir)
    model, _, state = load_checkpoint(run_dir)
    after = evaluate(cfg_init, spaces, model)
    summary = json.loads((run_dir / "summary.json").read_text())
    headline = headline_mode(cfg)
    if abs(summary["eval/success_rate"] - after[headline]["success_rate"]) > 1e-9:
        raise RuntimeError(f"{name}: the run's final evaluation ({summary['eval/success_rate']}) differs from the "
                           f"checkpoint's {headline} re-evaluation ({after[headline]['success_rate']}) on the same episodes")
    delta = {mode: round(100 * (after[mode]["success_rate"] - before[mode]["success_rate"]), 1) for mode in ("greedy", "sampled")}
    print(f"[{name}] after RL: greedy {after['greedy']['success_rate']:.2f} ({delta['greedy']:+.1f} points), sampled "
          f"{after['sampled']['success_rate']:.2f} ({delta['sampled']:+.1f}); {summary['env_steps']:,} env steps, "
          f"{summary['wall_s'] / 60:.1f} min of RL", flush=True)
    return {
        "recipe": recipe,
        "command": f"embodied train {recipe} " + " ".join(overrides),
        "config": to_dict(cfg),
        "warm_start": {"cached": warm.cached, "wall_s": round(warm_s, 1), "metrics": warm.metrics},
        "before": before,
        "after": after,
        "delta_points": delta,
        "headline": headline,
        "target_met": delta[headline] >= TARGET_POINTS,
        "env_steps": summary["env_steps"],
        "iterations": summary["iterations"],
        "rl_wall_s": round(summary["wall_s"], 1),
        "train_process_wall_s": round(train_s, 1),
        "checkpoint_iteration": state["iteration"],
        "curve": learning_curve(run_dir, before[headline]["success_rate"]),
        "run_dir": str(run_dir),
    }


def plot(results: dict[str, dict[str, Any]], episodes: int, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.0), dpi=120)
    for name, res in results.items():
        steps, _, rate = zip(*res["curve"]["eval"])
        mode = res["headline"]
        ax.plot([s / 1000 for s in steps], rate, "o-", color=COLORS[name], lw=2,
                label=f"{name.upper()}: {mode}, {episodes} eval episodes ({res['delta_points'][mode]:+.0f} points)")
    ax.set_xlabel("RL env steps (thousands); 0 = the behaviour-cloned warm start")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Tiny OpenVLA on ColorReach-v0 (32x32 rgb + instruction): BC, then PPO / GRPO, 2 CPU cores", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--eval-every-steps", type=int, default=5000, help="env steps between the run's evaluations")
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser, "vla_rl")
    parser.add_argument("--run-root", type=Path, default=ROOT / "runs" / "vla_rl", help="where the runs' dirs go")
    parser.add_argument("--shared", action="store_true", help="record that other work ran on the machine (timings slower than idle)")
    parser.add_argument("--combine", nargs="+", type=Path, metavar="FILE",
                        help="merge earlier results of this benchmark (e.g. one per algorithm, run one after the other or "
                             "side by side: benchmarks/results/vla_rl_ppo.json ...) into one; runs nothing")
    parser.add_argument("overrides", nargs="*", help="config overrides of both recipes (key=value)")
    args = parser.parse_args(argv)
    path = result_path("vla_rl", args)
    if args.combine:
        return combine(args.combine, path, argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the warm start's progress lines
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_root = args.run_root / stamp
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    results = {name: run_algorithm(name, args, run_root) for name in args.algos}
    episodes = next(iter(results.values()))["config"]["eval"]["episodes"]
    png = plot(results, episodes, beside(path, ".png"))
    for name, res in results.items():
        print(f"{name.upper()}: " + ", ".join(
            f"{mode} {res['before'][mode]['success_rate']:.2f} -> {res['after'][mode]['success_rate']:.2f} "
            f"({res['delta_points'][mode]:+.1f} points)" for mode in ("greedy", "sampled"))
            + f"; target +{TARGET_POINTS:g} ({res['headline']}) {'met' if res['target_met'] else 'NOT met'}")
    out = {
        "target_points": TARGET_POINTS,
        "evaluation": {"episodes": episodes, "seeds": f"seed + {EVAL_SEED_OFFSET} + env index, the same before and after",
                       "headline": "greedy (argmax action tokens), the recipes' eval.deterministic=true",
                       "also": "sampled at the policy's temperature"},
        "seed": args.seed,
        "results": results,
        "conditions": {"shared_machine": args.shared, "load_avg_1_5_15_before": load_before,
                       "load_avg_1_5_15_after": os.getloadavg(), "cpu_cores": len(os.sched_getaffinity(0))},
        "wall_s": round(time.perf_counter() - t0, 1),
        "curve_png": png.name,
    }
    save_result(path, "vla_rl", argv, out, also=(png,))
    return out


def combine(files: list[Path], path: Path, argv: list[str] | None) -> dict[str, Any]:
    """One result, written to ``path``, of several runs of this benchmark (each with its own
    algorithms, in ``files``): their results side by side, each run's command and conditions kept."""
    parts = [json.loads(Path(f).read_text()) for f in files]
    names = [Path(f).stem for f in files]
    results: dict[str, Any] = {}
    for part in parts:
        overlap = set(results) & set(part["results"])
        if overlap:
            raise ValueError(f"--combine: {sorted(overlap)} appear in more than one of {names}")
        results.update(part["results"])
    episodes = parts[0]["evaluation"]["episodes"]
    png = plot(results, episodes, beside(path, ".png"))
    out = {
        "command": " && ".join(part["command"] for part in parts),
        "combined_from": names,
        "target_points": TARGET_POINTS,
        "evaluation": parts[0]["evaluation"],
        "seed": parts[0]["seed"],
        "results": results,
        "conditions": [part["conditions"] for part in parts],
        "wall_s": sum(part["wall_s"] for part in parts),
        "curve_png": png.name,
    }
    save_result(path, "vla_rl", argv, out, also=(png,))
    return out


if __name__ == "__main__":
    main()
