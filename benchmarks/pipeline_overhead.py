"""Runtime overhead: env steps/s of the full Ray pipeline vs the plain single-process loop.

Same env, policy, hyperparameters and algorithm object, side by side in one run. The plain loop is
``pipelines.plain_loop.PlainLoop``: collect T steps in one process, then train (the CleanRL shape).

    python -m benchmarks.pipeline_overhead [--recipe halfcheetah_ppo] [--iterations 6] [key=value ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import numpy as np

from embodied.config import apply_overrides, to_dict
from embodied.runtime import Cluster
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.plain_loop import PlainLoop
from pipelines.recipes import load_recipe
from pipelines.runner import Runner
from benchmarks.common import add_output_args, result_path, save_result


class Plain:
    """The plain loop, timed: ``iteration()`` -> (iteration_s, collect_s, train_s)."""

    def __init__(self, cfg: EmbodiedConfig) -> None:
        self.loop = PlainLoop(cfg)
        self.count = 0

    def iteration(self) -> tuple[float, float, float]:
        m = self.loop.iteration(self.count, self.loop.cfg.algo.lr)
        self.count += 1
        return m["time/iteration_s"], m["time/collect_s"], m["time/train_s"]

    def close(self) -> None:
        self.loop.close()


class RayPipeline:
    """The macro flow on Ray (``Runner.step``) under the plan ``embodied train`` would use."""

    def __init__(self, cfg: EmbodiedConfig, cluster: Cluster) -> None:
        self.runner = Runner(cfg, None, EmbodiedWorkflow(cfg))
        self.runner.start(cluster)

    def iteration(self) -> tuple[float, float, float]:
        m = self.runner.step()
        collect = m["time/sync_s"] + m["time/rollout_s"]
        return m["time/iteration_s"], collect, m["time/iteration_s"] - collect

    def plan(self) -> dict[str, Any]:
        lay = self.runner.layout
        assert lay is not None
        return {"mode": lay.plan.mode, "chunks": lay.num_chunks,
                "placement": {k: list(v) for k, v in lay.plan.placement.items()},
                "predicted_iteration_s": lay.plan.predicted_iteration_s}


def _summary(cfg: EmbodiedConfig, times: list[tuple[float, float, float]]) -> dict[str, Any]:
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
    add_output_args(parser, "pipeline_overhead")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    _, data = load_recipe(args.recipe)
    cfg = apply_overrides(EmbodiedConfig, data, ["logging.wandb=false", "logging.tensorboard=false", "plan.replan_threshold=0", *args.overrides])
    stale_cfg = apply_overrides(EmbodiedConfig, to_dict(cfg), ["algo.staleness=1"])
    # This machine's speed drifts within minutes (a shared host), so the three run side by side
    # iteration by iteration (plain, pipeline, pipeline with staleness 1, again ...) and the ratios
    # are medians of per-iteration ratios: a drift cannot favour one of them.
    names = ("plain_loop", "ray_pipeline", "ray_pipeline_staleness_1")
    times: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    plain = Plain(cfg)
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
    save_result(result_path("pipeline_overhead", args), "pipeline_overhead", argv, result)
    return result


if __name__ == "__main__":
    main()
