"""A lower bound on the iteration time of *any* plan: how much a better plan could still gain.

Work conservation: every component must do its iteration's work somewhere. With the work split
into as few calls as possible (one chunk, no micro-batching: per-call costs are affine in the
batch, so merging calls never costs more) and the device count that makes its device-seconds
smallest, a component needs at least ``work_device_s[c]`` device-seconds. No plan fits the sum
into less than ``sum / devices`` seconds, and no plan runs a component faster than its fastest
device count allows (its calls share its devices, so they run one after another). Messages,
context switches and weight syncs only add time, so they are left out.

The bound answers "could pipelining do better here?" with a number: if the sequential plan is
only ``s`` times slower than the bound, no plan is more than ``s`` times faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.placements import eligible_classes
from scheduler.plans import Plan
from scheduler.profile import Profile
from scheduler.resources import Resources
from scheduler.workflows import Workflow


@dataclass(frozen=True)
class Bound:
    """No plan of the workflow on these devices is predicted faster than ``iteration_s``."""

    iteration_s: float
    work_device_s: dict[str, float]
    """Least device-seconds each component needs per iteration (at its most efficient device count)."""
    fastest_s: dict[str, float]
    """Least seconds each component's calls take back to back (at its fastest device count)."""
    devices: int
    """Devices some component may use (the capacity the work is spread over)."""

    @property
    def limited_by(self) -> str:
        """``"work"`` when the total work over all devices sets the bound, else the slowest component."""
        spread = sum(self.work_device_s.values()) / self.devices
        slowest = max(self.fastest_s, key=self.fastest_s.__getitem__)
        return "work" if spread >= self.fastest_s[slowest] else slowest

    def to_dict(self) -> dict[str, object]:
        return {
            "iteration_s": self.iteration_s,
            "work_device_s": dict(self.work_device_s),
            "fastest_s": dict(self.fastest_s),
            "devices": self.devices,
            "limited_by": self.limited_by,
        }


def lower_bound(workflow: Workflow, profile: Profile, resources: Resources) -> Bound:
    """The work-conservation bound of ``workflow`` on ``resources`` under ``profile``'s cost model."""
    spec = workflow.spec
    work: dict[str, float] = {}
    fastest: dict[str, float] = {}
    usable: set[int] = set()
    for component in spec.components:
        work[component], fastest[component] = math.inf, math.inf
        for device_class in eligible_classes(component, profile, resources):
            usable.update(device_class.indices)
            for n in range(1, len(device_class.indices) + 1):
                seconds = _component_seconds(workflow, profile, component, device_class.indices[:n])
                work[component] = min(work[component], n * seconds)
                fastest[component] = min(fastest[component], seconds)
        if math.isinf(work[component]):
            raise ValueError(f"no device of {resources} is eligible for component {component!r}")
    iteration_s = max(sum(work.values()) / len(usable), max(fastest.values()))
    return Bound(iteration_s, work, fastest, len(usable))


def _component_seconds(workflow: Workflow, profile: Profile, component: str, devices: tuple[int, ...]) -> float:
    """Seconds of ``component``'s work tasks in one iteration on ``devices`` (one chunk, whole calls)."""
    spec = workflow.spec
    # The tasks of one component only depend on its own devices; the others are placed alike.
    whole = Plan("colocated", {c: devices for c in spec.components}, 1, None, (), math.nan)
    return sum(t.duration_s for t in spec.build(workflow, whole, profile) if t.component == component and t.kind == "work")
