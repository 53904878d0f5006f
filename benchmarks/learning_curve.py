"""Learning curve of a run: success rate (or, for envs without one, the episode return) against
wall time, as PNG + JSON.

    python -m benchmarks.learning_curve RUN_DIR [--name pushcube_learning_curve] [--metric episode_return]

Reads the run's metrics.jsonl (train/* every iteration, eval/* where the run evaluated) and
summary.json (the final evaluation), and writes benchmarks/results/<name>.{png,json}.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.common import RESULTS, write_result  # noqa: E402
from embodied.metrics import read_metrics  # noqa: E402


def curve(run_dir: Path, metric: str = "success_rate", target: float = 0.8) -> dict[str, Any]:
    """Train and evaluation points ``(wall_s, env_steps, value)`` of ``train/<metric>`` and
    ``eval/<metric>``, and when the evaluation first reached ``target``."""
    rows = read_metrics(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    train = [(r["wall_s"], r["env_steps"], r[f"train/{metric}"]) for r in rows if r.get(f"train/{metric}") is not None]
    evals = [(r["wall_s"], r["env_steps"], r[f"eval/{metric}"]) for r in rows if r.get(f"eval/{metric}") is not None]
    if summary.get(f"eval/{metric}") is not None:
        evals.append((summary["wall_s"], summary["env_steps"], summary[f"eval/{metric}"]))
    first = next(((w, s) for w, s, v in evals if v >= target), None)
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    deterministic = config.get("eval", {}).get("deterministic", True)
    env, algo = config.get("env", {}), config.get("algo", {})
    return {"metric": metric, "target": target, "train": train, "eval": evals, "summary": summary,
            "eval_deterministic": deterministic, "eval_episodes": config.get("eval", {}).get("episodes"),
            "first_eval_at_target": {"wall_s": first[0], "env_steps": first[1]} if first else None,
            "run": {"env": env.get("id"), "obs_mode": env.get("obs_mode"), "algo": algo.get("name", "ppo")}}


def default_title(data: dict[str, Any], cores: int) -> str:
    """``<env> (<obs mode>), <ALGO>, <n> CPU cores: <metric> vs wall time`` from the run's config."""
    run = data.get("run", {})
    what = f"{run.get('env') or 'env'} ({run.get('obs_mode') or 'state'}), {str(run.get('algo') or 'ppo').upper()}"
    return f"{what}, {cores} CPU cores: {data['metric'].replace('_', ' ')} vs wall time"


def plot(data: dict[str, Any], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    if data["train"]:
        w, _, v = zip(*data["train"])
        ax.plot([x / 60 for x in w], v, color="#9ecae1", lw=1.2, label="train episodes (last 20)")
    if data["eval"]:
        w, _, v = zip(*data["eval"])
        how = "mean action" if data["eval_deterministic"] else "sampled actions"
        ax.plot([x / 60 for x in w], v, "o-", color="#08519c", lw=2,
                label=f"evaluation, {data['eval_episodes']} episodes ({how})")
    ax.axhline(data["target"], color="#cb181d", ls="--", lw=1, label=f"target {data['target']:g}")
    ax.set_xlabel("wall time (minutes)")
    ax.set_ylabel(data["metric"].replace("_", " "))
    if data["metric"] == "success_rate":
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", default="pushcube_learning_curve")
    parser.add_argument("--title", default=None, help="default: env, observations and algorithm of the run")
    parser.add_argument("--metric", default="success_rate", choices=["success_rate", "episode_return"])
    parser.add_argument("--target", type=float, default=0.8)
    args = parser.parse_args(argv)
    data = curve(args.run_dir, args.metric, args.target)
    png = plot(data, RESULTS / f"{args.name}.png", args.title or default_title(data, os.cpu_count() or 1))
    path = write_result(args.name, {"benchmark": "learning_curve", "run_dir": str(args.run_dir), **data, "png": png.name})
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
