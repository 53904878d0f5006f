"""Do the env's steps and the rollout's calls slow down when they run at once, each on its own core?

A pipelined plan runs the simulator and the policy side by side on separate cores. If the cores
interfered (shared caches, memory bandwidth, SMT siblings behind a VM's vCPUs), every pipelined
plan would pay for it and no plan could reach the work-conservation bound the planner computes
from probes that ran alone. This benchmark measures it without the runtime, each job in a process
pinned to one core with one thread, first alone, then beside another (started together by a
barrier), ``--repeats`` times in turn:

* ``env``: steps the recipe's env (a chunk of ``--envs`` envs, random actions);
* ``rollout``: runs the recipe's policy on that chunk's observations;
* ``stream``: what a ``streams`` plan runs on each core: the env and the policy taking turns in one
  process, the policy acting in the observation the env just returned (its two halves timed apart,
  ``stream.env`` and ``stream.rollout``);
* ``matmul``: a 512x512 matmul loop, a neighbour that only computes.

The pairs are those a pipelined plan runs side by side: the env beside the policy (hybrid), two
of a kind (streams in step: both cores simulating, then both inferring), two streams, and each
beside the matmul. A job that runs twice in a pair is timed on both cores (the ratio: their mean).

    python -m benchmarks.co_running [--recipe benchmarks/m2flow_rgb.yaml] [--envs 4] [--calls 40]

Writes ``benchmarks/results/co_running.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.common import add_output_args, result_path, save_result

JOBS = ("env", "rollout", "stream", "matmul")
PARTS = {"env": ("env",), "rollout": ("rollout",), "stream": ("stream.env", "stream.rollout"), "matmul": ("matmul",)}
"""What each job times (seconds per call, its median)."""
PAIRS = (("env",), ("rollout",), ("stream",), ("matmul",), ("env", "rollout"), ("env", "env"), ("rollout", "rollout"),
         ("stream", "stream"), ("env", "matmul"), ("rollout", "matmul"))


def _config(recipe: str, envs: int):
    from embodied.config import apply_overrides
    from pipelines.config import EmbodiedConfig
    from pipelines.recipes import load_recipe

    _, data = load_recipe(recipe)
    return apply_overrides(EmbodiedConfig, data, [f"env.num_envs={envs}", "env.num_procs=0"])


def _job(name: str, core: int, recipe: str, envs: int, calls: int, start: Any, out: Any) -> None:
    """One job pinned to ``core``: set up, wait for the others at ``start``, time ``calls`` calls;
    puts (core, {part: median seconds per call}) for the job's :data:`PARTS`."""
    os.sched_setaffinity(0, {core})
    import numpy as np
    import torch

    torch.set_num_threads(1)
    times: dict[str, list[float]] = {part: [] for part in PARTS[name]}

    def timed(part: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        result = fn()
        times[part].append(time.perf_counter() - t0)
        return result

    if name == "matmul":
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        call = lambda: timed("matmul", lambda: a @ b)  # noqa: E731
        calls *= 10
    else:
        from envs.base import random_actions
        from envs.registry import make_vec_env
        from pipelines.collect import to_torch
        from policies.registry import build_policy

        cfg = _config(recipe, envs)
        env = make_vec_env(cfg.env, seed=0)
        obs = env.reset(seed=0)
        space = env.action_space
        rng = np.random.default_rng(0)
        policy = build_policy(cfg.policy, env.observation_space, space).eval()

        def infer(observation: Any) -> np.ndarray:
            with torch.no_grad():
                actions = policy.act(to_torch(observation, torch.device("cpu"))).actions.cpu().numpy()
            return np.clip(actions, space.low, space.high) if hasattr(space, "low") else actions

        if name == "env":
            def call() -> None:
                actions = random_actions(space, (envs,), rng)
                timed("env", lambda: env.step(actions))
        elif name == "rollout":
            env.close()
            call = lambda: timed("rollout", lambda: infer(obs))  # noqa: E731
        else:  # stream: the policy acts in what the env just returned, as a stream's process does
            state = {"obs": obs}

            def call() -> None:
                actions = timed("stream.rollout", lambda: infer(state["obs"]))
                state["obs"] = timed("stream.env", lambda: env.step(actions)).obs
    for _ in range(5):  # warm-up
        call()
    for part in times.values():
        part.clear()
    start.wait()
    for _ in range(calls):
        call()
    out.put((core, {part: statistics.median(t) for part, t in times.items()}))


def run_together(jobs: tuple[str, ...], recipe: str, envs: int, calls: int) -> dict[str, float]:
    """Each job of ``jobs`` in its own process on its own core, started together; seconds per call
    of each part, the mean over the cores where a job runs twice."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=_job, args=(name, core, recipe, envs, calls, start, out)) for core, name in enumerate(jobs)]
    for p in procs:
        p.start()
    per_core = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    parts: dict[str, list[float]] = {}
    for timed in per_core.values():
        for part, seconds in timed.items():
            parts.setdefault(part, []).append(seconds)
    return {part: statistics.fmean(seconds) for part, seconds in parts.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="benchmarks/m2flow_rgb.yaml")
    parser.add_argument("--envs", type=int, default=4, help="envs per step (a chunk of the pipelined plans)")
    parser.add_argument("--calls", type=int, default=40, help="timed calls per job and run")
    parser.add_argument("--repeats", type=int, default=3)
    add_output_args(parser, "co_running")
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("co_running needs two cores")
    runs: dict[str, list[dict[str, float]]] = {"+".join(p): [] for p in PAIRS}
    for r in range(args.repeats):
        for pair in PAIRS:
            runs["+".join(pair)].append(run_together(pair, args.recipe, args.envs, args.calls))
        print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]}" for k, v in runs.items()), flush=True)
    alone = {part: statistics.median(run[part] for run in runs[j]) for j in JOBS for part in PARTS[j]}
    together: dict[str, dict[str, float]] = {}
    for pair in PAIRS:
        if len(pair) == 2:
            key = "+".join(pair)
            parts = dict.fromkeys(part for j in pair for part in PARTS[j])
            together[key] = {part: statistics.median(run[part] for run in runs[key]) / alone[part] for part in parts}
    result = {
        "recipe": args.recipe, "envs": args.envs, "calls": args.calls, "repeats": args.repeats,
        "runs_s": runs,
        "alone_s": alone,
        "side_by_side_over_alone": together,
        # a stream's calls alone against the same calls made back to back (the probes' way)
        "stream_alone_over_separate": {"env": alone["stream.env"] / alone["env"],
                                       "rollout": alone["stream.rollout"] / alone["rollout"]},
    }
    for key, ratios in together.items():
        print(f"{key}: " + ", ".join(f"{j} {x:.2f}x its time alone" for j, x in ratios.items()))
    print("a stream alone: " + ", ".join(f"its {j} calls {x:.2f}x the same calls back to back"
                                         for j, x in result["stream_alone_over_separate"].items()))
    save_result(result_path("co_running", args), "co_running", argv, result)
    return result


if __name__ == "__main__":
    main()
