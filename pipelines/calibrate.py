"""Calibration: before a run settles on a plan, the planner's best candidates are measured in the pipeline.

The probes price each component alone. In the pipeline a component shares cores, channels and
processes with its neighbours, and the runtime spends seconds of its own in every iteration
(driver calls, weight sync, metrics) that no component's call accounts for. Calibration measures
both on the run itself. The run's first iterations (real training iterations, logged as usual)
run under the planner's candidates, the fastest predicted first; after the run's first iteration
(a warm-up: resets, first calls), each candidate runs about :data:`MEASURE_S` seconds of
iterations (the planner's choice, measured first and free, longer: :func:`choice_window_s`), and
more while they spread (:func:`measured_enough`: until their median is known to
:data:`TARGET_RSE`); a candidate is measured only while the budget holds
:func:`iterations_for` its corrected price. Each measured plan gives

* its **factors**: measured / profiled seconds per call of every component under that plan (the
  workflow's ``measured_factors``: the same calls, with the neighbours the plan gives them), and
* its **residual**: the measured iteration minus the planner's prediction from the profile
  rescaled by those factors, for that iteration's own shape (the runtime's own seconds per
  iteration, paid once by every iteration however early an episodic one ended).

A measured plan's price is its measurement; every other candidate is then priced again by the
pure planner (:func:`scheduler.predict`) on the profile rescaled by measured factors, each component's from the measured plan that ran it most like the
candidate does (beside the most alike neighbours: the components sharing its devices, then on as
many devices, then on the same ones), plus the residual of the measured plan most like the
candidate (same placement, else same mode, else the one measured first). The next candidate
measured is the fastest by these corrected predictions, while one could still beat the best
measured plan by the model (within ``plan.calibrate_margin``, :data:`MARGIN` by default) and the budget allows (``plan.calibrate``: the share of the run's
iterations calibration may run under plans other than the planner's choice). Then the run settles on
the fastest measured plan, whose prediction is its measured price (at the run's pace now: below).

A run's iterations drift while they are measured: a policy that learns makes its simulation dearer
(the default job's PushCube steps cost 8-54% more, 26% on average, under a policy that pushes the
cube than under a fresh one), and this host's speed wanders. So when other plans were measured after the planner's
choice, the run measures the choice again after them, before it settles (free while the choice is
the fastest, as it would switch back to it anyway, and then as long as its first measurement; else
as any candidate, within the budget), and brings every plan measured between to the pace of the run
now: its time over the choice's where it ran, times the choice's latest (``Calibrator._bring_to_now``).
A plan measured later is no longer taken for slower (or faster) because the run had slowed (or sped
up) by then, and where the run settles on the choice its prediction is the price of its latest
iterations. (Pricing every measurement on its latest 16 s instead of all its iterations was tried
and dropped: on CartPole GRPO's noisy episodic iterations it left 5 of 8 runs within 15% of the next
16 s, where all of them leave 15 of 16; docs/benchmarks.md.)

Measuring the planner's choice costs the run nothing (it would run that plan anyway), so a run
measures it whenever one measurement fits in the run, however small its share: CartPole GRPO's 25
iterations left a share of 2, too few for any measurement, and its probe-based prediction, which
leaves out the runtime's own seconds per iteration, missed by -22% (docs/benchmarks.md).
``plan.calibrate=0`` turns calibration off: the run keeps the planner's choice and its probe-based
prediction (re-planning on drift still applies).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

from pipelines.config import PlanConfig
from pipelines.replan import rescale
from pipelines.workflow import Layout, Workflow
from scheduler import Plan, PlanResult, Profile, predict

#: a measured plan gets at least this many seconds of iterations (short iterations are noisy: this
#: host's speed moves within seconds, and CartPole PPO calibrated on three iterations, 0.54 s, with
#: the env's calls at 1.40x their probe, then ran 26% faster than so predicted; and this host runs
#: a plan's CartPole iterations 25% faster or slower for a few seconds at a time: calibrations of
#: 10 iterations, 1.2-1.6 s, missed the same plan's next 8 s by -12% to +13.5%; docs/benchmarks.md) ...
MEASURE_S = 4.0
#: ... and more while the median of its iterations is not yet known to this (relative standard
#: error): on a host whose speed drifts, two iterations can sit 30% apart ...
TARGET_RSE = 0.03
#: ... within these many iterations
MIN_ITERATIONS, MAX_ITERATIONS = 2, 30
#: ... and the spread is judged from no fewer than these: two iterations that happen to agree
#: within 4.6% (TARGET_RSE for two) say little about a host whose iterations spread 8-10%: a
#: quarter to a third of such pairs agree by chance, and HalfCheetah's and PushCube GRPO's
#: calibrations that stopped on two missed the plan's later time by -13.5% and +21%
#: (docs/benchmarks.md). A run calibrates only when its budget holds one measurement of its
#: plan (:func:`iterations_for`: this many iterations at least).
MIN_SPREAD_ITERATIONS = 3
#: a candidate is measured while its corrected prediction is below (1 + margin) x the best measured
#: (``plan.calibrate_margin``; its default, written once, in the config)
MARGIN = PlanConfig.calibrate_margin
#: the planner's choice, whose measurement is free (the run would run it anyway) and whose price
#: becomes the run's prediction, is measured longer: this host's speed wanders over tens of
#: seconds, so a window's median pins a plan's time down slowly (one plan's CartPole PPO
#: iterations over 130 s: 4 s windows spread 6.3% around their median, at most 17.5%; 8 s ones
#: 4.0%; 16 s ones 2.4%, at most 4.6%; docs/benchmarks.md) ...
CHOICE_MEASURE_S = 16.0
#: ... within this share of the run's predicted seconds after the warm-up (a short run keeps
#: :data:`MEASURE_S`: the candidates that may beat the choice are measured after it, and the plan
#: it settles on should run most of the run) ...
CHOICE_SHARE = 0.25
#: ... and of its iterations (a young GRPO policy's iterations are a fraction of the full ones the
#: run's seconds are predicted in: 6 s of CartPole GRPO's took all of its 25 iterations), within
#: these many; past them the choice is measured as any plan
CHOICE_MAX_ITERATIONS = 120


def iterations_for(seconds: float, measure_s: float = MEASURE_S, most: int = MAX_ITERATIONS) -> int:
    """Iterations of ``seconds`` each that make about ``measure_s`` seconds (within
    :data:`MIN_SPREAD_ITERATIONS` and ``most``): what a plan expected to take ``seconds`` per
    iteration is measured for when its iterations hold steady."""
    if not seconds > 0:
        return MIN_SPREAD_ITERATIONS
    return max(MIN_SPREAD_ITERATIONS, min(most, math.ceil(measure_s / seconds)))


def choice_window_s(seconds: float, run_left: int) -> float:
    """Seconds of iterations the planner's choice is measured for, when it is predicted to take
    ``seconds`` per iteration and the run has ``run_left`` iterations after its warm-up:
    :data:`CHOICE_MEASURE_S`, or :data:`CHOICE_SHARE` of the run's predicted seconds where that is
    less, and no less than :data:`MEASURE_S`."""
    return max(MEASURE_S, min(CHOICE_MEASURE_S, CHOICE_SHARE * run_left * max(seconds, 0.0)))


def choice_iterations(run_left: int) -> int:
    """The iterations the planner's choice may be measured beyond what any plan is (about
    :data:`MEASURE_S` seconds, up to :data:`MAX_ITERATIONS`), towards :func:`choice_window_s`, in a
    run of ``run_left`` iterations after its warm-up: :data:`CHOICE_SHARE` of them, at most
    :data:`CHOICE_MAX_ITERATIONS`."""
    return min(CHOICE_MAX_ITERATIONS, math.ceil(CHOICE_SHARE * max(run_left, 0)))


def relative_standard_error(times: list[float]) -> float:
    """How well ``times`` pin their median down: its standard error (from the median absolute
    deviation, so that one outlier among steady iterations does not keep it high; 1.2533 x the
    normal sigma over sqrt(n)) over the median; inf for fewer than two."""
    if len(times) < 2:
        return math.inf
    middle = statistics.median(times)
    if not middle > 0:
        return math.inf
    sigma = 1.4826 * statistics.median(abs(t - middle) for t in times)
    return 1.2533 * sigma / math.sqrt(len(times)) / middle


def measured_enough(times: list[float], budget_left: int, wall_s: float | None = None, measure_s: float = MEASURE_S,
                    most: int = MAX_ITERATIONS) -> bool:
    """Whether iterations that took ``times`` seconds complete a measurement: about ``measure_s``
    seconds of them whose median is known to :data:`TARGET_RSE` (judged from
    :data:`MIN_SPREAD_ITERATIONS` at least, up to ``most`` iterations), or fewer (no fewer
    than :data:`MIN_ITERATIONS`) when calibration's budget has run out.
    ``wall_s``: the seconds they took where ``times`` are other seconds (an episodic iteration that
    ended early counted as the full one it stands for: a young CartPole GRPO policy's iterations
    take a seventh of that, and two of them, 0.26 s, had passed for 0.5 s of measurement)."""
    n = len(times)
    if n >= most or (n >= MIN_ITERATIONS and budget_left <= 0):
        return True
    took = sum(times) if wall_s is None else wall_s
    return n >= MIN_SPREAD_ITERATIONS and took >= measure_s and relative_standard_error(times) <= TARGET_RSE


def _neighbours(plan: Plan, component: str) -> frozenset[str]:
    """The other components that share a device with ``component`` under ``plan``."""
    mine = set(plan.placement[component])
    return frozenset(c for c, devices in plan.placement.items() if c != component and mine & set(devices))


def describe_plan(plan: Plan) -> str:
    """E.g. ``colocated/2ch env:0-1 rollout:0-1 trainer:0-1``."""
    return f"{plan.mode}/{plan.num_chunks}ch {plan.placement_str()}"


@dataclass(frozen=True)
class Measurement:
    """One candidate measured in the pipeline."""

    plan: Plan
    """The candidate as the planner priced it from the profile."""
    iteration_s: float
    """Measured seconds of a full iteration: the simulation of a full one at the measured per-call
    factors plus the residual (equal to the median measured iteration unless an episodic one ended
    early: then what the full one it stands for takes)."""
    factors: dict[str, float]
    """Component -> median measured / profiled seconds per call under this plan."""
    residual_s: float
    """Measured seconds per iteration beyond the planner's prediction from the rescaled profile for
    that iteration's shape (the median over the measured iterations)."""
    iterations: tuple[int, ...]
    """The run's iterations (1-based) it was measured on."""

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "iteration_s": self.iteration_s, "factors": dict(self.factors),
                "residual_s": self.residual_s, "iterations": list(self.iterations)}

    def scaled(self, ratio: float) -> Measurement:
        """This measurement with its seconds (iteration, per-call factors, residual) times ``ratio``."""
        return dataclasses.replace(self, iteration_s=self.iteration_s * ratio, residual_s=self.residual_s * ratio,
                                   factors={n: f * ratio for n, f in self.factors.items()})

    def middle(self) -> float:
        """The middle of the iterations it was measured on (where on the run it stands)."""
        return (self.iterations[0] + self.iterations[-1]) / 2


