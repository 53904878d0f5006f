"""How still this machine holds the time of identical work: a recipe's simulator alone, in blocks
of exactly the same steps, in fresh processes, with nothing of Embodied's pipeline in the loop.

Each block resets the recipe's vectorized env with the same seed and steps it with the same
random actions (``--steps`` batch steps; by default the recipe's ``algo.rollout_steps``), so every
block simulates the same physics: any difference in its time is the machine's. Each of
``--processes`` fresh Python processes builds the env once (its worker processes, as the recipe
runs them) and times ``--blocks`` blocks; around every block it records the env's CPU seconds
(its worker processes' and this process's, which drives them), the share of CPU time the
hypervisor stole (``/proc/stat``) and the one-thread reference workload
(``benchmarks.common.host_reference_s``).

What it is for: the M2Flow sweep (``benchmarks.m2flow_sweep``) prices a plan from calibration
iterations and measures it minutes later in workers built afresh. No prediction can hold closer
than the same work's own time holds between two such moments, so this is the floor under the
sweep's errors on this machine: the spread of a block within one process (seconds apart) and of
a process's median against another's (a fresh build, as each sweep candidate is).

    python -m benchmarks.host_noise [--recipe maniskill_pushcube_ppo] [--processes 4] [--blocks 5] [--steps N]

Writes ``benchmarks/results/host_noise.json`` and the picture beside it, ``host_noise.png``.
"""

from __future__ import annotations

import os

for _key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_key, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks.common import (  # noqa: E402
    add_output_args,
    beside,
    cpu_times,
    host_reference_s,
    result_path,
    save_result,
    steal_share,
)

ROOT = Path(__file__).resolve().parents[1]
_MARK = "HOST_NOISE_BLOCK "


def run_blocks(recipe: str, blocks: int, steps: int | None, overrides: Sequence[str] = ()) -> list[dict[str, float]]:
    """In this process: build ``recipe``'s env and time ``blocks`` identical blocks of it."""
    import numpy as np

    from benchmarks.env_throughput import process_cpu_s
    from envs.base import random_actions
    from envs.registry import make_vec_env
    from envs.vulkan import ensure_vulkan_env
    from pipelines.cli import build_train_config

    ensure_vulkan_env()
    cfg = build_train_config([recipe, *overrides])
    steps = steps or cfg.algo.rollout_steps
    env = make_vec_env(cfg.env, seed=cfg.seed)
    try:
        actions = random_actions(env.action_space, (steps, env.num_envs), np.random.default_rng(0))
        pids = list(getattr(env, "pids", ()))
        rows = []
        for _ in range(blocks):
            reference = host_reference_s(3)
            env.reset(seed=cfg.seed)
            cpu0, ticks0, own0 = sum(map(process_cpu_s, pids)), cpu_times(), time.process_time()
            start = time.perf_counter()
            for t in range(steps):
                obs = env.step(actions[t]).obs
            wall = time.perf_counter() - start
            rows.append({
                "wall_s": wall,
                # the last observation's sum: equal in every block when the blocks simulate the same physics
                "checksum": float(sum(np.asarray(v, dtype=np.float64).sum() for v in _arrays(obs))),
                "env_cpu_s": sum(map(process_cpu_s, pids)) - cpu0 + time.process_time() - own0,
                "steal": steal_share(ticks0, cpu_times()),
                "reference_s": reference,
            })
        return rows
    finally:
        env.close()


def _arrays(obs: Any) -> list[Any]:
    return list(obs.values()) if isinstance(obs, dict) else [obs]


def _spread(values: Sequence[float]) -> float:
    return max(values) / min(values)


