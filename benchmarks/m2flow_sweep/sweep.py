"""M2Flow per recipe: every candidate plan measured, against its prediction, the planner's choice and the bound.

For each recipe of :data:`SWEEP_RECIPES` (or ``--recipes``): profile (cached per env, policy and
hardware; ``--reprofile`` measures again), plan, and calibrate as a run of the recipe would
(:mod:`pipelines.calibrate`: the planner's best candidates measured over the first iterations,
within ``plan.calibrate`` of the recipe's iterations; the plan a run settles on and its corrected
prediction), and time the run's own next iterations under that plan (``--measure-s`` seconds of
them, the time a plan's rounds take together) against that prediction (what
a user's run logs, before any re-planning, and what ``--learning`` (:mod:`.learning`) reports for
the default job). Then build the workers of *every* candidate plan of the planner's table (each
distinct placement, chunk count, offload set and micro-batch, up to ``--max-chunks`` chunks; the
sequential plan always) afresh, load the trainer state the run had reached into them (every
candidate steps the policy the run's own iterations step: a fresh one's iterations are shorter),
and run ``--warmup`` untimed then ``--iterations`` timed training iterations of it, in each of
``--rounds`` rounds (2 by default) that interleave the plans, forward then backward, so that a host
whose speed wanders over minutes favours none (more iterations until a plan's rounds took
``--measure-s`` seconds, 16 by default, as long as calibration measures the planner's choice
(:data:`pipelines.calibrate.CHOICE_MEASURE_S`): a shared host's speed wanders for seconds at a
time, so a few short iterations know a plan's time no better than that wander (``--trace``
measures how far windows of one plan's iterations spread); an episodic iteration that ended early counts its own seconds, not the full iteration's it stands for;
each row reports how well its median is known, its relative standard error, and where its
iterations' seconds went: collection, simulator and policy calls, the update),
re-planning off. Per recipe it reports each candidate's predicted (probes alone,
and corrected by calibration) and measured seconds per iteration (an episodic GRPO iteration ends
once its episodes are over, sooner while the policy is young: each is predicted as it ran, at the
decisions it took and the samples it trained on), the run's choice against the
measured best, the work-conservation bound (``scheduler.bounds``), and how much of the gap
between sequential and the bound the choice captures. Calibration and each measurement minutes
later may find a shared host at different speeds: a fixed one-thread workload
(:func:`benchmarks.common.host_reference_s`) is timed around calibration and around every
measurement, and each row reports that drift and the error the prediction would have had at
calibration's speed, beside the error itself, and the share of CPU time the hypervisor stole
while it was measured (``/proc/stat``'s steal; a VM's vCPUs can lose time a one-thread workload
timed between the runs does not see).

    python -m benchmarks.m2flow_sweep                     # every recipe: ~40 min on 2 quiet cores, ~2 h on a slow 2-vCPU VM
    python -m benchmarks.m2flow_sweep maniskill_pushcube_ppo --iterations 5
    python -m benchmarks.m2flow_sweep --quick             # tiny settings, a correctness check (~2 min)

Writes ``benchmarks/results/m2flow_sweep.json`` (``m2flow_sweep_quick.json`` with ``--quick``),
a picture of predicted vs measured per candidate beside it (``m2flow_sweep.png``) and prints the
table of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from benchmarks.common import beside, host_window, result_path, save_result
from embodied.config import apply_overrides
from embodied.runtime import Cluster
from pipelines.config import EmbodiedConfig
from pipelines.calibrate import (
    CHOICE_MAX_ITERATIONS,
    CHOICE_MEASURE_S,
    MAX_ITERATIONS,
    MEASURE_S,
    Calibrated,
    Calibrator,
    relative_standard_error,
)
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.onpolicy.planning import macro_flow_of, plan_embodied, resources_of
from pipelines.probes import profile_embodied
from pipelines.replan import rescale
from pipelines.recipes import load_recipe
from pipelines.runner import Runner
from scheduler import Plan, Profile, sequential_plan

#: the folder of the benchmarks (and of the sweep's own recipe, ``m2flow_rgb.yaml``)
HERE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SweepRecipe:
    """A recipe of the sweep: its name (or path) and the overrides of ``--quick`` (tiny settings)."""

    recipe: str
    label: str
    quick: tuple[str, ...] = ()


SWEEP_RECIPES = (
    SweepRecipe("cartpole_ppo", "CartPole PPO", ("algo.epochs=2",)),
    SweepRecipe("halfcheetah_ppo", "HalfCheetah PPO", ("algo.rollout_steps=16", "algo.epochs=1", "algo.num_minibatches=2")),
    SweepRecipe("maniskill_pushcube_ppo", "PushCube state PPO (default job)",
                ("algo.rollout_steps=8", "algo.epochs=1", "algo.num_minibatches=2")),
    SweepRecipe("maniskill_pushcube_rgb_ppo", "PushCube rgb PPO",
                ("env.num_envs=4", "env.image_size=64", "algo.rollout_steps=4", "algo.epochs=1", "algo.num_minibatches=1")),
    SweepRecipe(str(HERE / "m2flow_rgb.yaml"), "PushCube rgb + token policy (VLA-shaped)",
                ("env.num_envs=4", "env.image_size=64", "algo.rollout_steps=2", "algo.num_minibatches=1")),
    SweepRecipe("cartpole_grpo", "CartPole GRPO", ("env.num_envs=8", "algo.group_size=4", "algo.rollout_steps=32",
                                                    "algo.epochs=1", "algo.num_minibatches=1")),
    SweepRecipe("maniskill_pushcube_grpo", "PushCube state GRPO",
                ("env.num_envs=8", "algo.group_size=4", "algo.rollout_steps=8", "algo.epochs=1", "algo.num_minibatches=1")),
)
QUICK_RECIPES = ("cartpole_ppo", "cartpole_grpo")
#: every run of the sweep: measured as planned (no re-planning, no learning into the cache)
FIXED = ("plan.replan_threshold=0", "plan.learn=false", "logging.tensorboard=false", "logging.wandb=false")
#: seconds of timed iterations per plan, and the most iterations they may take: as calibration
#: measures the planner's choice, whose price is the prediction checked (``--quick``, a
#: correctness check rather than a measurement: half a second, at most 10 iterations)
SWEEP_MEASURE_S, SWEEP_MAX_ITERATIONS = CHOICE_MEASURE_S, CHOICE_MAX_ITERATIONS
QUICK_MEASURE_S, QUICK_MAX_ITERATIONS = 0.5, 10
#: rounds each plan is measured in, interleaved with the others' (forward, then backward): plans
#: measured once each, minutes apart, differ by the host's drift between them as much as by
#: themselves; two rounds in opposite orders give every plan the same mean moment of the sweep
SWEEP_ROUNDS = 2
#: where an iteration's seconds went, as the workflow reports them: collection (and its
#: simulator's and policy's own seconds per call, averaged over ranks), the update
PARTS = ("time/rollout_s", "time/sim_s", "time/infer_s", "time/train_s")


def describe(plan: Plan) -> str:
    spans = " ".join(f"{c}:{'-'.join(map(str, (d[0], d[-1]))) if len(d) > 1 else d[0]}{'*' if c in plan.offload else ''}"
                     for c, d in plan.placement.items())
    return " ".join(part for part in (plan.mode, f"{plan.num_chunks}ch", spans, plan.lanes_label) if part)


def candidates(result: Any, sequential: Plan, max_chunks: int) -> list[Plan]:
    """The planner's distinct candidates up to ``max_chunks`` chunks, fastest predicted first, and
    the sequential plan."""
    out: dict[tuple, Plan] = {}
    for p, _ in result.candidates:
        if p.num_chunks <= max_chunks:
            out.setdefault(p.key(), p)
    out.setdefault(sequential.key(), sequential)
    out.setdefault(result.best.key(), result.best)
    return list(out.values())


def timed_enough(ran: list[dict[str, Any]], iterations: int, measure_s: float, max_iterations: int) -> bool:
    """Whether the iterations ``ran`` time a plan: ``iterations`` at least, then more until they
    took ``measure_s`` seconds, at most ``max_iterations``."""
    return len(ran) >= iterations and (sum(m["time/iteration_s"] for m in ran) >= measure_s or len(ran) >= max_iterations)


def calibrate(cfg: EmbodiedConfig, cluster: Cluster, iterations: int, measure_s: float,
              max_iterations: int) -> tuple[Calibrated | None, Calibrator, int, list[dict[str, Any]], dict[str, Any]]:
    """Profile (cached), plan and calibrate as a run of ``cfg`` does; what calibration settled on
    (None when the run is too short to calibrate), the calibrator (each candidate's correction),
    the iterations it took, and the metrics of the run's next iterations under the plan it
    settled on (as :func:`measure` times a plan: ``iterations``, more up to ``measure_s`` seconds):
    the prediction against the run's own iterations, before any re-planning, as a user's run
    logs it (``plan/measured_over_predicted``; what ``--learning`` reports);
    and the trainer's state after them (the policy the run had reached, which :func:`measure`
    starts every candidate from)."""
    workflow = EmbodiedWorkflow(cfg)
    runner = Runner(cfg, None, workflow)
    runner.start(cluster)
    try:
        settling = runner.settle()
        if settling == 0:
            runner.step()  # the run's first iteration (resets, first calls): calibration's warm-up otherwise
        ran: list[dict[str, Any]] = []
        for _ in range(2 * max_iterations):  # iterations without an update (staleness 1's first) carry no ratio
            if timed_enough(ran, iterations, measure_s, max_iterations):
                break
            metrics = runner.step()
            if metrics.get("plan/measured_over_predicted") is not None:
                ran.append(metrics)
        return runner.calibrated, runner.calibrator, settling, ran, workflow.trainer_state()
    finally:
        workflow.close()


def run_error(ran: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's own iterations after calibration against the prediction for each as it ran
    (None each where none carried a prediction)."""
    if not ran:
        return {"run_measured_all_s": [], "run_measured_s": None, "run_predicted_s": None, "run_error": None}
    times = [m["time/iteration_s"] for m in ran]
    predicted = [m["time/iteration_s"] / m["plan/measured_over_predicted"] for m in ran]
    return {"run_measured_all_s": times, "run_measured_s": statistics.median(times),
            "run_predicted_s": statistics.median(predicted), "run_error": error(predicted, times)}


