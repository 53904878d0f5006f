"""Memory feasibility of a plan, phase by phase.

A component is resident on its devices during its own phase. Outside its phase it stays resident
unless it is in ``Plan.offload``. So on device d during phase p the resident set is
``{X on d: phase(X) == p or X not offloaded}``, and each X holds
``memory_gib + memory_per_item_gib * ceil(items / len(placement[X]))`` on each of its devices,
where ``items`` is what one call of X holds (:attr:`FlowKind.memory_items`). In ``shared``
mode the pool components' workers float over the pool, so each holds its whole calls
(``ceil(items / 1)``) on every device of the pool; a plan has at most one lane per core.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.graph import items_per_device
from scheduler.plans import SHARED, STREAMS, Plan
from scheduler.profile import Profile
from scheduler.resources import Resources
from scheduler.flows import MacroFlow

_SLACK_GIB = 1e-9  # float noise allowed when summing memory


def component_memory_gib(plan: Plan, profile: Profile, workflow: MacroFlow) -> dict[str, float]:
    """Component -> GiB it holds on each of its devices while resident."""
    items = workflow.spec.memory_items(workflow, plan.num_chunks, plan.train_microbatch)
    pool = set(workflow.spec.pool)

    def spread(name: str, devices: tuple[int, ...]) -> int:  # the devices one call's items spread over
        if name in pool and plan.mode == SHARED:  # a floating worker: any one core may hold it all
            return 1
        if name in pool and plan.mode == STREAMS:  # a stream's rank on its block of the pool
            return len(devices) // plan.lanes
        return len(devices)

    return {name: profile[name].memory_on_device_gib(items_per_device(items[name], spread(name, devices)))
            for name, devices in plan.placement.items()}


def resident_memory_gib(
    placement: Mapping[str, tuple[int, ...]],
    phases: Mapping[str, int],
    memory_gib: Mapping[str, float],
    offload: tuple[str, ...] | frozenset[str],
) -> dict[int, dict[int, dict[str, float]]]:
    """Device -> phase index -> {component: GiB} of what is resident on that device in that phase."""
    by_device: dict[int, list[str]] = {}
    for name, devices in placement.items():
        for d in devices:
            by_device.setdefault(d, []).append(name)
    out: dict[int, dict[int, dict[str, float]]] = {}
    for d, names in sorted(by_device.items()):
        out[d] = {}
        for phase in sorted({phases[n] for n in names}):
            out[d][phase] = {n: memory_gib[n] for n in names if phases[n] == phase or n not in offload}
    return out


def phase_overflows(
    resident: Mapping[int, Mapping[int, Mapping[str, float]]],
    resources: Resources,
    phase_names: tuple[str, ...],
) -> list[tuple[float, str]]:
    """``(GiB over capacity, sentence)`` per (device, phase) whose resident set does not fit."""
    problems = []
    for d, per_phase in resident.items():
        capacity = resources.devices[d].memory_gib
        for phase, held in per_phase.items():
            total = sum(held.values())
            if total > capacity + _SLACK_GIB:
                parts = " + ".join(f"{n} {g:.4g}" for n, g in held.items())
                text = f"{resources.describe(d)} in phase {phase_names[phase]!r} would hold {parts} = {total:.4g} GiB"
                problems.append((total - capacity, text))
    return problems


def memory_violations(plan: Plan, profile: Profile, workflow: MacroFlow, resources: Resources) -> list[str]:
    """Why ``plan`` does not fit in memory (empty list: it fits)."""
    _check_devices(plan, resources)
    spec = workflow.spec
    resident = resident_memory_gib(plan.placement, spec.phases, component_memory_gib(plan, profile, workflow), plan.offload)
    return [text for _, text in phase_overflows(resident, resources, spec.phase_names)]


def peak_memory_gib(plan: Plan, profile: Profile, workflow: MacroFlow, resources: Resources) -> dict[int, float]:
    """Device index -> the most GiB resident on it in any phase (0 for unused devices)."""
    _check_devices(plan, resources)
    spec = workflow.spec
    resident = resident_memory_gib(plan.placement, spec.phases, component_memory_gib(plan, profile, workflow), plan.offload)
    peak = {d: 0.0 for d in range(len(resources.devices))}
    for d, per_phase in resident.items():
        peak[d] = max(sum(held.values()) for held in per_phase.values())
    return peak


def switchable_components(placement: Mapping[str, tuple[int, ...]], phases: Mapping[str, int]) -> tuple[str, ...]:
    """Components sharing a device with a component of another phase: the only ones worth offloading."""
    out = []
    for name, devices in placement.items():
        if any(
            other != name and phases[other] != phases[name] and set(devices) & set(other_devices)
            for other, other_devices in placement.items()
        ):
            out.append(name)
    return tuple(out)


def _check_devices(plan: Plan, resources: Resources) -> None:
    for name, devices in plan.placement.items():
        bad = [d for d in devices if not 0 <= d < len(resources.devices)]
        if bad:
            raise ValueError(f"Plan places {name!r} on device(s) {bad}, but resources have {len(resources.devices)}")