@dataclass(frozen=True)
class Calibrated:
    """What calibration settled on: the plan (its prediction its price in ``compared``), the profile
    rescaled by that plan's factors, every measurement (in the order measured: a plan measured
    again, last, is there twice), each measured plan's price at the run's pace when it settled,
    and each candidate's prices."""

    plan: Plan
    profile: Profile
    measurements: tuple[Measurement, ...]
    compared: tuple[Measurement, ...]
    """One per measured plan, in the order first measured, as the run compared them: its
    measurement, or, where the planner's choice was measured again after it, that measurement at
    the pace of the run's latest iterations (:meth:`Calibrator._bring_to_now`; the choice's is its
    latest). The plan settled on is the fastest of these."""
    predictions: tuple[tuple[Plan, float], ...]
    """Every candidate with its corrected prediction (fastest first; a measured plan's is its
    price in ``compared``)."""
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.plan.to_dict(),
            "measured": [m.to_dict() for m in self.measurements],
            "compared": [m.to_dict() for m in self.compared],
            "candidates": [{"plan": p.to_dict(), "profiled_s": p.predicted_iteration_s, "corrected_s": s}
                           for p, s in self.predictions],
            "reason": self.reason,
        }


@dataclass(frozen=True)
class CalibrationStep:
    """What the runner does before the next iteration: run ``layout`` (another candidate, or the
    settled plan), and when ``settled`` is set calibration is over."""

    layout: Layout
    settled: Calibrated | None = None