def summarize(processes: Sequence[Sequence[dict[str, float]]]) -> dict[str, Any]:
    """Spread of the same work's time: within a process (its blocks, seconds apart), across
    processes (their medians: fresh builds), and over every block; the same for the env's CPU
    seconds (a block that costs more CPU for the same work ran on a slower core, not in a queue)."""
    walls = [[b["wall_s"] for b in blocks] for blocks in processes]
    cpus = [[b["env_cpu_s"] for b in blocks] for blocks in processes]
    every = [w for ws in walls for w in ws]
    medians = [statistics.median(ws) for ws in walls]
    references = [b["reference_s"] for blocks in processes for b in blocks]
    steals = [b["steal"] for blocks in processes for b in blocks if b["steal"] is not None]
    return {
        "median_s": statistics.median(every),
        "min_s": min(every),
        "max_s": max(every),
        "spread": _spread(every),  # slowest / fastest block of the same work
        "cv": statistics.pstdev(every) / statistics.fmean(every),
        "within_process_spread": statistics.median(_spread(ws) for ws in walls),
        "across_process_spread": _spread(medians),
        "process_medians_s": medians,
        "largest_deviation_from_median": max(abs(w / statistics.median(every) - 1) for w in every),
        "cpu_spread": _spread([c for cs in cpus for c in cs]),
        "reference_spread": _spread(references),
        "steal_max": max(steals) if steals else None,
        "same_work": len({round(b["checksum"], 6) for blocks in processes for b in blocks}) == 1,
    }


def _child(args: argparse.Namespace) -> None:
    for row in run_blocks(args.recipe, args.blocks, args.steps, args.overrides):
        print(_MARK + json.dumps(row), flush=True)


def _spawn(args: argparse.Namespace, index: int) -> list[dict[str, float]]:
    cmd = [sys.executable, "-m", "benchmarks.host_noise", "--child", "--recipe", args.recipe, "--blocks", str(args.blocks)]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([*cmd, *args.overrides], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"process {index} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line[len(_MARK):]) for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if len(rows) != args.blocks:
        raise RuntimeError(f"process {index} reported {len(rows)} of {args.blocks} blocks:\n{done.stdout[-3000:]}")
    for b, row in enumerate(rows):
        print(f"  process {index} block {b}: {row['wall_s']:.3f} s, env CPU {row['env_cpu_s']:.2f} s, "
              f"reference {row['reference_s'] * 1e3:.0f} ms, steal {100 * (row['steal'] or 0):.1f}%", flush=True)
    return rows


def plot(processes: Sequence[Sequence[dict[str, float]]], summary: dict[str, Any], title: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, blocks in enumerate(processes):
        ax.plot(range(len(blocks)), [b["wall_s"] for b in blocks], marker="o", label=f"process {i}")
    ax.axhline(summary["median_s"], color="black", linestyle="--", linewidth=1, label="median")
    ax.axhspan(0.85 * summary["median_s"], 1.15 * summary["median_s"], color="grey", alpha=0.15,
               label="median +-15% (the M2Flow sweep's target)")
    ax.set_xticks(range(max(len(blocks) for blocks in processes)))
    ax.set_ylim(bottom=0)  # the spread as a share of the whole
    ax.set_xlabel("block (the same steps, the same seed)")
    ax.set_ylabel("seconds")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="maniskill_pushcube_ppo")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="batch steps per block (default: the recipe's algo.rollout_steps)")
    add_output_args(parser, "host_noise")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides of the recipe (key=value)")
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return {}
    if args.processes < 1 or args.blocks < 1 or (args.steps is not None and args.steps < 1):
        parser.error("--processes, --blocks and --steps must be >= 1")
    start, load_before = time.perf_counter(), os.getloadavg()
    print(f"host noise: {args.recipe}, {args.processes} fresh processes x {args.blocks} identical blocks", flush=True)
    processes = [_spawn(args, i) for i in range(args.processes)]
    summary = summarize(processes)
    print(f"same work: {summary['min_s']:.3f}-{summary['max_s']:.3f} s (median {summary['median_s']:.3f}; slowest/fastest "
          f"{summary['spread']:.2f}x, within a process {summary['within_process_spread']:.2f}x, across processes "
          f"{summary['across_process_spread']:.2f}x); env CPU seconds {summary['cpu_spread']:.2f}x; "
          f"{'the same' if summary['same_work'] else 'NOT the same'} physics in every block", flush=True)
    path = result_path("host_noise", args)
    png = beside(path, ".png")
    plot(processes, summary, f"{args.recipe}: identical blocks in {args.processes} fresh processes", png)
    result = {
        "recipe": args.recipe,
        "overrides": list(args.overrides),
        "blocks": args.blocks,
        "steps": args.steps,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": round(time.perf_counter() - start, 1),
        "summary": summary,
        "processes": [list(p) for p in processes],
        "png": png.name,
    }
    save_result(path, "host_noise", argv, result, also=(png,))
    return result


if __name__ == "__main__":
    main()
