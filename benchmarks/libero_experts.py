"""How often the scripted LIBERO experts (:mod:`envs.experts.libero`) succeed: every task of
LIBERO-Spatial and LIBERO-Object from its official initial states, judged by LIBERO's own
``check_success()``, with obs_mode=state (no renderer), one episode at a time in one process.

    python -m benchmarks.libero_experts [--suites libero_spatial libero_object] [--tasks 0 4]
                                        [--states 10] [--first-state 0] [--name NAME]

Prints a Markdown table (task, successes / episodes, mean steps of the successful ones, the
stages the failures ended in) and writes the JSON to benchmarks/results/libero_experts.json.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from benchmarks.common import add_output_args, result_path, save_result

SUITES = ("libero_spatial", "libero_object")


def measure_task(task: Any, states: range) -> dict[str, Any]:
    """The expert's episodes of ``task`` from the official initial states ``states``."""
    from envs.experts.libero import libero_expert, record_episode, task_env

    env = task_env(task)
    expert = libero_expert(task)
    started = time.perf_counter()
    episodes = []
    try:
        for state in states:
            episode = record_episode(env, expert, seed=state)  # a one-task env starts from state seed mod 50
            episodes.append({"init_state": episode.init_state, "success": episode.success,
                             "steps": len(episode.actions), "final_stage": episode.stage})
    finally:
        env.close()
    wins = [e for e in episodes if e["success"]]
    return {
        "task": task.id, "name": task.name, "episodes": len(episodes), "successes": len(wins),
        "success_rate": len(wins) / max(len(episodes), 1),
        "mean_steps_of_successes": sum(e["steps"] for e in wins) / max(len(wins), 1),
        "failed_states": [e["init_state"] for e in episodes if not e["success"]],
        "failure_stages": dict(Counter(e["final_stage"] for e in episodes if not e["success"])),
        "wall_s": round(time.perf_counter() - started, 1), "per_episode": episodes,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| task | success | mean steps | failed states (final stage) |", "|---|---|---|---|"]
    for r in rows:
        failed = ", ".join(f"{s}" for s in r["failed_states"]) or "-"
        stages = ", ".join(f"{k} {v}" for k, v in r["failure_stages"].items())
        lines.append(f"| {r['task']} | {r['successes']}/{r['episodes']} | {r['mean_steps_of_successes']:.0f} | "
                     f"{failed}{f' ({stages})' if stages else ''} |")
    total_wins, total = sum(r["successes"] for r in rows), sum(r["episodes"] for r in rows)
    lines.append(f"| **all** | {total_wins}/{total} ({total_wins / max(total, 1):.0%}) | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from envs.adapters.libero_adapter import list_tasks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    parser.add_argument("--tasks", nargs="+", type=int, default=list(range(10)), help="task numbers of each suite")
    parser.add_argument("--states", type=int, default=10, help="official initial states per task")
    parser.add_argument("--first-state", type=int, default=0)
    add_output_args(parser, "libero_experts")
    args = parser.parse_args(argv)
    states = range(args.first_state, args.first_state + args.states)
    rows = []
    for suite in args.suites:
        for k in args.tasks:
            row = measure_task(list_tasks(suite)[k], states)
            print(f"{row['task']}: {row['successes']}/{row['episodes']} ({row['wall_s']:.0f} s)", flush=True)
            rows.append(row)
    table = markdown(rows)
    print(table)
    result = {"states": [states.start, states.stop], "obs_mode": "state", "tasks": rows, "markdown": table}
    save_result(result_path("libero_experts", args), "libero_experts", argv, result)
    return result


if __name__ == "__main__":
    main()
