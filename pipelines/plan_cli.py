"""``embodied plan RECIPE [key=value ...] [--profile] [--out PATH]``: what the M2Flow planner would
run, and why: the candidate table, the chosen plan, and a Gantt chart of its timeline against the
sequential plan (one chunk, colocated).

The chart goes to ``--out``, else into the run when the command names an existing one
(``resume=RUN`` or ``run.dir=RUN``: ``RUN/plan.png``), else to ``runs/plans/<recipe>.png``;
never into the current directory itself."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from embodied.errors import UserError
from embodied.runtime import Cluster
from pipelines.cli import build_train_config, register_command
from pipelines.layout import Machine, NodeSpec
from pipelines.learn import describe_provenance
from pipelines.workflow import WORKFLOWS
from scheduler import GPU_OVERLAP, GPU_SWITCH, Bound, GapToBound, Plan, PlanningError, gap_to_bound, simulate


def describe_bound(bound: Bound, sequential_s: float, chosen_s: float, gap: GapToBound | None = None) -> str:
    """One paragraph: the least time any plan could take here, what that leaves to gain, and
    (``gap``) where the chosen plan spends the time above it."""
    why = ("every component's least core/GPU-seconds spread over all devices" if bound.limited_by == "work"
           else f"{bound.limited_by} alone takes that long")
    work = ", ".join(f"{c} {s:.3g}" for c, s in bound.work_device_s.items())
    return (f"lower bound for any plan: {bound.iteration_s:.3f} s/iteration ({why}; device-seconds: {work}); "
            f"at most {sequential_s / bound.iteration_s:.2f}x over sequential, the chosen plan is "
            f"{100 * (chosen_s / bound.iteration_s - 1):.0f}% above it"
            + (f" (beyond the least work: {gap.describe()})" if gap is not None else ""))


def cmd_plan(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="embodied plan", description=__doc__)
    parser.add_argument("--profile", action="store_true", help="measure again even if a cached profile exists")
    parser.add_argument("--out", default=None, help="timeline PNG (default: RUN/plan.png of an existing run dir, "
                        "else runs/plans/<recipe>.png)")
    parser.add_argument("--json", default=None, help="also write the plan, candidates and profile as JSON")
    parser.add_argument("--gpus", type=int, default=None, help="plan for this machine's cores and N GPUs, present "
                        "or not (the costs are measured on what this machine has: its CPUs where it has no GPU)")
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="memory of each --gpus GPU (default 80)")
    flags, rest = parser.parse_known_args(args)
    cfg = build_train_config(rest)
    spec = WORKFLOWS.get(cfg.workflow)
    flow = spec.build(cfg)
    if not flow.has_cost_model():
        raise UserError(f"embodied plan has nothing to show for {cfg.recipe}: its workflow ({cfg.workflow}) has no cost "
                        "model, so it is never planned; it runs on a fixed layout (every component on every core, "
                        "plan.chunks chunks), and embodied train runs it as it is. Plan an on-policy recipe instead "
                        "(embodied plan mjx_reacher_ppo, for one).")
    flow.preflight()
    measured_on = flow
    if flags.gpus is not None:
        flow.machine_ = described_machine(cfg, flags.gpus, flags.gpu_gib)
        measured_on = spec.build(measurable_config(cfg))
    with Cluster(cfg.cluster) as cluster:
        if flags.gpus is None:
            flow.machine(cluster)  # the devices a run here plans on: this node's GPUs too, where a worker is on CUDA
        profile = measured_on.profile(cluster, force=flags.profile or cfg.plan.reprofile, log=print)
    try:
        result = flow.plan(profile)
        baseline = sequential_of(spec, cfg, flow.machine(), profile)
    except PlanningError as err:
        raise UserError(f"No plan fits this machine: {err}") from None
    print(describe_provenance(profile))
    workflow, resources = flow.macro_flow(), flow.resources()
    base_timeline = simulate(baseline, profile, workflow, resources)
    best = result.best
    kinds = [d.kind for d in resources.devices]
    print(f"workflow: {flow.describe()}; " + " + ".join(f"{kinds.count(k)} {k} devices" for k in dict.fromkeys(kinds))
          + (" (described: --gpus)" if flags.gpus is not None else ""))
    print(result.format_table(limit=12))
    print("\n" + describe_choice(best, baseline))
    if result.bound is not None:
        print(describe_bound(result.bound, baseline.predicted_iteration_s, best.predicted_iteration_s,
                             gap_to_bound(result.best_timeline, result.bound)))
    out = Path(flags.out) if flags.out else default_plot_path(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    from embodied.timeline_plot import plot_timelines  # matplotlib: only when drawing

    plot_timelines({"sequential (1 chunk, colocated)": base_timeline, f"chosen ({best.mode}, {best.num_chunks} chunks)": result.best_timeline},
                   out, title=f"{cfg.recipe}: one iteration, predicted")
    print(f"timeline: {out}")
    if flags.json:
        Path(flags.json).write_text(json.dumps({
            "plan": best.to_dict(), "sequential": baseline.to_dict(), "profile": profile.to_dict(),
            "bound": result.bound.to_dict() if result.bound is not None else None,
            "candidates": [dict(zip(("mode", "chunks", "placement", "predicted_s", "mean_utilization"), row)) for row in result.table()],
        }, indent=2))
    return 0


def sequential_of(spec, cfg, machine: Machine, profile) -> Plan:
    """The sequential plan (colocated, one chunk) as the workflow plans it on ``machine``: each
    component on the kind of device it runs on, as in the chosen plan, so the two compare."""
    sequential = dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, mode="colocated", chunks=1))
    flow = spec.build(sequential)
    flow.machine_ = machine
    return flow.plan(profile).best


#: What each ``Plan.gpu_sharing`` means at run time, as `embodied plan` says it.
GPU_SHARING_WORDS = {
    GPU_SWITCH: "one component at a time on a shared GPU; env and rollout take turns",
    GPU_OVERLAP: "env and rollout side by side on their GPU, chunks pipelined",
}


def describe_choice(best: Plan, baseline: Plan) -> str:
    """The chosen plan in two lines: its mode, chunks, placement, offloads and, where a GPU
    simulator shares its GPU, how (``Plan.gpu_sharing``); its prediction against ``baseline``."""
    sharing = f", gpu sharing {best.gpu_sharing} ({GPU_SHARING_WORDS[best.gpu_sharing]})" if best.gpu_sharing else ""
    speedup = baseline.predicted_iteration_s / best.predicted_iteration_s
    return (f"chosen: {best.mode}, {best.num_chunks} chunk(s), placement "
            + ", ".join(f"{c}:{list(d)}" for c, d in best.placement.items())
            + (f", offload {list(best.offload)}" if best.offload else "") + sharing
            + f"\npredicted {best.predicted_iteration_s:.3f} s/iteration vs sequential {baseline.predicted_iteration_s:.3f} s "
            f"({speedup:.2f}x)")


def described_machine(cfg, gpus: int, gpu_gib: float = 80.0) -> Machine:
    """A machine to plan for without its hardware (``embodied plan --gpus N``): this machine's CPU
    cores (``cluster.num_cpus``) and ``gpus`` GPUs of ``gpu_gib`` GiB each, on one node."""
    if gpus < 0:
        raise UserError(f"--gpus must be >= 0, got {gpus}.")
    local = Machine.local_cpus(cfg.cluster.num_cpus)
    if gpus == 0:
        return local
    return Machine.of_nodes([NodeSpec(None, "node0", len(local.resources), gpus, local.resources.devices[0].memory_gib, gpu_gib)])


def measurable_config(cfg):
    """``cfg`` with every ``workers.*_device`` on CUDA moved to the CPU where this machine has no
    GPU (``--gpus``: the profile is measured on what is here, and planned for what is described)."""

    import torch

    if torch.cuda.is_available():
        return cfg
    moved = {k: "cpu" for k in ("rollout_device", "trainer_device", "env_device") if getattr(cfg.workers, k) != "cpu"}
    return dataclasses.replace(cfg, workers=dataclasses.replace(cfg.workers, **moved))


def default_plot_path(cfg) -> Path:
    """``<run dir>/plan.png`` when ``cfg`` names an existing run (``resume=`` or a ``run.dir``
    holding a ``config.yaml``), else ``runs/plans/<recipe>.png``."""
    run_dir = getattr(getattr(cfg, "run", None), "dir", None)
    if run_dir and (Path(run_dir) / "config.yaml").is_file():
        return Path(run_dir) / "plan.png"
    return Path("runs") / "plans" / f"{cfg.recipe}.png"


register_command("plan", cmd_plan, "show the M2Flow plan: embodied plan RECIPE [key=value ...] [--profile]")
