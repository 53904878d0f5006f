"""Re-planning on drift: when measured iterations stop matching the plan's prediction, plan again.

Every iteration's ``plan/measured_over_predicted`` is collected; once the median over a window of
:data:`WINDOW` iterations is off by more than ``plan.replan_threshold``, each component's profiled
cost is rescaled by its measured per-call time (the workflow's ``measured_factors``), the planner
runs again on the rescaled profile, and a plan that differs is applied between iterations. The
reason is logged, stored in ``metrics.jsonl`` (``plan/replanned``) and ``plan.json``.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines.workflow import Layout, Workflow
from scheduler import CostModel, PlanResult, Profile

#: iterations whose median drift triggers re-planning
WINDOW = 5


@dataclass(frozen=True)
class Replanned:
    """The outcome of a re-planning: why, the rescaled profile, the planner's result, and whether
    the layout changed (then ``layout`` is the new one to apply)."""

    reason: str
    profile: Profile
    result: PlanResult
    layout: Layout
    changed: bool


def rescale(profile: Profile, factors: dict[str, float]) -> Profile:
    """The profile with each named component's costs multiplied by its factor."""
    components = dict(profile.components)
    for name, factor in factors.items():
        c = components[name]
        cost = CostModel(c.cost.fixed_s * factor, c.cost.per_item_s * factor, c.cost.scaling_exponent)
        components[name] = dataclasses.replace(c, cost=cost)
    return dataclasses.replace(profile, components=components)


class Replanner:
    """Watches a run's iterations and re-plans on drift (see the module docstring)."""

    def __init__(self, workflow: Workflow, threshold: float, window: int = WINDOW) -> None:
        self.workflow = workflow
        self.threshold = threshold
        self.window: deque[dict[str, Any]] = deque(maxlen=window)
        self.told_unchanged = False  # a drift that re-planning could not remove was reported once

    def observe(self, iteration: int, metrics: dict[str, Any], profile: Profile, layout: Layout) -> Replanned | None:
        """Record an iteration; returns a :class:`Replanned` when the window's drift called for a
        new plan (changed or not; None when nothing is worth reporting)."""
        if self.threshold <= 0 or metrics.get("plan/measured_over_predicted") is None:
            return None
        self.window.append(metrics)
        if len(self.window) < self.window.maxlen:
            return None
        ratio = float(np.median([m["plan/measured_over_predicted"] for m in self.window]))
        if abs(ratio - 1) <= self.threshold:
            return None
        typical = {k: float(np.median([m[k] for m in self.window])) for k, v in self.window[-1].items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and all(isinstance(m.get(k), (int, float)) for m in self.window)}
        first = iteration - len(self.window) + 1
        self.window.clear()
        factors = self.workflow.measured_factors(profile, layout, typical)
        rescaled = rescale(profile, factors)
        result = self.workflow.plan(rescaled)
        new_layout = self.workflow.layout_of(result.best)
        old = layout.plan
        changes = ", ".join(f"{name} {f:.2f}x" for name, f in factors.items())
        reason = (f"iterations {first}-{iteration} took {ratio:.2f}x the predicted {old.predicted_iteration_s:.3f} s "
                  f"(measured/profiled per call: {changes})")
        changed = (result.best.mode, result.best.placement, result.best.num_chunks) != (old.mode, old.placement, old.num_chunks)
        if changed:
            self.told_unchanged = False
            reason += f"; re-planned: {old.mode}/{old.num_chunks} chunks -> {result.best.mode}/{result.best.num_chunks} chunks"
        else:
            if self.told_unchanged:  # said once; repeating it every window is noise
                return Replanned("", rescaled, result, new_layout, changed=False)
            self.told_unchanged = True
            reason += f"; plan unchanged, prediction now {result.best.predicted_iteration_s:.3f} s"
        return Replanned(reason, rescaled, result, new_layout, changed)
