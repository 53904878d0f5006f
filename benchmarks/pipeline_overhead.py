"""Runtime overhead: env steps/s of the full Ray pipeline vs a plain single-process PPO loop.

Same env, policy, hyperparameters and update code (``pipelines.ppo.ppo_update``), side by side in
one run. The plain loop is the CleanRL shape: collect T steps in one process, then train.

    python -m benchmarks.pipeline_overhead [--recipe halfcheetah_ppo] [--iterations 6] [key=value ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

import numpy as np
import torch

from embodied.config import apply_overrides, to_dict
from embodied.runtime import Cluster
from envs.base import to_numpy
from envs.registry import make_vec_env
from pipelines.config import TrainConfig
from pipelines.embodied_ppo import EmbodiedPPO
from pipelines.ppo import bootstraps, ppo_update
from pipelines.recipes import load_recipe
from pipelines.workers import to_torch
from policies.registry import build_policy
from benchmarks.common import write_result


class PlainLoop:
    """Collect-then-train in one process (the CleanRL shape); ``iteration()`` times one iteration."""

    def __init__(self, cfg: TrainConfig) -> None:
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.workers.trainer_threads)  # as the pipeline's trainer
        self.cfg = cfg
        self.env = make_vec_env(cfg.env, seed=cfg.seed)
        self.policy = build_policy(cfg.policy, self.env.observation_space, self.env.action_space)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.algo.lr, eps=1e-5)
        self.low, self.high = getattr(self.env.action_space, "low", None), getattr(self.env.action_space, "high", None)
        self.obs = self.env.reset(seed=cfg.seed)

    def iteration(self) -> tuple[float, float, float]:
        """(iteration_s, collect_s, train_s)."""
        cfg, env, policy, cpu = self.cfg, self.env, self.policy, torch.device("cpu")
        t0 = time.perf_counter()
        buf: dict[str, list] = {k: [] for k in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "final_values")}
        obs = self.obs
        with torch.no_grad():
            for _ in range(cfg.algo.rollout_steps):
                out = policy.act(to_torch(obs, cpu))
                actions = out.actions.numpy()
                res = env.step(np.clip(actions, self.low, self.high) if self.low is not None else actions)
                final_values = np.zeros(env.num_envs, np.float32)
                trunc = to_numpy(res.truncated)
                bootstrap = bootstraps(to_numpy(res.terminated), trunc, cfg.algo)
                if bootstrap.any():
                    rows = np.flatnonzero(bootstrap)
                    final_values[rows] = policy.value(to_torch({k: v[rows] for k, v in res.final_obs.items()}, cpu)).numpy()
                for k, v in (("obs", obs), ("actions", actions), ("logprobs", out.logprobs.numpy()), ("values", out.values.numpy()),
                             ("rewards", to_numpy(res.reward) * cfg.algo.reward_scale), ("terminated", to_numpy(res.terminated)),
                             ("truncated", trunc), ("final_values", final_values)):
                    buf[k].append(v)
                obs = res.obs
            last_values = policy.value(to_torch(obs, cpu)).numpy()
        self.obs = obs
        t_collect = time.perf_counter()
        data = {k: np.stack(v) for k, v in buf.items() if k != "obs"}
        data["obs"] = {k: np.stack([o[k] for o in buf["obs"]]) for k in buf["obs"][0]}
        data["last_values"] = last_values
        ppo_update(policy, self.optimizer, data, cfg.algo, cfg.algo.lr, cpu)
        t_end = time.perf_counter()
        return t_end - t0, t_collect - t0, t_end - t_collect

    def close(self) -> None:
        self.env.close()


class RayPipeline:
    """The macro flow on Ray (``EmbodiedPPO.iterate``) under the plan ``embodied train`` would use."""

    def __init__(self, cfg: TrainConfig, cluster: Cluster) -> None:
        self.algo = EmbodiedPPO(cfg, run=None)
        self.algo.plan(cluster, log=lambda *_: None)
        self.algo._build(cluster)

    def iteration(self) -> tuple[float, float, float]:
        m = self.algo.iterate()
        collect = m["time/sync_s"] + m["time/rollout_s"]
        return m["time/iteration_s"], collect, m["time/iteration_s"] - collect

    def plan(self) -> dict[str, Any]:
        lay = self.algo.layout
        return {"mode": lay.plan.mode, "chunks": lay.num_chunks,
                "placement": {k: list(v) for k, v in lay.plan.placement.items()},
                "predicted_iteration_s": lay.plan.predicted_iteration_s}


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
    parser.add_argument("--iterations", type=int, default=10, help="measured iterations of each configuration")
    parser.add_argument("--name", default="pipeline_overhead", help="result file name under benchmarks/results/")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    _, data = load_recipe(args.recipe)
    cfg = apply_overrides(TrainConfig, data, ["logging.wandb=false", "logging.tensorboard=false", "plan.replan_threshold=0", *args.overrides])
    stale_cfg = apply_overrides(TrainConfig, to_dict(cfg), ["algo.staleness=1"])
    # This machine's speed drifts within minutes (a shared host), so the three run side by side
    # iteration by iteration (plain, pipeline, pipeline with staleness 1, again ...) and the ratios
    # are medians of per-iteration ratios: a drift cannot favour one of them.
    names = ("plain_loop", "ray_pipeline", "ray_pipeline_staleness_1")
    times: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    plain = PlainLoop(cfg)
    cluster_cfg = dataclasses.replace(cfg.cluster, num_cpus=2 * (os.cpu_count() or 1))  # two idle-or-busy pipelines
    with Cluster(cluster_cfg) as cluster:
        runners = {"plain_loop": plain, "ray_pipeline": RayPipeline(cfg, cluster),
                   "ray_pipeline_staleness_1": RayPipeline(stale_cfg, cluster)}
        for it in range(args.iterations + 2):  # two warm-ups: staleness 1 first trains in its second
            for name in names:
                t = runners[name].iteration()
                if it >= 2:
                    times[name].append(t)
        plans = {name: runners[name].plan() for name in names[1:]}
    plain.close()
    out = {name: _summary(cfg, times[name]) for name in names}
    for name in names[1:]:
        out[name]["plan"] = plans[name]
    ratios = {name: float(np.median([p[0] / t[0] for p, t in zip(times["plain_loop"], times[name])])) for name in names[1:]}
    plain_r, pipe, stale = (out[n] for n in names)
    ratio, stale_ratio = ratios["ray_pipeline"], ratios["ray_pipeline_staleness_1"]
    print(f"plain loop   : {plain_r['env_steps_per_s']:8.0f} env steps/s  (collect {plain_r['collect_s']:.3f}s, train {plain_r['train_s']:.3f}s per iteration)")
    print(f"Ray pipeline : {pipe['env_steps_per_s']:8.0f} env steps/s  ({pipe['plan']['mode']}, {pipe['plan']['chunks']} chunks) ratio {ratio:.2f}x")
    print(f"Ray pipeline, staleness 1: {stale['env_steps_per_s']:8.0f} env steps/s  "
          f"({stale['plan']['mode']} {stale['plan']['placement']}) ratio {stale_ratio:.2f}x", flush=True)
    result = {
        "benchmark": "pipeline_overhead",
        "command": "python -m benchmarks.pipeline_overhead " + " ".join(argv if argv is not None else []),
        "recipe": args.recipe,
        "env": cfg.env.id,
        "num_envs": cfg.env.num_envs,
        "rollout_steps": cfg.algo.rollout_steps,
        "steps_per_iteration": cfg.steps_per_iteration,
        **out,
        "ratio_pipeline_over_plain": ratio,
        "ratio_staleness_1_over_plain": stale_ratio,
        "iteration_s_all": {name: [t[0] for t in times[name]] for name in names},
    }
    path = write_result(args.name, result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
