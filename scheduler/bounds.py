"""A lower bound on the iteration time of *any* plan: how much a better plan could still gain.

Work conservation: every component must do its iteration's work somewhere. With the work split
into as few calls as possible (one chunk, no micro-batching: per-call costs are affine in the
batch, so merging calls never costs more) and the device count that makes its device-seconds
smallest, a component needs at least ``work_device_s[c]`` device-seconds. No plan fits the sum
into less than ``sum / devices`` seconds, and no plan runs a component faster than its fastest
device count allows: its calls share its devices, so they run one after another, except a pool
component's in ``shared`` lanes or ``streams``, whose chains run side by side, each with at least
its share of the items (the largest of L equal chunks) on at most ``D - L + 1`` of the pool's D
cores. Messages, context switches and weight syncs only add time, so they are left out.

The bound answers "could pipelining do better here?" with a number: if the sequential plan is
only ``s`` times slower than the bound, no plan is more than ``s`` times faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.placements import eligible_classes
from scheduler.plans import Plan, Timeline
from scheduler.profile import Profile
from scheduler.resources import Resources
from scheduler.flows import MacroFlow


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


def lower_bound(workflow: MacroFlow, profile: Profile, resources: Resources) -> Bound:
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
            if component in spec.pool and device_class.kind == "cpu":
                fastest[component] = min(fastest[component], _fastest_in_streams(workflow, profile, component,
                                                                                 device_class.indices))
        if math.isinf(work[component]):
            raise ValueError(f"no device of {resources} is eligible for component {component!r}")
    iteration_s = max(sum(work.values()) / _capacity(workflow, profile, resources, usable), max(fastest.values()))
    return Bound(iteration_s, work, fastest, len(usable))


def _capacity(workflow: MacroFlow, profile: Profile, resources: Resources, usable: set[int]) -> float:
    """Device-seconds of work the usable devices do per second: one each, but a GPU that a GPU
    simulator may share with the rollout (an ``overlap`` plan) up to ``2 / gpu_contention``."""
    pool = workflow.spec.pool
    overlap = bool(pool) and any(c.kind == "gpu" for c in eligible_classes(pool[-1], profile, resources))
    gpu = 2.0 / profile.gpu_contention if overlap else 1.0
    return sum(gpu if resources.devices[d].kind == "gpu" else 1.0 for d in usable)


def _component_seconds(workflow: MacroFlow, profile: Profile, component: str, devices: tuple[int, ...],
                       streams: int = 1) -> float:
    """Seconds of ``component``'s work tasks in one iteration on ``devices``: with ``streams=1`` all
    of them (one chunk, whole calls); with more, those of the largest of ``streams`` equal chunks
    (what one of that many streams does)."""
    spec = workflow.spec
    # The tasks of one component only depend on its own devices; the others are placed alike.
    whole = Plan("colocated", {c: devices for c in spec.components}, streams, None, (), math.nan)
    return sum(t.duration_s for t in spec.build(workflow, whole, profile)
               if t.component == component and t.kind == "work" and (streams == 1 or t.chunk == 0))


def _fastest_in_streams(workflow: MacroFlow, profile: Profile, component: str, pool: tuple[int, ...]) -> float:
    """The least seconds a pool component (``FlowKind.pool``) takes where ``shared`` lanes or
    ``streams`` run its calls as parallel chains: with L of them on the pool's D cores, one chain
    holds at least the largest of L equal chunks, on at most D - L + 1 cores (a lane: one)."""
    total = workflow.spec.chunk_total(workflow)
    return min(
        _component_seconds(workflow, profile, component, pool[:n], streams)
        for streams in range(2, min(len(pool), total) + 1)
        for n in range(1, len(pool) - streams + 2)
    ) if min(len(pool), total) >= 2 else math.inf


@dataclass(frozen=True)
class GapToBound:
    """Where a plan's iteration loses time against the work it must do: ``makespan * devices``
    minus the least device-seconds of every component's work (``Bound.work_device_s``), split into
    what each component's calls spend beyond their least work (smaller or split calls, more
    devices than the most efficient count), the weight syncs and context switches, and the
    device-seconds no task runs. The parts add up to ``lost_device_s``; where the bound is set by
    the work (``Bound.limited_by == "work"``), ``lost_device_s / devices`` is the plan's distance
    to the bound in seconds."""

    makespan_s: float
    devices: int
    excess_work_device_s: dict[str, float]
    """Device-seconds each component's work spans take beyond its least work (never negative:
    the least work is whole calls at the most efficient device count)."""
    overhead_device_s: dict[str, float]
    """Device-seconds of spans other than work, by kind (``"sync"``, ``"onload"``, ``"offload"``)."""
    idle_device_s: float
    """Device-seconds in the makespan on which no task runs (waits, message delays); in an
    ``overlap`` plan less the seconds env and rollout spans overlap on a GPU (it may go negative)."""

    @property
    def lost_device_s(self) -> float:
        return sum(self.excess_work_device_s.values()) + sum(self.overhead_device_s.values()) + self.idle_device_s

    def to_dict(self) -> dict[str, object]:
        return {
            "makespan_s": self.makespan_s,
            "devices": self.devices,
            "excess_work_device_s": dict(self.excess_work_device_s),
            "overhead_device_s": dict(self.overhead_device_s),
            "idle_device_s": self.idle_device_s,
            "lost_device_s": self.lost_device_s,
        }

    def describe(self) -> str:
        """One line: the parts, largest first, in seconds of the iteration (device-seconds over devices)."""
        parts = {**{f"{c} calls": s for c, s in self.excess_work_device_s.items()},
                 **self.overhead_device_s, "idle": self.idle_device_s}
        shown = sorted(((s / self.devices, name) for name, s in parts.items() if abs(s) > 1e-9), reverse=True)
        return ", ".join(f"{name} {s:+.2f} s" for s, name in shown) or "nothing"


def gap_to_bound(timeline: Timeline, bound: Bound) -> GapToBound:
    """Split ``timeline``'s distance to ``bound`` (see :class:`GapToBound`); both from the same
    workflow, profile and resources."""
    work: dict[str, float] = {c: 0.0 for c in bound.work_device_s}
    overhead: dict[str, float] = {}
    for span in timeline.spans:
        if span.kind == "work":
            work[span.component] = work.get(span.component, 0.0) + span.duration_s
        else:
            overhead[span.kind] = overhead.get(span.kind, 0.0) + span.duration_s
    busy = sum(work.values()) + sum(overhead.values())
    return GapToBound(
        makespan_s=timeline.makespan_s,
        devices=bound.devices,
        excess_work_device_s={c: s - bound.work_device_s.get(c, 0.0) for c, s in work.items()},
        overhead_device_s=overhead,
        idle_device_s=timeline.makespan_s * bound.devices - busy,
    )
