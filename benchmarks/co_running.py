"""Do the env's steps and the rollout's calls slow down when they run at once, each on its own core?

A pipelined plan runs the simulator and the policy side by side on separate cores. If the cores
interfered (shared caches, memory bandwidth, SMT siblings behind a VM's vCPUs), every pipelined
plan would pay for it and no plan could reach the work-conservation bound the planner computes
from probes that ran alone. This benchmark measures it without the runtime: one process steps the
recipe's env (a chunk of ``--envs`` envs, random actions), another runs the recipe's policy on
those observations, each pinned to one core with one thread; first each alone, then both at once
(started together by a barrier), ``--repeats`` times in turn. A third job, a 512x512 matmul loop,
stands for a neighbour that only computes.

    python -m benchmarks.co_running [--recipe benchmarks/m2flow_rgb.yaml] [--envs 4] [--calls 40]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.common import write_result

JOBS = ("env", "rollout", "matmul")
PAIRS = (("env",), ("rollout",), ("matmul",), ("env", "rollout"), ("env", "matmul"), ("rollout", "matmul"))


def _config(recipe: str, envs: int):
    from embodied.config import apply_overrides
    from pipelines.config import EmbodiedConfig
    from pipelines.recipes import load_recipe

    _, data = load_recipe(recipe)
    return apply_overrides(EmbodiedConfig, data, [f"env.num_envs={envs}", "env.num_procs=0"])


def _job(name: str, core: int, recipe: str, envs: int, calls: int, start: Any, out: Any) -> None:
    """One job pinned to ``core``: set up, wait for the others at ``start``, time ``calls`` calls;
    puts (name, median seconds per call)."""
    os.sched_setaffinity(0, {core})
    import numpy as np
    import torch

    torch.set_num_threads(1)
    if name == "matmul":
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        call = lambda: a @ b  # noqa: E731
        calls *= 10
    else:
        from envs.registry import make_vec_env
        from pipelines.collect import to_torch
        from policies.registry import build_policy

        cfg = _config(recipe, envs)
        env = make_vec_env(cfg.env, seed=0)
        obs = env.reset(seed=0)
        space = env.action_space
        rng = np.random.default_rng(0)
        if name == "env":
            def call() -> None:
                if hasattr(space, "low"):
                    env.step(rng.uniform(space.low, space.high, size=(envs, *space.shape)).astype(np.float32))
                else:
                    env.step(rng.integers(0, space.n, size=envs))
        else:
            policy = build_policy(cfg.policy, env.observation_space, env.action_space).eval()
            env.close()
            x = to_torch(obs, torch.device("cpu"))

            def call() -> None:
                with torch.no_grad():
                    policy.act(x)
    for _ in range(5):  # warm-up
        call()
    start.wait()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    out.put((name, statistics.median(times)))


def run_together(jobs: tuple[str, ...], recipe: str, envs: int, calls: int) -> dict[str, float]:
    """Each job of ``jobs`` in its own process on its own core, started together; seconds per call."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=_job, args=(name, core, recipe, envs, calls, start, out)) for core, name in enumerate(jobs)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="benchmarks/m2flow_rgb.yaml")
    parser.add_argument("--envs", type=int, default=4, help="envs per step (a chunk of the pipelined plans)")
    parser.add_argument("--calls", type=int, default=40, help="timed calls per job and run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="co_running")
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("co_running needs two cores")
    runs: dict[str, list[dict[str, float]]] = {"+".join(p): [] for p in PAIRS}
    for r in range(args.repeats):
        for pair in PAIRS:
            runs["+".join(pair)].append(run_together(pair, args.recipe, args.envs, args.calls))
        print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]}" for k, v in runs.items()), flush=True)
    alone = {j: statistics.median(run[j] for run in runs[j]) for j in JOBS}
    together: dict[str, dict[str, float]] = {}
    for pair in PAIRS:
        if len(pair) == 2:
            key = "+".join(pair)
            together[key] = {j: statistics.median(run[j] for run in runs[key]) / alone[j] for j in pair}
    result = {
        "benchmark": "co_running",
        "command": "python -m benchmarks.co_running " + " ".join(argv if argv is not None else sys.argv[1:]),
        "recipe": args.recipe, "envs": args.envs, "calls": args.calls, "repeats": args.repeats,
        "runs_s": runs,
        "alone_s": alone,
        "side_by_side_over_alone": together,
    }
    for key, ratios in together.items():
        print(f"{key}: " + ", ".join(f"{j} {x:.2f}x its time alone" for j, x in ratios.items()))
    path = write_result(args.name, result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
