"""M2Flow: sequential vs chunked pipelines vs the planner's choice, side by side in one run.

Workloads (``--workload``):

* ``rgb`` (default; ``benchmarks/m2flow_rgb.yaml``): ManiSkill PushCube from 128x128 rgb, 8 envs
  in one simulator process, and a VLA-shaped policy (patch tokens, autoregressive action-token
  decoding) whose inference costs about as much as the simulation; PPO.
* ``vla`` (the bundled recipe ``maniskill_openvlaoft_grpo_tiny``): a tiny OpenVLA-OFT of the real
  architecture on ManiSkill PushCube from 32x32 rgb, 8 envs in groups of 4, chunks of 5 actions;
  GRPO. Its rows go to ``m2flow_pipelining_vla.json``.
* ``flow`` (the bundled recipe ``colorreach_pi0_ppo_tiny``): a tiny π0 of the real architecture
  on ColorReach-v0 from 32x32 rgb, 16 envs, each decision 10 flow steps of the action expert over
  the cached prefix; PPO through the Flow-SDE chain. Its rows go to ``m2flow_pipelining_flow.json``.

For each configuration the same training iterations run for real (Ray workers, channels, updates);
the planner's prediction for the configuration is recorded next to the measurement.

    python -m benchmarks.m2flow_pipelining [--workload rgb|vla|flow] [--iterations 5] [--recipe PATH]

Writes ``benchmarks/results/m2flow_pipelining.json`` (``m2flow_pipelining_<workload>.json`` for the
VLA and flow workloads) and the timelines beside it (``..._timeline.png``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.config import apply_overrides
from embodied.runtime import Cluster
from embodied.timeline_plot import plot_timelines
from benchmarks.common import add_output_args, beside, result_path, save_result
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.onpolicy.planning import macro_flow_of, plan_embodied, resources_of
from pipelines.probes import profile_embodied
from pipelines.runner import Runner
from pipelines.recipes import load_recipe
from pipelines.replan import rescale
from scheduler import Plan, gap_to_bound, lower_bound, predict, sequential_plan, simulate

HERE = Path(__file__).parent


def run_config(cfg: EmbodiedConfig, iterations: int, calibrate: bool = False) -> dict[str, Any]:
    """Plan (forced as ``cfg.plan`` says), build the workers, time ``iterations`` after a warm-up.
    ``calibrate``: first calibrate as a run does (pipelines/calibrate.py), then time the plan the
    run settles on, against its corrected prediction."""
    runner = Runner(cfg, None, EmbodiedWorkflow(cfg))
    with Cluster(cfg.cluster) as cluster:
        runner.start(cluster)
        profiled = runner.layout.plan.predicted_iteration_s
        if calibrate:
            runner.settle()
        if runner.calibrated is not None:
            print(f"    {runner.calibrated.reason}", flush=True)
        times = []
        for it in range(iterations + 1):
            metrics = runner.step()
            if it > 0:
                times.append(metrics["time/iteration_s"])
                print(f"    iteration {it}: {metrics['time/iteration_s']:.2f} s "
                      f"(rollout {metrics['time/rollout_s']:.2f} s, train {metrics['time/train_s']:.2f} s)", flush=True)
    assert runner.layout is not None
    plan = runner.layout.plan
    measured = statistics.median(times)
    return {
        "mode": plan.mode,
        "chunks": plan.num_chunks,
        "lanes": plan.lanes,
        "placement": {k: list(v) for k, v in plan.placement.items()},
        "predicted_iteration_s": plan.predicted_iteration_s,
        "profiled_iteration_s": profiled,
        "calibration": runner.calibrated.to_dict() if runner.calibrated is not None else None,
        "measured_iteration_s": measured,
        "measured_all_s": times,
        "prediction_error": abs(plan.predicted_iteration_s - measured) / measured,
        "env_steps_per_s": cfg.steps_per_iteration / measured,
    }


@dataclass(frozen=True)
class Workload:
    """A benchmarked workload: its recipe, the chunk counts of the sweep (in ``sweep_mode``, None:
    the planner's best mode for the count), its result's variant (None: the benchmark's own name)
    and title."""

    recipe: str
    chunks: tuple[int, ...]
    variant: str | None
    title: str
    sweep_mode: str | None = None


WORKLOADS = {
    # the sweep: the pinned pipelines (env on one core, rollout on the other) against the planner's choice
    "rgb": Workload(str(HERE / "m2flow_rgb.yaml"), (2, 4), None,
                    "M2Flow on 2 CPU cores: ManiSkill rgb + token-decoding policy, one iteration (predicted)",
                    sweep_mode="hybrid"),
    # GRPO groups of 4 of 8 envs: a chunk holds whole groups
    "vla": Workload("maniskill_openvlaoft_grpo_tiny", (2,), "vla",
                    "M2Flow on 2 CPU cores: tiny OpenVLA-OFT (GRPO) on ManiSkill rgb, one iteration (predicted)"),
    # the rollout is the flow chain: num_steps expert passes per decision, priced by the probe that runs them
    "flow": Workload("colorreach_pi0_ppo_tiny", (2,), "flow",
                     "M2Flow on 2 CPU cores: tiny π0 (PPO, 10 flow steps) on ColorReach rgb, one iteration (predicted)"),
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="rgb")
    parser.add_argument("--recipe", default=None, help="another recipe for the workload (default: the workload's)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--reprofile", action="store_true", help="measure the profile again (do it on a quiet machine)")
    parser.add_argument("overrides", nargs="*")
    add_output_args(parser, "m2flow_pipelining")
    args = parser.parse_args(argv)
    workload = WORKLOADS[args.workload]
    args.recipe = args.recipe or workload.recipe
    _, data = load_recipe(args.recipe)
    base = apply_overrides(EmbodiedConfig, data, ["plan.replan_threshold=0", *args.overrides])

    with Cluster(base.cluster) as cluster:
        profile = profile_embodied(base, cluster, force=args.reprofile)
    planned = plan_embodied(base, profile)
    choice, bound = planned.best, planned.bound
    mode = workload.sweep_mode
    configs = {
        "sequential": ["plan.mode=colocated", "plan.chunks=1"],
        **{(f"{mode}, {k} chunks" if mode else f"{k} chunks"): [f"plan.chunks={k}", *([f"plan.mode={mode}"] if mode else [])]
           for k in workload.chunks},
        "planner": [],
    }
    results: dict[str, Any] = {}
    for name, overrides in configs.items():
        cfg = apply_overrides(EmbodiedConfig, data, ["plan.replan_threshold=0", *args.overrides, *overrides])
        print(f"{name}:", flush=True)
        results[name] = run_config(cfg, args.iterations, calibrate=name == "planner")
        r = results[name]
        print(f"  {r['mode']}, {r['chunks']} chunk(s): measured {r['measured_iteration_s']:.2f} s/iteration, "
              f"predicted {r['predicted_iteration_s']:.2f} s (error {100 * r['prediction_error']:.1f}%)", flush=True)

    calibration = results["planner"]["calibration"]
    if calibration is not None:  # the plan the run settled on (its prediction from the probes below)
        choice = Plan.from_dict(calibration["chosen"])
        choice = dataclasses.replace(choice, predicted_iteration_s=predict(choice, profile, macro_flow_of(base), resources_of(base))[0])
    seq = results["sequential"]["measured_iteration_s"]
    best_name = min(results, key=lambda n: results[n]["measured_iteration_s"])
    best = results[best_name]["measured_iteration_s"]
    for r in results.values():
        r["speedup_vs_sequential"] = seq / r["measured_iteration_s"]
    seq_predicted = results["sequential"]["predicted_iteration_s"]
    summary = {
        "planner_speedup_vs_sequential": results["planner"]["speedup_vs_sequential"],
        # the share of the gap between sequential and the bound that the planner's choice captures
        "gap_captured_predicted": (seq_predicted - choice.predicted_iteration_s) / (seq_predicted - bound.iteration_s),
        "gap_captured_measured": (seq - results["planner"]["measured_iteration_s"]) / (seq - bound.iteration_s),
        "planner_vs_best_of_sweep": results["planner"]["measured_iteration_s"] / best,
        "best_config": best_name,
        "max_prediction_error": max(r["prediction_error"] for r in results.values()),
        # Work conservation (scheduler.bounds): no plan is predicted below bound_s, so no plan can
        # beat the sequential one by more than these ratios (predicted, and against the measurement).
        "bound_s": bound.iteration_s,
        "bound_limited_by": bound.limited_by,
        "speedup_ceiling_predicted": results["sequential"]["predicted_iteration_s"] / bound.iteration_s,
        "speedup_ceiling_measured": seq / bound.iteration_s,
    }
    if calibration is not None:
        # the bound again with every component's per-call cost as the choice measured it in the
        # pipeline: how much of the gap the plan's structure captures once the components run as
        # slowly as they do beside each other
        chosen_factors = min(calibration["measured"], key=lambda m: m["iteration_s"])["factors"]
        at_measured = rescale(profile, chosen_factors)
        measured_bound = lower_bound(macro_flow_of(base), at_measured, resources_of(base))
        summary["bound_at_measured_costs_s"] = measured_bound.iteration_s
        summary["gap_captured_measured_at_measured_costs"] = (
            (seq - results["planner"]["measured_iteration_s"]) / (seq - measured_bound.iteration_s))
        # where the rest goes: the choice's device-seconds beyond the least work, at those costs
        rest = gap_to_bound(simulate(choice, at_measured, macro_flow_of(base), resources_of(base)), measured_bound)
        summary["rest_of_gap_at_measured_costs"] = rest.to_dict()
    print(f"planner's choice ({choice.mode}, {choice.num_chunks} chunks): {summary['planner_speedup_vs_sequential']:.2f}x "
          f"sequential; {100 * (summary['planner_vs_best_of_sweep'] - 1):.1f}% from the best of the sweep; "
          f"max prediction error {100 * summary['max_prediction_error']:.1f}%")
    print(f"lower bound for any plan: {bound.iteration_s:.2f} s/iteration ({bound.limited_by}): no plan can be more than "
          f"{summary['speedup_ceiling_predicted']:.2f}x (predicted) / {summary['speedup_ceiling_measured']:.2f}x (measured "
          f"sequential) faster than sequential here")
    print(f"the planner's choice captures {100 * summary['gap_captured_predicted']:.0f}% (predicted) / "
          f"{100 * summary['gap_captured_measured']:.0f}% (measured) of the gap between sequential and the bound")
    if "bound_at_measured_costs_s" in summary:
        print(f"with the per-call costs calibration measured in the pipeline the bound is {summary['bound_at_measured_costs_s']:.2f} s: "
              f"the choice captures {100 * summary['gap_captured_measured_at_measured_costs']:.0f}% of that gap; "
              f"the rest, in seconds of its iteration: {rest.describe()}")

    workflow, resources = macro_flow_of(base), resources_of(base)
    seq_plan = sequential_plan(workflow, resources, profile)
    panels = {"sequential (1 chunk, colocated)": simulate(seq_plan, profile, workflow, resources)}
    if mode and mode != choice.mode:  # the best plan of the sweep's mode, to see what the choice gains on it
        swept = plan_embodied(apply_overrides(EmbodiedConfig, data, [*args.overrides, f"plan.mode={mode}"]), profile).best
        panels[f"best {mode} plan ({swept.num_chunks} chunks)"] = simulate(swept, profile, workflow, resources)
    lanes = f", {choice.lanes_label}" if choice.lanes_label else ""
    panels[f"planner's choice ({choice.mode}, {choice.num_chunks} chunks{lanes})"] = simulate(choice, profile, workflow, resources)
    if calibration is not None:  # where the measured iteration's extra time goes: the calls' own slowdown
        factors = ", ".join(f"{c} {f:.2f}x" for c, f in chosen_factors.items())
        panels[f"the choice at the per-call costs measured in the pipeline ({factors}); measured "
               f"{results['planner']['measured_iteration_s']:.2f} s\nbeyond the bound at those costs "
               f"({measured_bound.iteration_s:.2f} s): {rest.describe()}"] = simulate(choice, at_measured, workflow, resources)
    path = result_path("m2flow_pipelining", args, workload.variant)
    png = plot_timelines(panels, beside(path, "_timeline.png"), title=workload.title)
    result = {
        "workload_name": args.workload,
        "workload": {"recipe": Path(args.recipe).name, "env": base.env.id, "obs_mode": base.env.obs_mode,
                     "num_envs": base.env.num_envs, "rollout_steps": base.algo.rollout_steps, "policy": base.policy.name,
                     "policy_kwargs": base.policy.kwargs},
        "profile": profile.to_dict(),
        "bound": bound.to_dict(),
        "configs": results,
        "summary": summary,
        "timeline_png": png.name,
    }
    save_result(path, "m2flow_pipelining", argv, result, also=(png,))
    return result


if __name__ == "__main__":
    main()
