"""Runtime overhead: env steps/s of the full Ray pipeline vs a plain single-process PPO loop.

Same env, policy, hyperparameters and update code (``pipelines.ppo.ppo_update``), side by side in
one run. The plain loop is the CleanRL shape: collect T steps in one process, then train.

    python -m benchmarks.pipeline_overhead [--recipe halfcheetah_ppo] [--iterations 6] [key=value ...]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from embodied.config import apply_overrides
from embodied.runtime import Cluster
from envs.base import to_numpy
from envs.registry import make_vec_env
from pipelines.config import TrainConfig
from pipelines.embodied_ppo import EmbodiedPPO
from pipelines.ppo import ppo_update
from pipelines.recipes import load_recipe
from pipelines.workers import to_torch
from policies.registry import build_policy
from benchmarks.common import write_result


def plain_loop(cfg: TrainConfig, iterations: int) -> dict[str, Any]:
    """Collect-then-train in one process; returns steps/s over ``iterations`` after one warm-up."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.workers.actor_threads)  # as the pipeline's trainer
    env = make_vec_env(cfg.env, seed=cfg.seed)
    policy = build_policy(cfg.policy, env.observation_space, env.action_space)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.algo.lr, eps=1e-5)
    low, high = getattr(env.action_space, "low", None), getattr(env.action_space, "high", None)
    obs = env.reset(seed=cfg.seed)
    times = []
    for it in range(iterations + 1):
        t0 = time.perf_counter()
        buf: dict[str, list] = {k: [] for k in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "final_values")}
        with torch.no_grad():
            for _ in range(cfg.algo.rollout_steps):
                out = policy.act(to_torch(obs, torch.device("cpu")))
                actions = out.actions.numpy()
                res = env.step(np.clip(actions, low, high) if low is not None else actions)
                final_values = np.zeros(env.num_envs, np.float32)
                trunc = to_numpy(res.truncated)
                if trunc.any():
                    rows = np.flatnonzero(trunc)
                    final_values[rows] = policy.value(to_torch({k: v[rows] for k, v in res.final_obs.items()}, torch.device("cpu"))).numpy()
                for k, v in (("obs", obs), ("actions", actions), ("logprobs", out.logprobs.numpy()), ("values", out.values.numpy()),
                             ("rewards", to_numpy(res.reward) * cfg.algo.reward_scale), ("terminated", to_numpy(res.terminated)),
                             ("truncated", trunc), ("final_values", final_values)):
                    buf[k].append(v)
                obs = res.obs
            last_values = policy.value(to_torch(obs, torch.device("cpu"))).numpy()
        t_collect = time.perf_counter()
        data = {k: np.stack(v) for k, v in buf.items() if k != "obs"}
        data["obs"] = {k: np.stack([o[k] for o in buf["obs"]]) for k in buf["obs"][0]}
        data["last_values"] = last_values
        ppo_update(policy, optimizer, data, cfg.algo, cfg.algo.lr, torch.device("cpu"))
        t_end = time.perf_counter()
        if it > 0:  # the first iteration warms up allocators and caches
            times.append((t_end - t0, t_collect - t0, t_end - t_collect))
    env.close()
    return _summary(cfg, times)


def ray_pipeline(cfg: TrainConfig, iterations: int) -> dict[str, Any]:
    """The macro flow on Ray (EmbodiedPPO.iterate) under the plan ``embodied train`` would use
    (profiled and planned unless plan.profile=false), same measurement."""
    algo = EmbodiedPPO(cfg, run=None)
    times = []
    with Cluster(cfg.cluster) as cluster:
        algo.plan(cluster, log=lambda *_: None)
        algo._build(cluster)
        for it in range(iterations + 1):
            m = algo.iterate()
            if it > 0:
                times.append((m["time/iteration_s"], m["time/sync_s"] + m["time/rollout_s"], m["time/iteration_s"] - m["time/sync_s"] - m["time/rollout_s"]))
    result = _summary(cfg, times)
    result["plan"] = {"mode": algo.layout.plan.mode, "chunks": algo.num_chunks,
                      "placement": {k: list(v) for k, v in algo.layout.plan.placement.items()},
                      "predicted_iteration_s": algo.layout.plan.predicted_iteration_s}
    return result


def _summary(cfg: TrainConfig, times: list[tuple[float, float, float]]) -> dict[str, Any]:
    steps = cfg.steps_per_iteration
    it_s = float(np.median([t[0] for t in times]))
    return {
        "env_steps_per_s": steps / it_s,
        "iteration_s": it_s,
        "collect_s": float(np.median([t[1] for t in times])),
        "train_s": float(np.median([t[2] for t in times])),
        "iterations": len(times),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="halfcheetah_ppo")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--name", default="pipeline_overhead", help="result file name under benchmarks/results/")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    _, data = load_recipe(args.recipe)
    cfg = apply_overrides(TrainConfig, data, ["logging.wandb=false", "logging.tensorboard=false", "plan.replan_threshold=0", *args.overrides])
    plain = plain_loop(cfg, args.iterations)
    print(f"plain loop   : {plain['env_steps_per_s']:8.0f} env steps/s  (collect {plain['collect_s']:.3f}s, train {plain['train_s']:.3f}s per iteration)", flush=True)
    pipe = ray_pipeline(cfg, args.iterations)
    print(f"Ray pipeline : {pipe['env_steps_per_s']:8.0f} env steps/s  (collect {pipe['collect_s']:.3f}s, train {pipe['train_s']:.3f}s per iteration)", flush=True)
    ratio = pipe["env_steps_per_s"] / plain["env_steps_per_s"]
    print(f"ratio pipeline/plain: {ratio:.2f}x")
    result = {
        "benchmark": "pipeline_overhead",
        "command": "python -m benchmarks.pipeline_overhead " + " ".join(argv if argv is not None else []),
        "recipe": args.recipe,
        "env": cfg.env.id,
        "num_envs": cfg.env.num_envs,
        "rollout_steps": cfg.algo.rollout_steps,
        "steps_per_iteration": cfg.steps_per_iteration,
        "plain_loop": plain,
        "ray_pipeline": pipe,
        "ratio_pipeline_over_plain": ratio,
    }
    path = write_result(args.name, result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
