"""Learning from runs: a run's measured per-call costs refine the cached profile of its setup.

The probes measure each component alone, before the run; the run then measures the same calls in
the pipeline (``time/sim_s``, ``time/infer_s``, ``time/train_s``: the workflow's
:meth:`~pipelines.workflow.Workflow.measured_factors`, measured over predicted seconds per call).
After the first iterations (the very first one is a warm-up: resets, first calls), the
:class:`CostLearner` rescales each component's cost in the cached profile (same cache key: env,
policy, sizes, hardware) by its median factor, so the next run of the recipe on this machine plans
from what this one saw::

    cost_next = cost_cached * factor ** (n_run / (n_run + n_before))

a geometric mean of every run's measurements weighted by their iterations (the first run replaces
the probe's figure; ``n_before`` is capped at :data:`MEMORY_ITERATIONS`, so the profile keeps
following the machine). Every refinement is recorded in the profile's ``meta["learned"]``: the run
dir, the iterations measured, the date, the factors, what each cost was before.
``plan.learn=false`` turns it off; ``plan.reprofile=true`` starts again from the probes.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.profiler import load_cached_profile, store_cached
from pipelines.workflow import Layout, Workflow
from scheduler import CostModel, Profile

LOG = logging.getLogger("embodied")

#: iterations measured (after the first) before the profile is refined
LEARN_ITERATIONS = 4
#: iterations of earlier runs a refinement weighs against at most
MEMORY_ITERATIONS = 20
#: factors closer to 1 than this change nothing worth a write
NEGLIGIBLE = 0.01


@dataclass(frozen=True)
class Learned:
    """One refinement: the factors applied (measured / cached per call), the weight they got,
    the refined profile and where it was stored."""

    factors: dict[str, float]
    weight: float
    profile: Profile
    path: Path
    record: dict[str, Any]

    def describe(self) -> str:
        changes = ", ".join(f"{name} {f:.2f}x" for name, f in self.factors.items())
        first, last = self.record["iterations"]
        return (f"learned from iterations {first}-{last} (measured/profiled per call: {changes}, weight "
                f"{self.weight:.2f}); the next run of this setup plans from them ({self.path})")


def learned_runs(profile: Profile) -> list[dict[str, Any]]:
    """The refinements recorded in ``profile`` (oldest first; empty for a probed profile)."""
    return list(profile.meta.get("learned", []))


def describe_provenance(profile: Profile) -> str:
    """One line on where ``profile``'s costs come from: the probes, or the probes refined by runs."""
    runs = learned_runs(profile)
    probed = profile.meta.get("probed_at")
    source = f"probed{f' {probed}' if probed else ''}"
    if not runs:
        return f"profile {profile.meta.get('key', '?')}: {source}, not yet refined by a run"
    last = runs[-1]
    factors = ", ".join(f"{c} {f:.2f}x" for c, f in last["factors"].items())
    iterations = sum(r["iterations"][1] - r["iterations"][0] + 1 for r in runs)
    return (f"profile {profile.meta.get('key', '?')}: {source}, refined by {len(runs)} run(s) ({iterations} iterations); "
            f"last: {last['run']} on {last['date']} ({factors})")


def refine(profile: Profile, factors: dict[str, float], run: str, iterations: tuple[int, int],
           date: str | None = None) -> tuple[Profile, float, dict[str, Any]]:
    """``profile`` with each named component's cost moved towards ``factor`` times itself, with
    the weight of ``iterations`` against those of the runs recorded before (see the module
    docstring); returns ``(refined profile, weight, provenance record)``."""
    before = learned_runs(profile)
    n_before = min(MEMORY_ITERATIONS, sum(r["iterations"][1] - r["iterations"][0] + 1 for r in before))
    n_run = iterations[1] - iterations[0] + 1
    weight = n_run / (n_run + n_before)
    components = dict(profile.components)
    replaced = {}
    for name, factor in factors.items():
        c = components[name]
        scale = factor**weight
        replaced[name] = c.cost.to_dict()
        cost = CostModel(c.cost.fixed_s * scale, c.cost.per_item_s * scale, c.cost.scaling_exponent)
        components[name] = dataclasses.replace(c, cost=cost)
    record = {
        "run": run,
        "iterations": list(iterations),
        "date": date or time.strftime("%Y-%m-%d %H:%M:%S"),
        "factors": dict(factors),
        "weight": weight,
        "replaced": replaced,
    }
    meta = {**profile.meta, "learned": [*before, record]}
    return dataclasses.replace(profile, components=components, meta=meta), weight, record


class CostLearner:
    """Collects a run's measured per-call factors and refines the cached profile once (see the
    module docstring). ``enabled`` False (``plan.learn=false``) or a profile without a cache key
    makes it a no-op."""

    def __init__(self, workflow: Workflow, enabled: bool, run: str, iterations: int = LEARN_ITERATIONS) -> None:
        self.workflow = workflow
        self.enabled = enabled
        self.run = run
        self.iterations = iterations
        self.base: Profile | None = None
        self.samples: list[tuple[int, dict[str, float]]] = []
        self.learned: Learned | None = None

    def start(self, profile: Profile | None) -> None:
        """The profile the run planned from (as cached: before any re-planning rescales it)."""
        self.base = profile
        self.samples.clear()
        self.learned = None

    @property
    def active(self) -> bool:
        return (self.enabled and self.learned is None and self.base is not None
                and self.base.meta.get("key") is not None)

    def observe(self, iteration: int, metrics: dict[str, Any], layout: Layout) -> Learned | None:
        """Record iteration ``iteration`` (1-based) run under ``layout``; refines and stores the
        profile once :attr:`iterations` iterations after the first are measured."""
        if not self.active or iteration <= 1 or metrics.get("plan/measured_over_predicted") is None:
            return None
        assert self.base is not None
        self.samples.append((iteration, self.workflow.measured_factors(self.base, layout, metrics)))
        if len(self.samples) < self.iterations:
            return None
        return self._learn()

    def finish(self) -> Learned | None:
        """The run ends: refine from the iterations measured so far, if any (a short run)."""
        if not self.active or not self.samples:
            return None
        return self._learn()

    def _learn(self) -> Learned | None:
        assert self.base is not None
        names = sorted({name for _, f in self.samples for name in f})
        factors = {name: statistics.median(f[name] for _, f in self.samples if name in f) for name in names}
        self.learned = None
        if not factors or all(abs(f - 1) < NEGLIGIBLE for f in factors.values()):
            self.samples.clear()
            self.enabled = False  # measured as profiled: nothing to write
            return None
        iterations = (self.samples[0][0], self.samples[-1][0])
        key = self.base.meta["key"]
        cached = load_cached_profile(key, LOG.warning)
        # compose onto the cache as stored now (another run may have refined it since this one started)
        current = cached if cached is not None else self.base
        if cached is not None and learned_runs(current) != learned_runs(self.base):
            factors = {name: f * _cost_ratio(self.base, current, name) for name, f in factors.items()}
        refined, weight, record = refine(current, factors, self.run, iterations)
        path = store_cached(key, refined.to_dict())
        self.learned = Learned(factors, weight, refined, path, record)
        return self.learned


def _cost_ratio(base: Profile, current: Profile, name: str) -> float:
    """How much cheaper ``current`` prices a call of ``name`` than ``base`` (a factor measured
    against ``base`` becomes one against ``current``)."""
    b, c = base[name].cost, current[name].cost
    ref_b, ref_c = b.fixed_s + b.per_item_s, c.fixed_s + c.per_item_s
    return ref_b / ref_c if ref_c > 0 else 1.0