class Calibrator:
    """Drives calibration over a run's first iterations (see the module docstring). ``share``:
    the most of the run's iterations calibration may take (``plan.calibrate``); ``margin``: how
    much dearer than the best measured plan a candidate's corrected price may be and still be
    measured (``plan.calibrate_margin``)."""

    def __init__(self, workflow: Workflow, share: float, margin: float = MARGIN) -> None:
        self.workflow = workflow
        self.share = share
        self.margin = margin
        self.profile: Profile | None = None
        self.candidates: list[Plan] = []
        self.measured: dict[tuple, Measurement] = {}
        self.current: Plan | None = None
        self.first: Plan | None = None  # the planner's choice: measured first, at no cost to the budget
        self.budget = 0  # iterations that may run under the other candidates ...
        self.spent = 0  # ... and those that did
        self.run_left = 0  # the run's iterations after the warm-up: the most the first measurement may take
        self.choice_s = MEASURE_S  # the seconds the planner's choice is measured for (choice_window_s) ...
        self.choice_n = 0  # ... within these many iterations (choice_iterations)
        self.warmed = False
        self.samples: list[tuple[int, dict[str, Any]]] = []
        self.history: list[Measurement] = []  # every measurement, as measured, in order
        self.active = False
        self.ranked: list[tuple[Plan, float]] = []
        self.ranked_after = -1  # the number of measurements self.ranked was priced with

    def start(self, result: PlanResult, profile: Profile, iterations_left: int) -> None:
        """Calibrate among ``result``'s candidates (the distinct micro flows, fastest predicted
        first; the planner's choice first of all) within ``share`` of ``iterations_left``."""
        self.profile = profile
        seen: dict[tuple, Plan] = {result.best.key(): result.best}
        for plan, _ in result.candidates:
            seen.setdefault(plan.key(), plan)
        self.candidates = list(seen.values())
        self.measured.clear()
        self.samples.clear()
        self.history.clear()
        self.ranked_after = -1
        self.current = self.first = result.best
        self.budget = int(self.share * iterations_left)
        self.spent = 0
        self.run_left = iterations_left - 1
        self.choice_s = choice_window_s(result.best.predicted_iteration_s, self.run_left)
        self.choice_n = choice_iterations(self.run_left)
        self.warmed = False
        self.active = self.share > 0 and self.run_left >= iterations_for(result.best.predicted_iteration_s)

    def corrected(self, plan: Plan) -> float | None:
        """``plan``'s predicted seconds per iteration corrected by the measurements: a measured
        plan's price as compared (its measurement, at the run's pace now where the choice was
        measured again after it: the price it is settled on, to the last digit); any other plan
        re-simulated with each component's factor from the measured plan that ran it most like
        ``plan`` does and the runtime residual from the measured plan most like ``plan`` (None
        before any plan is measured)."""
        measured = self.measured.get(plan.key())
        if measured is not None:
            return measured.iteration_s
        correction = self.correction(plan)
        if correction is None:
            return None
        factors, residual = correction
        return self._predict(plan, factors) + residual

    def correction(self, plan: Plan) -> tuple[dict[str, float], float] | None:
        """What :meth:`corrected` prices ``plan`` with: each component's per-call factor (from the
        measured plan that ran it most like ``plan`` does) and the runtime's seconds per iteration
        (from the measured plan most like ``plan``); None before any plan is measured."""
        model = self._closest(plan)
        if model is None:
            return None
        factors = {}
        for component in plan.placement:
            source = self._ran_alike(plan, component)
            if component in source.factors:
                factors[component] = source.factors[component]
        return factors, model.residual_s

    def observe(self, iteration: int, metrics: dict[str, Any], layout: Layout) -> CalibrationStep | None:
        """Record iteration ``iteration`` (1-based, run under ``layout``); returns the layout to
        run next when this iteration completed a measurement (None: go on as is)."""
        if not self.active:
            return None
        if not self.warmed:
            self.warmed = True  # the run's first iteration: resets and first calls
            return None
        if metrics.get("time/train_s") is None:  # nothing trained (staleness 1's first collection)
            return None
        assert self.current is not None and self.first is not None and layout.plan.key() == self.current.key()
        self.samples.append((iteration, metrics))
        full = [self._full_s(self.current, m) for _, m in self.samples]
        took = sum(m["time/iteration_s"] for _, m in self.samples)
        # the plan the run would run anyway (the planner's choice, measured first or measured again
        # last while it is the fastest) costs the budget nothing: while the run lasts ...
        on_choice = self.current.key() == self.first.key()
        again = on_choice and self.first.key() in self.measured
        free = on_choice and (not again or self._choice_fastest())
        if free:
            left, n = self.run_left - self._used(), len(self.samples)
            enough = measured_enough(full, left, took, MEASURE_S, max(MAX_ITERATIONS, self.choice_n))
            # ... and longer: towards choice_s seconds, within choice_n iterations
            enough = enough and (took >= self.choice_s or n >= self.choice_n or left <= 0)
        else:
            self.spent += 1
            enough = measured_enough(full, self.budget - self.spent, took)
        if not enough:
            return None
        measurement = self._measure(self.current, layout, self.samples)
        self.history.append(measurement)
        self.samples = []
        if again:
            self._bring_to_now(self.measured[self.current.key()], measurement)
            return self._settled()
        self.measured[self.current.key()] = measurement
        following = self._next()
        if following is not None:
            self.current = following
            return CalibrationStep(self.workflow.layout_of(following))
        if len(self.measured) > 1:
            # the others were measured after the choice: the choice is measured again, last, so
            # that they are compared at one pace (see _bring_to_now). While it is the fastest this
            # is free (the run would switch back to it anyway) and as long as its first
            # measurement; else it is one more candidate's measurement, within the budget.
            choice = self.measured[self.first.key()]
            room = (self.run_left - self._used()) if self._choice_fastest() else (self.budget - self.spent)
            if iterations_for(choice.iteration_s) <= room:
                self.current = self.first
                return CalibrationStep(self.workflow.layout_of(self.first))
        return self._settled()

    # --- internals ---------------------------------------------------------------------------------
    def _predict(self, plan: Plan, factors: dict[str, float], metrics: dict[str, Any] | None = None) -> float:
        """``plan``'s simulated seconds at the per-call ``factors``: of a full iteration, or with
        ``metrics`` of the iteration they describe (an episodic one may end early)."""
        assert self.profile is not None
        seconds, _ = predict(plan, rescale(self.profile, factors), self.workflow.macro_flow(metrics),
                             self.workflow.resources())
        return seconds

    def _used(self) -> int:
        """The iterations measured so far, under every plan."""
        return sum(len(m.iterations) for m in self.history) + len(self.samples)

    def _choice_fastest(self) -> bool:
        """Whether the planner's choice is the fastest plan measured (then measuring it again is free)."""
        choice = self.measured[self.first.key()]
        return choice.iteration_s <= min(m.iteration_s for m in self.measured.values())

    def _settled(self) -> CalibrationStep:
        self.active = False
        settled = self._settle()
        return CalibrationStep(self.workflow.layout_of(settled.plan), settled)

    def _bring_to_now(self, before: Measurement, again: Measurement) -> None:
        """The planner's choice, measured first (``before``) and ``again`` after the others,
        brackets them: the run's iterations drift as they go (a policy that learns to push the cube
        makes the default job's simulation 8-54% dearer per step; a host whose speed wanders), and
        a plan measured later looks slower (or faster) for it. Each plan measured between is priced
        at the pace of the run now: its time over the choice's where it ran (interpolated between
        ``before`` and ``again``), times ``again``. The choice's price is ``again``: its latest
        iterations."""
        t0, t1 = before.middle(), again.middle()
        for key, m in self.measured.items():
            if key != again.plan.key():
                then = before.iteration_s + (again.iteration_s - before.iteration_s) * (m.middle() - t0) / (t1 - t0)
                self.measured[key] = m.scaled(again.iteration_s / then)
        self.measured[again.plan.key()] = again
        self.ranked_after = -1  # the prices changed: rank again

    def _measure(self, plan: Plan, layout: Layout, samples: list[tuple[int, dict[str, Any]]]) -> Measurement:
        assert self.profile is not None
        per_call = [self.workflow.measured_factors(self.profile, layout, m) for _, m in samples]
        names = sorted({n for f in per_call for n in f})
        factors = {n: statistics.median(f[n] for f in per_call if n in f) for n in names}
        # the runtime's own seconds: what each iteration took beyond the simulation of its own
        # shape at the measured per-call costs. Every iteration pays them, however early an
        # episodic one ended (driver calls, weight sync, metrics): a young GRPO policy's iterations
        # are a fifth of a full one, and their residual counted as a fifth of a full one's had
        # priced CartPole GRPO's later iterations 22-24% above what they took.
        residual = statistics.median(m["time/iteration_s"] - self._predict(plan, factors, m) for _, m in samples)
        seconds = self._predict(plan, factors) + residual
        return Measurement(plan, seconds, factors, residual, tuple(i for i, _ in samples))

    def _full_s(self, plan: Plan, metrics: dict[str, Any]) -> float:
        """The measured seconds of an iteration as those of a full one: an episodic iteration that
        ended early (a young policy's short episodes) scaled by the simulations of both shapes, so
        that a measurement's iterations, which lengthen as the policy learns, do not look spread
        to :func:`measured_enough` (the plans themselves compare by :attr:`Measurement.iteration_s`)."""
        assert self.profile is not None
        return metrics["time/iteration_s"] / self.workflow.shape_scale(plan, self.profile, metrics)

    def _closest(self, plan: Plan) -> Measurement | None:
        """The measurement whose conditions are most like ``plan``'s: itself, then the same
        placement, then the same mode, then the first measured."""
        if not self.measured:
            return None

        def likeness(m: Measurement) -> tuple:
            match = (3 if m.plan.key() == plan.key() else 2 if m.plan.placement == plan.placement
                     else 1 if m.plan.mode == plan.mode else 0)
            return (match, -abs(m.plan.num_chunks - plan.num_chunks) if match else 0)

        return max(self.measured.values(), key=likeness)  # ties: the first measured

    def _ran_alike(self, plan: Plan, component: str) -> Measurement:
        """The measurement that ran ``component`` most like ``plan`` does: the plan itself, else
        the one whose neighbours of ``component`` (the components sharing its devices) overlap
        most with ``plan``'s, then on as many devices, then on the same ones, then the nearest
        chunk count."""
        devices, neighbours = plan.placement[component], _neighbours(plan, component)

        def likeness(m: Measurement) -> tuple:
            theirs = _neighbours(m.plan, component)
            union = neighbours | theirs
            overlap = len(neighbours & theirs) / len(union) if union else 1.0
            return (m.plan.key() == plan.key(), overlap, len(m.plan.placement[component]) == len(devices),
                    m.plan.placement[component] == devices, -abs(m.plan.num_chunks - plan.num_chunks))

        return max(self.measured.values(), key=likeness)

    def _ranked(self) -> list[tuple[Plan, float]]:
        """The candidates by corrected price, fastest first (priced once per new measurement: a
        long iteration's simulation is not free)."""
        if self.ranked_after != len(self.measured):
            priced = [(p, self.corrected(p)) for p in self.candidates]
            self.ranked = sorted(((p, s) for p, s in priced if s is not None), key=lambda ps: ps[1])
            self.ranked_after = len(self.measured)
        return self.ranked

    def _next(self) -> Plan | None:
        best = min(m.iteration_s for m in self.measured.values())
        left = self.budget - self.spent
        for plan, seconds in self._ranked():
            if seconds >= best * (1 + self.margin):
                return None
            if plan.key() not in self.measured and iterations_for(seconds) <= left:
                return plan
        return None

    def _settle(self) -> Calibrated:
        assert self.profile is not None
        ranked = self._ranked()
        best = min(self.measured.values(), key=lambda m: m.iteration_s)
        # its price as compared: its measurement (at the run's pace now where the choice was
        # measured again after it; re-simulating the scaled factors would not scale the seconds
        # no factor covers, and put the prediction a few tenths of a percent off its own price)
        plan = dataclasses.replace(best.plan, predicted_iteration_s=best.iteration_s)
        first = min(i for m in self.history for i in m.iterations)
        last = max(i for m in self.history for i in m.iterations)
        runs = ", ".join(f"{describe_plan(m.plan)} {m.iteration_s:.3f} s (profiled {m.plan.predicted_iteration_s:.3f})"
                         for m in self.history)
        again = ""
        if len(self.history) > len(self.measured):  # one plan was measured again: the others priced at its pace now
            now = {k: f"{describe_plan(m.plan)} {m.iteration_s:.3f} s" for k, m in self.measured.items() if k != self.history[-1].plan.key()}
            again = f"; measured again last, the others at its pace now: {', '.join(now.values())}"
        factors = ", ".join(f"{n} {f:.2f}x" for n, f in best.factors.items())
        reason = (f"calibrated on iterations {first}-{last}: {runs}{again}; chosen {describe_plan(plan)}, predicted "
                  f"{plan.predicted_iteration_s:.3f} s/iteration (measured/profiled per call: {factors}; runtime "
                  f"{best.residual_s:+.3f} s/iteration)")
        return Calibrated(plan, rescale(self.profile, best.factors), tuple(self.history), tuple(self.measured.values()),
                          tuple(ranked), reason)
