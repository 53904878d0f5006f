"""Plan search: enumerate modes x placements x chunk counts (x lanes) x offload sets, simulate, rank.

For each placement and chunk count the planner derives the memory-dependent choices instead of
enumerating them blindly: for every set of offloaded components it takes the largest trainer
micro-batch that fits (fewer calls are never slower), drops infeasible sets and sets dominated by a
smaller set with an equal or larger micro-batch (extra context switches are never faster), and
simulates what is left. Ranking: predicted iteration time, then fewer chunks, then the simpler
mode (:data:`~scheduler.plans.MODES` order), then fewer lanes, then the simpler GPU sharing
(``switch`` before ``overlap``, where a GPU simulator shares its GPUs), then fewer offloads, then a larger micro-batch, then
the placement — fully deterministic.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from itertools import combinations, product

from scheduler.bounds import Bound, lower_bound
from scheduler.memory import component_memory_gib, phase_overflows, resident_memory_gib, switchable_components
from scheduler.placements import PLACEMENT_MODES, Placement, eligible_classes
from scheduler.plans import GPU_SHARING, GPU_SWITCH, LANE_MODES, MODES, SHARED, STREAMS, Plan, Timeline
from scheduler.profile import Profile
from scheduler.resources import Resources
from scheduler.simulate import predict, simulate
from scheduler.flows import MacroFlow

DEFAULT_MAX_CHUNKS = 16
_TIME_DECIMALS = 9  # predicted times equal to 1 ns count as ties


class PlanningError(ValueError):
    """No plan fits the resources; the message says which component does not fit where."""


@dataclass(frozen=True)
class PlanResult:
    """The best plan, its timeline, and the ranked candidates (best first)."""

    best: Plan
    best_timeline: Timeline
    candidates: list[tuple[Plan, Timeline]]
    """The ``keep`` best plans with their timelines, ranked."""
    num_evaluated: int = 0
    """How many plans were simulated in total."""
    bound: Bound | None = None
    """No plan of this workflow on these devices is predicted faster (see :mod:`scheduler.bounds`)."""

    def table(self) -> list[tuple[str, int, str, float, float]]:
        """Rows ``(mode, chunks, placement, predicted_s, mean_utilization)``, best first."""
        return [
            (p.mode, p.num_chunks, _placement_cell(p), p.predicted_iteration_s, t.mean_utilization)
            for p, t in self.candidates
        ]

    def format_table(self, limit: int | None = 10) -> str:
        """The table as aligned text, e.g. for logs and the CLI."""
        header = ("mode", "chunks", "placement", "predicted_s", "mean_util")
        rows = [(m, str(k), pl, f"{s:.4g}", f"{u:.2f}") for m, k, pl, s, u in self.table()[:limit]]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
        return "\n".join(lines)


def plan(
    workflow: MacroFlow,
    profile: Profile,
    resources: Resources,
    *,
    max_chunks: int | None = None,
    force_mode: str | None = None,
    force_chunks: int | None = None,
    keep: int = 32,
    modes: tuple[str, ...] | None = None,
) -> PlanResult:
    """The fastest feasible plan for one iteration of ``workflow`` on ``resources``.

    ``max_chunks`` caps the chunk counts tried (default 16, never above the number of envs or
    prompts); ``force_mode`` / ``force_chunks`` restrict the search to one mode / chunk count,
    ``modes`` to some modes (e.g. the ones the runtime can run here);
    ``keep`` is how many ranked candidates keep a full timeline. Raises :class:`PlanningError`
    when nothing fits.
    """
    spec = workflow.spec
    _check_profile_and_devices(workflow, profile, resources)
    modes = _modes(force_mode, modes)
    chunk_counts = _chunk_counts(workflow, max_chunks, force_chunks)

    seen: set[tuple] = set()
    scored: list[tuple[tuple, Plan]] = []
    overflows: list[tuple[float, str]] = []
    placements_found = 0
    for mode in modes:
        for placement in PLACEMENT_MODES[mode](spec, profile, resources):
            if not _ranks_fit(workflow, placement, resources):
                continue
            placements_found += 1
            placement_key = tuple(sorted(placement.items()))
            for k in chunk_counts:
                for lanes in _lane_counts(mode, spec.pool, placement, k):
                    flow_key = (placement_key, k, lanes, mode if mode in LANE_MODES else None)
                    if flow_key in seen:  # same micro flow as a simpler mode already tried
                        continue
                    seen.add(flow_key)
                    options, problems = _memory_options(workflow, profile, resources, placement, k, mode, lanes)
                    overflows.extend(problems)
                    for (offload, microbatch), sharing in product(options, _gpu_sharings(spec.pool, placement, resources, mode)):
                        candidate = Plan(mode, placement, k, microbatch, offload, math.nan, lanes, sharing)
                        makespan_s, _ = predict(candidate, profile, workflow, resources)
                        candidate = dataclasses.replace(candidate, predicted_iteration_s=makespan_s)
                        scored.append((_rank_key(candidate, placement_key), candidate))
    if not scored:
        raise PlanningError(_explain_infeasible(workflow, profile, resources, modes, placements_found, overflows))
    scored.sort(key=lambda item: item[0])
    candidates = [(p, simulate(p, profile, workflow, resources)) for _, p in scored[: max(1, keep)]]
    return PlanResult(candidates[0][0], candidates[0][1], candidates, num_evaluated=len(scored),
                      bound=lower_bound(workflow, profile, resources))


def sequential_plan(workflow: MacroFlow, resources: Resources, profile: Profile | None = None) -> Plan:
    """The baseline: one chunk, colocated (every component on all its devices, taking turns).

    With a profile it is the best such plan (minimal offloading, largest fitting micro-batch,
    predicted time). Without one (e.g. to run the profiler) every component goes on every device,
    everything that shares a device with another phase offloads, the micro-batch is left to the
    runtime and the prediction is NaN.
    """
    if profile is not None:
        return plan(workflow, profile, resources, force_mode="colocated", force_chunks=1, keep=1).best
    spec = workflow.spec
    everything = tuple(range(len(resources.devices)))
    placement = {c: everything for c in spec.components}
    offload = tuple(sorted(switchable_components(placement, spec.phases)))
    return Plan("colocated", placement, 1, None, offload, math.nan)


# ----------------------------------------------------------------------------------- internals


def _modes(force_mode: str | None, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    unknown = [m for m in (allowed or ()) if m not in MODES]
    if unknown:
        raise ValueError(f"modes must be among {MODES}, got {unknown}")
    if force_mode is None:
        return tuple(m for m in MODES if allowed is None or m in allowed)
    if force_mode not in MODES:
        raise ValueError(f"force_mode must be one of {MODES}, got {force_mode!r}")
    return (force_mode,)


def _chunk_counts(workflow: MacroFlow, max_chunks: int | None, force_chunks: int | None) -> tuple[int, ...]:
    limit = workflow.spec.chunk_total(workflow)
    if force_chunks is not None:
        if not 1 <= force_chunks <= limit:
            raise ValueError(f"force_chunks must lie in [1, {limit}], got {force_chunks}")
        return (force_chunks,)
    cap = DEFAULT_MAX_CHUNKS if max_chunks is None else max_chunks
    if cap < 1:
        raise ValueError(f"max_chunks must be >= 1, got {cap}")
    return tuple(range(1, min(limit, cap) + 1))


def _lane_counts(mode: str, pool: tuple[str, ...], placement: Placement, num_chunks: int) -> range:
    """Lanes worth trying: 2 up to the pool's cores and the chunks in shared mode; in streams mode
    one stream per chunk (2 up to the pool's cores); else just 1."""
    if mode == SHARED:
        return range(2, min(num_chunks, len(placement[pool[0]])) + 1)
    if mode == STREAMS:
        return range(num_chunks, num_chunks + 1) if 2 <= num_chunks <= len(placement[pool[0]]) else range(0)
    return range(1, 2)


def _gpu_sharings(pool: tuple[str, ...], placement: Placement, resources: Resources, mode: str) -> tuple[str | None, ...]:
    """How the simulator (the pool's last component: the env) may share its GPUs: both ways
    (:data:`~scheduler.plans.GPU_SHARING`) where it is on GPUs with the rollout, ``switch`` where
    it shares them only with others (the trainer), else None (it has its GPUs alone, or runs on CPUs)."""
    if not pool:
        return (None,)
    simulator = placement[pool[-1]]
    if not all(resources.devices[d].kind == "gpu" for d in simulator):
        return (None,)
    sharing = {c for c, devices in placement.items() if c != pool[-1] and set(devices) & set(simulator)}
    if not sharing:
        return (None,)
    together = mode not in LANE_MODES and all(placement[c] == simulator for c in pool)
    return GPU_SHARING if together else (GPU_SWITCH,)


def _memory_options(
    workflow: MacroFlow, profile: Profile, resources: Resources, placement: Placement, num_chunks: int,
    mode: str = "colocated", lanes: int = 1,
) -> tuple[list[tuple[tuple[str, ...], int]], list[tuple[float, str]]]:
    """Non-dominated feasible ``(offload, train_microbatch)`` pairs, and the overflows seen."""
    spec = workflow.spec
    switchable = switchable_components(placement, spec.phases)
    subsets = [s for size in range(len(switchable) + 1) for s in combinations(switchable, size)]
    feasible: list[tuple[tuple[str, ...], int]] = []
    problems: list[tuple[float, str]] = []
    for offload in subsets:
        for microbatch in spec.microbatch_candidates(workflow):
            trial = Plan(mode, placement, num_chunks, microbatch, offload, math.nan, lanes)
            memory = component_memory_gib(trial, profile, workflow)
            found = phase_overflows(resident_memory_gib(placement, spec.phases, memory, offload), resources, spec.phase_names)
            if not found:
                feasible.append((tuple(sorted(offload)), microbatch))
                break
            problems.append(max(found))  # largest overflow of this trial, for the error message
    kept = [
        (s, m) for s, m in feasible
        if not any(set(s2) < set(s) and m2 >= m for s2, m2 in feasible)
    ]
    return kept, problems


def _ranks_fit(workflow: MacroFlow, placement: Placement, resources: Resources) -> bool:
    """Whether every component's devices suit its ranks (see ``MacroFlow.ranks``)."""
    return all(workflow.rank_devices_fit(c, len(devices), resources.devices[devices[0]].kind)
               for c, devices in placement.items())


def _rank_key(candidate: Plan, placement_key: tuple) -> tuple:
    return (
        round(candidate.predicted_iteration_s, _TIME_DECIMALS),
        candidate.num_chunks,
        MODES.index(candidate.mode),
        candidate.lanes,
        -1 if candidate.gpu_sharing is None else GPU_SHARING.index(candidate.gpu_sharing),
        len(candidate.offload),
        -(candidate.train_microbatch or 0),
        candidate.offload,
        placement_key,
    )


def _placement_cell(p: Plan) -> str:
    cell = p.placement_str()
    if p.train_microbatch is not None:
        cell += f" mb={p.train_microbatch}"
    return cell


def _check_profile_and_devices(workflow: MacroFlow, profile: Profile, resources: Resources) -> None:
    spec = workflow.spec
    missing = [c for c in spec.components if c not in profile.components]
    if missing:
        raise PlanningError(
            f"profile lacks component(s) {missing} that the {workflow.kind} workflow needs; "
            f"it has {sorted(profile.components)}"
        )
    for component in spec.components:
        if not eligible_classes(component, profile, resources):
            kinds = sorted({d.kind for d in resources.devices})
            raise PlanningError(
                f"component {component!r} needs {profile[component].device_kind} devices, "
                f"but the resources only have {kinds} devices"
            )


def _explain_infeasible(
    workflow: MacroFlow,
    profile: Profile,
    resources: Resources,
    modes: tuple[str, ...],
    placements_found: int,
    overflows: list[tuple[float, str]],
) -> str:
    spec = workflow.spec
    if placements_found == 0 and workflow.ranks:
        declared = ", ".join(f"{c} {n}" for c, n in workflow.ranks)
        return (f"no {'/'.join(modes)} placement gives the components' ranks ({declared}) whole devices: the ranks of "
                f"{' and '.join(spec.data_parallel)} need a multiple of their number in CPU cores or one GPU each; "
                "others one GPU each (a GPU may hold several ranks of one component, the same number each)")
    if placements_found == 0:
        counts = ", ".join(
            f"{c}: {sum(len(k.indices) for k in eligible_classes(c, profile, resources))} eligible device(s)"
            for c in spec.components
        )
        return f"no {'/'.join(modes)} placement of {list(spec.components)} exists on these resources ({counts})"
    # A component that does not fit even alone, at its smallest footprint, is the clearest message.
    limit = spec.chunk_total(workflow)
    smallest_items = spec.memory_items(workflow, min(limit, DEFAULT_MAX_CHUNKS), min(spec.microbatch_candidates(workflow)))
    for component in spec.components:
        classes = eligible_classes(component, profile, resources)
        widest = max(len(c.indices) for c in classes)
        roomiest = max(classes, key=lambda c: c.memory_gib)
        items = math.ceil(smallest_items[component] / widest)
        need = profile[component].memory_on_device_gib(items)
        if need > roomiest.memory_gib:
            return (
                f"component {component!r} does not fit anywhere: it needs at least {need:.4g} GiB per device "
                f"({profile[component].memory_gib:g} GiB static + {profile[component].memory_per_item_gib:g} GiB/item "
                f"x {items} items), but the roomiest device it may use, "
                f"{resources.describe(roomiest.indices[0])}, has {roomiest.memory_gib:g} GiB"
            )
    if not overflows:
        return f"no {'/'.join(modes)} plan fits on these resources"
    overflow_gib, closest = min(overflows)
    return (
        f"no {'/'.join(modes)} plan fits in memory, even with offloading. Closest: {closest} "
        f"({overflow_gib:.4g} GiB over)"
    )
