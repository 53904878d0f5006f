"""A VLA on a real ManiSkill task: scripted demos, SFT, then RL (the recipe's: GRPO by default), with the success before and after.

    python -m benchmarks.vla_real_task [--recipe maniskill_pushcube_openvlaoft_grpo_tiny] [--task PushCube-v1]
        [--demos-episodes 300] [--sft-epochs 15] [--eval-episodes 50] [--work runs/vla_real_task] [key=value ...]

Each step is the command a user runs, in a subprocess, and is skipped when its output is already
there (so a long run can be continued, or finished from steps run by hand with ``--demos``,
``--sft``, ``--run``, ``--before``):

1. ``embodied demos TASK episodes=N image_size=<recipe's>``: the scripted expert's successful episodes;
2. ``embodied sft RECIPE demos=... epochs=E lr=3e-4 batch_size=64``: the tiny OpenVLA-OFT cloned;
3. "before": ``embodied eval RECIPE policy.init=SFT_DIR eval.episodes=M`` (greedy, the recipe's eval seeds);
4. ``embodied train RECIPE policy.init=SFT_DIR``: RL from the SFT weights (``key=value`` overrides go here);
5. "after": ``embodied eval RUN_DIR eval.episodes=M``: the same episodes as 3, so the delta is paired.

Writes ``benchmarks/results/vla_real_task[_<name>].json`` (commands, SFT metrics, before/after
success, the run's learning curve) and the curve beside it as a PNG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_args, beside, result_path, save_result

EMBODIED = [sys.executable, "-m", "pipelines.cli"]


def run(cmd: list[str]) -> None:
    print("$ embodied " + " ".join(cmd), flush=True)
    subprocess.run(EMBODIED + cmd, check=True)


def newest_eval(folder: Path) -> Path:
    files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no evaluation result in {folder}")
    return files[-1]


def evaluation(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return {"file": str(path), **{k.removeprefix("eval/"): v for k, v in data["metrics"].items()}}


def curve(run_dir: Path) -> list[dict[str, float]]:
    points = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("eval/success_rate") is not None:
            points.append({"env_steps": row.get("env_steps"), "success": row["eval/success_rate"]})
    return points


def plot(points: list[dict[str, float]], before: float, after: float, title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([p["env_steps"] for p in points], [p["success"] for p in points], "o-", label="RL, the run's own evaluations")
    ax.axhline(before, color="gray", ls="--", label=f"after SFT: {before:.2f}")
    ax.axhline(after, color="green", ls=":", label=f"after RL: {after:.2f}")
    ax.set(xlabel="env steps of RL", ylabel="greedy success rate", ylim=(0, 1), title=title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="maniskill_pushcube_openvlaoft_grpo_tiny")
    parser.add_argument("--task", default="PushCube-v1")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--demos-episodes", type=int, default=300)
    parser.add_argument("--sft-epochs", type=int, default=15)
    parser.add_argument("--eval-episodes", type=int, default=50)
    parser.add_argument("--work", default="runs/vla_real_task")
    parser.add_argument("--demos", help="an existing demo file (skips step 1)")
    parser.add_argument("--sft", help="an existing SFT dir (skips step 2)")
    parser.add_argument("--before", help="an existing evaluation JSON of the SFT dir (skips step 3)")
    parser.add_argument("--run", help="an existing finished run dir (skips step 4)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the RL run")
    add_output_args(parser, "vla_real_task")
    args = parser.parse_args(argv)
    work = Path(args.work)
    demos = Path(args.demos or work / "demos.h5")
    sft = Path(args.sft or work / "sft")
    run_dir = Path(args.run or work / "rl")
    commands = {
        "demos": ["demos", args.task, f"episodes={args.demos_episodes}", f"image_size={args.image_size}", f"out={demos}"],
        "sft": ["sft", args.recipe, f"demos={demos}", f"out={sft}", f"epochs={args.sft_epochs}", "lr=3e-4", "batch_size=64"],
        "before": ["eval", args.recipe, f"policy.init={sft}", f"eval.episodes={args.eval_episodes}", "eval.num_envs=10", "eval.video=false"],
        "train": ["train", args.recipe, f"policy.init={sft}", f"run.dir={run_dir}", *args.overrides],
        "after": ["eval", str(run_dir), f"eval.episodes={args.eval_episodes}", "eval.num_envs=10", "eval.video=false"],
    }
    if not demos.exists():
        run(commands["demos"])
    if not (sft / "recipe.yaml").exists():
        run(commands["sft"])
    if args.before:
        before_file = Path(args.before)
    else:
        run(commands["before"])
        before_file = newest_eval(Path("runs") / f"eval-{args.recipe}" / "eval")
    if not (run_dir / "summary.json").exists():
        run(commands["train"])
    run(commands["after"])
    after_file = newest_eval(run_dir / "eval")
    before, after = evaluation(before_file), evaluation(after_file)
    sft_summary = json.loads((sft / "sft.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    points = curve(run_dir)
    result = {
        "task": args.task, "recipe": args.recipe, "commands": {k: "embodied " + " ".join(v) for k, v in commands.items()},
        "sft": {k: v for k, v in sft_summary["metrics"].items() if k != "sft/epochs"},
        "before": before, "after": after, "delta_points": round(100 * (after["success_rate"] - before["success_rate"]), 1),
        "rl": {"env_steps": summary.get("env_steps"), "wall_s": summary.get("wall_s") or summary.get("time/total_s"), "curve": points},
    }
    out = result_path("vla_real_task", args)
    save_result(out, "vla_real_task", argv, result)
    plot(points, before["success_rate"], after["success_rate"], f"tiny OpenVLA-OFT on {args.task} (64 px rgb)", beside(out, ".png"))
    print(json.dumps({"before": before["success_rate"], "after": after["success_rate"], "delta_points": result["delta_points"],
                      "json": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
