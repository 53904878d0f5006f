"""M2Flow on the reasoning workflow: the planner's choice against the colocated sequential schedule,
side by side in one run.

    python -m benchmarks.reasoning_m2flow [--iterations 20] [--cached-profile] [--shared] [key=value ...]

Workload: the ``reasoning_grpo_tiny`` recipe (tiny Qwen2 from its cached SFT warm start, 32 prompts
x 8 responses per iteration, 2 minibatches) on this machine's cores. Every configuration builds its
own workers on one Ray cluster and they take turns, one iteration each per round (after one warm-up
iteration each), so load from other processes on a shared machine falls on all of them alike. Each
configuration really trains (GRPO updates, weight syncs). Next to each measured iteration time is
the planner's prediction for that configuration, and the work-conservation lower bound that no plan
can beat (``scheduler.bounds``). The profile behind the predictions is measured at the start of the
run (``--cached-profile`` reuses a cached one, which may come from other load conditions).

Configurations: ``sequential`` (colocated, 1 chunk: every worker on every core, taking turns),
``disaggregated, 1 chunk`` (generation on one core, the trainer on the other, no streaming) and
the planner's choice. Writes ``benchmarks/results/reasoning_m2flow.json`` and a timeline PNG.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from benchmarks.common import add_output_args, beside, result_path, save_result
from embodied.config import apply_overrides
from embodied.runtime import Cluster
from embodied.timeline_plot import plot_timelines
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.workflow import ReasoningWorkflow
from pipelines.recipes import load_recipe
from pipelines.runner import Runner
from scheduler import sequential_plan, simulate

#: Ray's CPU bookkeeping only (pinning decides the cores): three configurations' workers coexist
SMALL_RESERVATIONS = ["workers.rollout_cpus=0.1", "workers.reward_cpus=0.05", "workers.trainer_cpus=0.1"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20, help="measured iterations per configuration")
    add_output_args(parser, "reasoning_m2flow")
    parser.add_argument("--cached-profile", action="store_true",
                        help="plan from the cached profile, if any, instead of measuring it in this run")
    parser.add_argument("--shared", action="store_true",
                        help="record that other work ran on the machine (timings and predictions are noisier)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    _, data = load_recipe("reasoning_grpo_tiny")
    common = ["plan.replan_threshold=0", "logging.wandb=false", "logging.tensorboard=false", *SMALL_RESERVATIONS,
              *args.overrides]
    base = apply_overrides(ReasoningConfig, data, common)
    base_flow = ReasoningWorkflow(base)
    base_flow.preflight()  # the warm start (cached): the model and data every configuration trains on

    configs = {"sequential": ["plan.mode=colocated", "plan.chunks=1"],
               "disaggregated, 1 chunk": ["plan.mode=disaggregated", "plan.chunks=1"],
               "planner": []}
    runners: dict[str, Runner] = {}
    flows: dict[str, ReasoningWorkflow] = {}
    times: dict[str, list[float]] = {name: [] for name in configs}
    with Cluster(base.cluster) as cluster:
        load_before = os.getloadavg()
        profile = base_flow.profile(cluster, force=not args.cached_profile, log=print)
        planned = base_flow.plan(profile)
        try:
            for name, overrides in configs.items():
                cfg = apply_overrides(ReasoningConfig, data, [*common, *overrides])
                flows[name] = ReasoningWorkflow(cfg)
                runners[name] = Runner(cfg, None, flows[name])
                runners[name].start(cluster)  # the profile comes from the cache just written
                runners[name].step()  # warm-up
                plan = runners[name].layout.plan
                print(f"{name}: {plan.mode}, {plan.num_chunks} chunk(s), {plan.placement_str()}, "
                      f"predicted {plan.predicted_iteration_s:.3f} s/iteration", flush=True)
            for round_ in range(args.iterations):
                for name, runner in runners.items():
                    times[name].append(runner.step()["time/iteration_s"])
                print(f"  round {round_ + 1}: " + ", ".join(f"{n} {t[-1]:.3f} s" for n, t in times.items()), flush=True)
        finally:
            for flow in flows.values():
                flow.close()

    conditions = {"shared_machine": args.shared, "load_avg_1_5_15_before": load_before,
                  "load_avg_1_5_15_after": os.getloadavg(), "profile_measured_in_this_run": not args.cached_profile}
    results: dict[str, Any] = {}
    for name, runner in runners.items():
        plan = runner.layout.plan
        measured = statistics.median(times[name])
        results[name] = {
            "mode": plan.mode, "chunks": plan.num_chunks, "placement": {k: list(v) for k, v in plan.placement.items()},
            "streamed": flows[name].streams,
            "predicted_iteration_s": plan.predicted_iteration_s,
            "measured_iteration_s": measured,
            "measured_all_s": times[name],
            "prediction_error": abs(plan.predicted_iteration_s - measured) / measured,
            "samples_per_s": base.samples_per_iteration / measured,
        }
    seq = results["sequential"]["measured_iteration_s"]
    for r in results.values():
        r["speedup_vs_sequential"] = seq / r["measured_iteration_s"]
    bound = planned.bound
    assert bound is not None
    summary = {
        "planner_choice": f"{results['planner']['mode']}, {results['planner']['chunks']} chunk(s)",
        "planner_speedup_vs_sequential": results["planner"]["speedup_vs_sequential"],
        "planner_speedup_predicted": results["sequential"]["predicted_iteration_s"] / results["planner"]["predicted_iteration_s"],
        "max_prediction_error": max(r["prediction_error"] for r in results.values()),
        # Work conservation (scheduler.bounds): no plan is predicted below bound_s, so no plan can beat
        # the sequential one by more than these ratios (predicted, and against the measurement).
        "bound_s": bound.iteration_s,
        "bound_limited_by": bound.limited_by,
        "planner_over_bound_measured": results["planner"]["measured_iteration_s"] / bound.iteration_s,
        "speedup_ceiling_predicted": results["sequential"]["predicted_iteration_s"] / bound.iteration_s,
        "speedup_ceiling_measured": seq / bound.iteration_s,
    }
    print(f"planner's choice ({summary['planner_choice']}): {summary['planner_speedup_vs_sequential']:.2f}x sequential "
          f"measured ({summary['planner_speedup_predicted']:.2f}x predicted); max prediction error "
          f"{100 * summary['max_prediction_error']:.1f}%")
    print(f"lower bound for any plan: {bound.iteration_s:.3f} s/iteration ({bound.limited_by}): at most "
          f"{summary['speedup_ceiling_predicted']:.2f}x (predicted) / {summary['speedup_ceiling_measured']:.2f}x (measured "
          f"sequential) over sequential")

    workflow, resources = base_flow.macro_flow(), base_flow.resources()
    seq_plan = sequential_plan(workflow, resources, profile)
    path = result_path("reasoning_m2flow", args)
    png = plot_timelines(
        {"sequential (1 chunk, colocated)": simulate(seq_plan, profile, workflow, resources),
         f"planner's choice ({planned.best.mode}, {planned.best.num_chunks} chunks)": planned.best_timeline},
        beside(path, "_timeline.png"),
        title="M2Flow, reasoning GRPO (tiny Qwen2, 32 prompts x 8 responses): one iteration, predicted",
    )
    result = {
        "conditions": conditions,
        "workload": {"recipe": "reasoning_grpo_tiny", "prompts": base.data.train_batch_size, "group_size": base.algo.group_size,
                     "max_new_tokens": base.max_new_tokens, "minibatches": base.algo.num_minibatches,
                     "cores": len(resources)},
        "profile": profile.to_dict(),
        "candidates": [dict(zip(("mode", "chunks", "placement", "predicted_s", "mean_utilization"), row))
                       for row in planned.table()],
        "bound": bound.to_dict(),
        "configs": results,
        "summary": summary,
        "timeline_png": png.name,
    }
    save_result(path, "reasoning_m2flow", argv, result, also=(png,))
    return result


if __name__ == "__main__":
    main()