def measure(cfg: EmbodiedConfig, cluster: Cluster, profile: Profile, plan: Plan, warmup: int,
            iterations: int, measure_s: float = MEASURE_S,
            max_iterations: int = MAX_ITERATIONS, state: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The metrics of at least ``iterations`` training iterations (after ``warmup``) under exactly
    ``plan``, more until they took ``measure_s`` seconds (short iterations are noisy; by default as
    calibration measures), at most ``max_iterations``; on workers built afresh that continue from
    the trainer ``state`` when given (as a resumed run does: the policy a run had reached steps its
    simulator as the run's own iterations do, where a fresh policy's episodes, and so an episodic
    iteration, end sooner)."""
    workflow = EmbodiedWorkflow(cfg)
    runner = Runner(cfg, None, workflow)
    workflow.machine(cluster)
    layout = workflow.layout_of(plan)
    workflow.build(cluster, layout, profile)
    try:
        if state is not None:
            workflow.load_trainer_state(state)
        ran: list[dict[str, Any]] = []
        for _ in range(warmup):
            runner.step()
        while not timed_enough(ran, iterations, measure_s, max_iterations):
            ran.append(runner.step())
        return ran
    finally:
        workflow.close()


def schedule(num_plans: int, rounds: int) -> list[tuple[int, int]]:
    """The order plans are measured in, as ``(round, plan index)``: every plan once per round,
    forward in even rounds and backward in odd ones, so a host speeding up or slowing down
    through the sweep favours no plan (with two rounds each plan's mean time sits at the sweep's
    middle)."""
    order: list[tuple[int, int]] = []
    for r in range(rounds):
        ids = range(num_plans) if r % 2 == 0 else reversed(range(num_plans))
        order.extend((r, i) for i in ids)
    return order


def pooled(rounds: list[list[dict[str, Any]]], hosts: list[dict[str, float | None]]) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """A plan's rounds as one measurement: their iterations in the order they ran, and the host's
    speed (the reference workload's seconds) and steal averaged over the rounds' windows (steal
    None where a window could not read it)."""
    steals = [h["steal"] for h in hosts]
    return ([m for one in rounds for m in one],
            {"reference_s": statistics.fmean(h["reference_s"] for h in hosts),
             "steal": None if any(x is None for x in steals) else statistics.fmean(steals)})


def error(predicted: list[float], times: list[float]) -> float:
    """Median relative error of each iteration's prediction (for the iteration as it ran) against
    its measured seconds."""
    return statistics.median((p - t) / t for p, t in zip(predicted, times))


def sweep_recipe(entry: SweepRecipe, args: argparse.Namespace) -> dict[str, Any]:
    _, data = load_recipe(entry.recipe)
    overrides = [*FIXED, f"plan.max_chunks={args.max_chunks}", *(entry.quick if args.quick else ()), *args.overrides]
    cfg = apply_overrides(EmbodiedConfig, data, overrides)
    print(f"== {entry.label} ({Path(entry.recipe).name})", flush=True)
    with Cluster(cfg.cluster) as cluster:
        profile = profile_embodied(cfg, cluster, force=args.reprofile, log=lambda line: None)
        result = plan_embodied(cfg, profile)
        workflow, resources = macro_flow_of(cfg), resources_of(cfg)
        pricing = EmbodiedWorkflow(cfg)  # prices iterations as they ran (the runtime's workflow, not the planner's)
        pricing.machine(cluster)
        sequential = sequential_plan(workflow, resources, profile)
        with host_window() as calibration_host:  # the host's speed while calibration (and the run after it) measured
            calibrated, calibrator, calibration_iterations, continued, state = calibrate(
                cfg, cluster, args.iterations, args.measure_s, args.max_iterations)
        own = run_error(continued)
        chosen_plan = calibrated.plan if calibrated is not None else result.best
        corrected = {p.key(): s for p, s in calibrated.predictions} if calibrated is not None else {}
        if calibrated is not None:
            print(f"  {calibrated.reason}", flush=True)
        plans = candidates(result, sequential, args.max_chunks)
        if chosen_plan.key() not in {p.key() for p in plans}:
            plans.append(chosen_plan)
        # every plan measured in each of ``rounds`` rounds, in alternating order (:func:`schedule`):
        # a host whose speed wanders over minutes slows or speeds all plans alike, not the ones
        # measured in its slow spell
        runs: dict[int, list[list[dict[str, Any]]]] = {i: [] for i in range(len(plans))}
        hosts: dict[int, list[dict[str, float | None]]] = {i: [] for i in range(len(plans))}
        per_round_s = args.measure_s / args.rounds
        for r, i in schedule(len(plans), args.rounds):
            with host_window() as host:
                ran = measure(cfg, cluster, profile, plans[i], args.warmup, args.iterations, per_round_s, args.max_iterations,
                              state)
            runs[i].append(ran)
            hosts[i].append(host)
            if args.rounds > 1:
                print(f"  round {r + 1}/{args.rounds} [{i + 1}/{len(plans)}] {describe(plans[i]):<44} "
                      f"{statistics.median(m['time/iteration_s'] for m in ran):7.3f} s", flush=True)
        rows = []
        for i, p in enumerate(plans):
            predicted = corrected.get(p.key(), p.predicted_iteration_s)
            ran, host = pooled(runs[i], hosts[i])
            times = [m["time/iteration_s"] for m in ran]
            # each iteration's share of a full one, per round (1.0 unless an episodic one ended early)
            round_scales = [[pricing.shape_scale(p, profile, m) for m in one] for one in runs[i]]
            scales = [sc for one in round_scales for sc in one]
            parts = [{k.removeprefix("time/"): m[k] for k in PARTS if m.get(k) is not None} for m in ran]
            # each iteration's prediction as it ran (an episodic one may end early;
            # Workflow.predicted_as_ran): on the profile rescaled by the per-call factors
            # calibration priced the plan with, plus its runtime residual per iteration
            correction = calibrator.correction(p) if calibrated is not None else None
            priced_on = rescale(profile, correction[0]) if correction is not None else profile
            corrected_plan = dataclasses.replace(p, predicted_iteration_s=predicted)
            profiled_as_ran = [pricing.predicted_as_ran(p, profile, m) for m in ran]
            predicted_as_ran = [pricing.predicted_as_ran(corrected_plan, priced_on, m) for m in ran]
            measured = statistics.median(times)
            # > 1: the host ran the fixed workload slower now than while calibration measured
            host_drift = host["reference_s"] / calibration_host["reference_s"]
            steal = host["steal"]
            row = {
                "plan": describe(p), "mode": p.mode, "chunks": p.num_chunks,
                "placement": {c: list(d) for c, d in p.placement.items()}, "offload": list(p.offload),
                "train_microbatch": p.train_microbatch,
                # predictions for the iterations as they ran (an episodic one may end early: scale < 1)
                "profiled_s": statistics.median(profiled_as_ran), "predicted_s": statistics.median(predicted_as_ran),
                "measured_s": measured, "measured_all_s": times, "shape_scales": scales,
                # each round's iterations (of measured_all_s, in order) and median per full iteration
                "measured_rounds_n": [len(one) for one in runs[i]],
                "measured_rounds_s": [statistics.median(m["time/iteration_s"] / sc for m, sc in zip(one, one_scales))
                                      for one, one_scales in zip(runs[i], round_scales)],
                # how well the median is known: its standard error over it (from the spread)
                "measured_rse": relative_standard_error(times),
                # the median seconds of each part of an iteration (collection, simulator, policy, update)
                "measured_parts_s": {k: statistics.median(x[k] for x in parts) for k in parts[0] if all(k in x for x in parts)},
                # what a full iteration measures (an early-ended one divided by its shape scale): the
                # unit plans are compared in and the bound is in
                "measured_full_s": statistics.median(t / sc for t, sc in zip(times, scales)),
                # the weights version each round's first timed iteration acted with: the run's
                # policy (its trainer state, ``run_policy_version``) and the warm-up's updates on it
                "policy_versions": [one[0].get("weights/version") for one in runs[i]],
                "profiled_error": error(profiled_as_ran, times),
                "error": error(predicted_as_ran, times),
                "host_reference_s": host["reference_s"], "host_drift": host_drift,
                # the share of the CPU time the hypervisor took while this plan was measured (VMs)
                "host_steal": steal,
                # the error had the host run as fast as while calibration measured: the prediction
                # scaled by the drift (a diagnostic beside the error, which stays the verdict)
                "error_at_calibration_speed": error([x * host_drift for x in predicted_as_ran], times),
                "calibrated": calibrated is not None and any(m.plan.key() == p.key() for m in calibrated.measurements),
                "chosen": p.key() == chosen_plan.key(), "first_choice": p.key() == result.best.key(),
                "sequential": p.key() == sequential.key(),
            }
            rows.append(row)
            print(f"  [{i + 1}/{len(plans)}] {row['plan']:<44} profiled {row['profiled_s']:7.3f} s, corrected "
                  f"{row['predicted_s']:7.3f} s, measured {measured:7.3f} s ({100 * row['error']:+.1f}%; host x{host_drift:.2f}"
                  f" of calibration's: {100 * row['error_at_calibration_speed']:+.1f}% at its speed"
                  f"{'' if steal is None else f'; steal {100 * steal:.0f}%'})"
                  f"{'  <- chosen' if row['chosen'] else ''}", flush=True)
    bound_s = result.bound.iteration_s if result.bound is not None else None
    summary = {**summarize(rows, bound_s, calibration_iterations), **own}
    summary["calibration_host_reference_s"] = calibration_host["reference_s"]
    summary["calibration_host_steal"] = calibration_host["steal"]
    summary["run_policy_version"] = state["version"]  # the policy every candidate was measured on
    chosen = next(r for r in rows if r["chosen"])
    bound = "-" if bound_s is None else f"{bound_s:.3f} s"
    print(f"  chosen {summary['chosen']}: {chosen['measured_s']:.3f} s, {100 * (summary['chosen_over_best'] - 1):.1f}% "
          f"above the best ({summary['best']}); prediction {100 * chosen['error']:+.1f}%; bound {bound} per full "
          f"iteration" + ("" if own["run_error"] is None else f"; the run's own {len(continued)} iterations after "
          f"calibration {own['run_measured_s']:.3f} s, prediction {100 * own['run_error']:+.1f}%"), flush=True)
    return {"recipe": Path(entry.recipe).name, "label": entry.label, "overrides": overrides,
            "profile_key": profile.meta.get("key"), "profile_learned_runs": len(profile.meta.get("learned", [])),
            "bound": result.bound.to_dict() if result.bound is not None else None,
            "candidates": rows, "summary": summary}


def summarize(rows: list[dict[str, Any]], bound_s: float | None, calibration_iterations: int) -> dict[str, Any]:
    """A recipe's verdict from its measured candidates: the choice against the measured best, the
    speed-up over sequential and the share of the gap to the bound it captured. Plans are compared
    per full iteration (``measured_full_s``): an episodic GRPO iteration ends when its episodes do,
    at a different point under each plan, and the bound prices a full one."""
    chosen = next(r for r in rows if r["chosen"])
    first = next(r for r in rows if r["first_choice"])
    seq = next(r for r in rows if r["sequential"])
    best = min(rows, key=lambda r: r["measured_full_s"])
    gap = seq["measured_full_s"] - bound_s if bound_s is not None else None
    return {
        "chosen": chosen["plan"], "best": best["plan"],
        # as the iterations ran (the unit of the prediction error)
        "chosen_measured_s": chosen["measured_s"], "chosen_error": chosen["error"],
        "chosen_host_drift": chosen.get("host_drift"), "chosen_error_at_calibration_speed": chosen.get("error_at_calibration_speed"),
        # per full iteration (the unit of the comparisons and the bound)
        "chosen_full_s": chosen["measured_full_s"], "best_full_s": best["measured_full_s"],
        "chosen_over_best": chosen["measured_full_s"] / best["measured_full_s"],
        # how well that ratio is known: the two medians' relative standard errors combined (None
        # where the choice is the best, or for rows without them)
        "chosen_over_best_rse": _ratio_rse(chosen, best),
        # round by round, the choice over that round's fastest plan (plans measured minutes apart,
        # not a sweep apart)
        "chosen_over_best_rounds": _per_round_over_best(rows, chosen),
        "first_choice": first["plan"], "first_choice_profiled_error": first["profiled_error"],
        "first_choice_over_best": first["measured_full_s"] / best["measured_full_s"],
        "calibration_iterations": calibration_iterations,
        "max_abs_error": max(abs(r["error"]) for r in rows),
        "max_abs_profiled_error": max(abs(r["profiled_error"]) for r in rows),
        "sequential_full_s": seq["measured_full_s"],
        "speedup_vs_sequential": seq["measured_full_s"] / chosen["measured_full_s"],
        "bound_s": bound_s,
        # the share of the possible gain (sequential -> bound) the choice realised, measured
        "gap_captured": (seq["measured_full_s"] - chosen["measured_full_s"]) / gap if gap and gap > 0 else None,
    }


def _per_round_over_best(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> list[float]:
    """Each round's median of the choice over the fastest median of that round (rows without
    rounds: none)."""
    rounds = [r.get("measured_rounds_s", []) for r in rows]
    n = min(len(x) for x in rounds)
    return [chosen["measured_rounds_s"][k] / min(x[k] for x in rounds) for k in range(n)]


def _ratio_rse(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """The relative standard error of ``a``'s median over ``b``'s (independent measurements)."""
    if a is b or a.get("measured_rse") is None or b.get("measured_rse") is None:
        return None
    return math.hypot(a["measured_rse"], b["measured_rse"])


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of docs/benchmarks.md: one row per recipe."""
    lines = ["| recipe | plan a run settles on | predicted s | measured s | error (host speed vs calibration's: error at "
             "its speed) | the run's own iterations: measured s (error) | probes' first choice (error) "
             "| full iteration s | best (plan) | choice vs best (+- its standard error) | sequential s | bound s | gap captured "
             "| calibration its |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["summary"]
        chosen = next(c for c in r["candidates"] if c["chosen"])
        captured = "-" if s["gap_captured"] is None else f"{100 * s['gap_captured']:.0f}%"
        bound = "-" if s["bound_s"] is None else f"{s['bound_s']:.3f}"
        err = f"{100 * s['chosen_error']:+.1f}%"
        if s.get("chosen_host_drift") is not None:  # sweeps since the host reference was timed
            err += f" (host x{s['chosen_host_drift']:.2f}: {100 * s['chosen_error_at_calibration_speed']:+.1f}%)"
        own = "-" if s.get("run_error") is None else f"{s['run_measured_s']:.3f} ({100 * s['run_error']:+.1f}%)"
        vs_best = f"{100 * (s['chosen_over_best'] - 1):+.1f}%"
        if s.get("chosen_over_best_rse") is not None and math.isfinite(s["chosen_over_best_rse"]):
            vs_best += f" (+-{100 * s['chosen_over_best_rse']:.1f}%)"
        lines.append(f"| {r['label']} | {s['chosen']} | {chosen['predicted_s']:.3f} | {s['chosen_measured_s']:.3f} "
                     f"| {err} | {own} | {s['first_choice']} ({100 * s['first_choice_profiled_error']:+.1f}%) "
                     f"| {s['chosen_full_s']:.3f} | {s['best_full_s']:.3f} ({s['best']}) "
                     f"| {vs_best} | {s['sequential_full_s']:.3f} | {bound} "
                     f"| {captured} | {s['calibration_iterations']} |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> Path:
    """One panel per recipe: seconds per iteration of every candidate as the probes predicted them,
    as calibration corrected them, and measured; the run's choice marked, the bound dashed."""
    n = len(results)
    fig = Figure(figsize=(11, 2.6 * n + 0.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for ax, r in zip(axes, results):
        rows = sorted(r["candidates"], key=lambda c: c["predicted_s"])
        xs = range(len(rows))
        ax.bar([x - 0.27 for x in xs], [c["profiled_s"] for c in rows], 0.27, color="#d9d9d9", label="predicted from the probes")
        ax.bar(list(xs), [c["predicted_s"] for c in rows], 0.27, color="#9db7d5", label="predicted after calibration")
        ax.bar([x + 0.27 for x in xs], [c["measured_s"] for c in rows], 0.27,
               color=["#c0392b" if c["chosen"] else "#2f6fb0" for c in rows], label="measured (red: the plan a run settles on)")
        bound_s, title = r["summary"]["bound_s"], r["label"]
        # the bars are iterations as they ran; the bound prices a full one, so it is drawn only where
        # every iteration was full (an episodic GRPO iteration ends early: its bound goes in the title)
        full = all(sc == 1.0 for c in rows for sc in c.get("shape_scales", [1.0]))
        if bound_s is not None and full:
            ax.axhline(bound_s, color="0.3", ls="--", lw=1, label="bound (work conservation)")
        elif bound_s is not None:
            title += f"  (iterations end with their episodes; bound {bound_s:.3f} s per full iteration)"
        ax.set_xticks(list(xs), [c["plan"] for c in rows], rotation=25, ha="right", fontsize=7)
        ax.set_ylabel("s / iteration")
        ax.set_title(title, fontsize=9, loc="left")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.savefig(path)
    return path


def run(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """The sweep over ``args.recipes`` (all of :data:`SWEEP_RECIPES` when empty; with ``--quick``,
    :data:`QUICK_RECIPES` at tiny settings) with ``args.overrides`` on each; writes its result, the
    picture beside it, and prints the table."""
    args.iterations = args.iterations or (1 if args.quick else 3)
    args.max_chunks = args.max_chunks or (2 if args.quick else 4)
    args.measure_s = args.measure_s if args.measure_s is not None else (QUICK_MEASURE_S if args.quick else SWEEP_MEASURE_S)
    args.max_iterations = args.max_iterations or (QUICK_MAX_ITERATIONS if args.quick else SWEEP_MAX_ITERATIONS)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else SWEEP_ROUNDS)
    known = {Path(e.recipe).name.removesuffix(".yaml"): e for e in SWEEP_RECIPES}
    wanted = args.recipes or (QUICK_RECIPES if args.quick else [Path(e.recipe).name.removesuffix(".yaml") for e in SWEEP_RECIPES])
    entries = [known.get(Path(r).name.removesuffix(".yaml"), SweepRecipe(r, r)) for r in wanted]

    results = [sweep_recipe(e, args) for e in entries]
    md = table(results)
    print(md)
    path = result_path("m2flow_sweep", args, "quick" if args.quick else None)
    png = plot(results, beside(path, ".png"))
    result = {
        "mode": "sweep",
        "settings": {"iterations": args.iterations, "warmup": args.warmup, "max_chunks": args.max_chunks, "quick": args.quick,
                     "measure_s": args.measure_s, "max_iterations": args.max_iterations, "rounds": args.rounds},
        "recipes": results,
        "table_md": md,
        "png": png.name,
    }
    save_result(path, "m2flow_sweep", argv, result, also=(png,))
    return result
