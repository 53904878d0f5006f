"""Calibration: the planner's best candidates measured in the pipeline before a run settles on a plan.

The probes price each component alone. In the pipeline a component shares cores, channels and
processes with its neighbours, and the runtime spends seconds of its own in every iteration
(driver calls, weight sync, metrics) that no component's call accounts for. Calibration measures
both on the run's own first iterations, which are ordinary training iterations: after one warm-up
iteration it measures the planner's choice, then each candidate whose price, corrected by what was
measured, may still beat the best measured plan within the budget (``plan.calibrate``), then the
choice again so that every plan is compared at the run's current pace. The run settles on the
fastest measured plan, and that plan's measurement becomes the run's prediction.

:class:`Calibrator` is a small state machine (:class:`Phase`, one transition function); the
functions before it decide how long a measurement runs. docs/planner.md#calibration describes the
method. ``plan.calibrate=0`` turns calibration off: the run keeps the planner's choice.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from dataclasses import dataclass
from typing import Any

from pipelines.config import PlanConfig
from pipelines.replan import rescale
from pipelines.workflow import Layout, Workflow
from scheduler import Plan, PlanResult, Profile, predict

#: the fewest seconds of iterations a plan is measured for: the host's speed moves within seconds,
#: so a shorter window measures the moment rather than the plan
MEASURE_S = 4.0
#: a measurement goes on until the median of its iterations is known to this relative standard
#: error, so that iterations that spread widely are not taken at face value
TARGET_RSE = 0.03
#: the fewest iterations a measurement ends on (only once the budget is spent) and the most it takes
MIN_ITERATIONS, MAX_ITERATIONS = 2, 30
#: the fewest iterations a measurement's spread is judged from (two that agree may agree by
#: chance); a run calibrates only when it holds one measurement of this many
MIN_SPREAD_ITERATIONS = 3
#: a candidate is measured while its corrected price is below (1 + margin) x the best measured
#: plan's; the default is ``plan.calibrate_margin``'s, defined once in the config
MARGIN = PlanConfig.calibrate_margin
#: seconds the planner's choice is measured for: its measurement is free and becomes the run's
#: prediction, and a longer window pins a plan's time down against the host's slow drift
CHOICE_MEASURE_S = 16.0
#: the most of the run's predicted seconds, and of its iterations, after the warm-up that the
#: choice's longer window may take, so that the plan the run settles on runs most of the run
CHOICE_SHARE = 0.25
#: the most iterations the choice's longer window may take; past them it is measured as any plan
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
    ``wall_s``: the seconds they took where ``times`` are other seconds (episodic iterations that
    ended early, counted as the full ones they stand for: the window is the time they really took)."""
    n = len(times)
    if n >= most or (n >= MIN_ITERATIONS and budget_left <= 0):
        return True
    took = sum(times) if wall_s is None else wall_s
    return n >= MIN_SPREAD_ITERATIONS and took >= measure_s and relative_standard_error(times) <= TARGET_RSE


def describe_plan(plan: Plan) -> str:
    """E.g. ``colocated/2ch env:0-1 rollout:0-1 trainer:0-1``."""
    return f"{plan.mode}/{plan.num_chunks}ch {plan.placement_str()}"


@dataclass(frozen=True)
class Measurement:
    """One candidate measured in the pipeline."""

    plan: Plan
    """The candidate as the planner priced it from the profile."""
    iteration_s: float
    """Measured seconds of a full iteration: its simulation at the measured per-call factors plus
    the residual (the median measured iteration, unless episodic ones ended early)."""
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


def bring_to_now(measured: dict[tuple, Measurement], again: Measurement) -> dict[tuple, Measurement]:
    """``measured`` (plan key -> measurement, the planner's choice first) at the run's pace now,
    once the choice was measured ``again`` after the others: a run's iterations drift (a learning
    policy changes what its simulation costs; the host's speed wanders), so a plan measured later
    would look slower or faster than it is. Each plan measured between is priced at its time over
    the choice's where it ran (interpolated between the choice's two measurements) times
    ``again``, which is the choice's own price."""
    before = measured[again.plan.key()]
    t0, t1 = before.middle(), again.middle()
    now = {}
    for key, m in measured.items():
        if key == again.plan.key():
            now[key] = again
        else:
            then = before.iteration_s + (again.iteration_s - before.iteration_s) * (m.middle() - t0) / (t1 - t0)
            now[key] = m.scaled(again.iteration_s / then)
    return now


def _closest(measured: list[Measurement], plan: Plan) -> Measurement:
    """The measurement whose conditions are most like ``plan``'s: itself, then the same
    placement, then the same mode (the nearest chunk count), then the first measured."""

    def likeness(m: Measurement) -> tuple:
        match = (3 if m.plan.key() == plan.key() else 2 if m.plan.placement == plan.placement
                 else 1 if m.plan.mode == plan.mode else 0)
        return (match, -abs(m.plan.num_chunks - plan.num_chunks) if match else 0)

    return max(measured, key=likeness)  # ties: the first measured


def _ran_alike(measured: list[Measurement], plan: Plan, component: str) -> Measurement:
    """The measurement that ran ``component`` most like ``plan`` does: the plan itself, else
    the one whose neighbours of ``component`` (the components sharing its devices) overlap
    most with ``plan``'s, then on as many devices, then on the same ones, then the nearest
    chunk count."""
    def neighbours_in(p: Plan) -> frozenset[str]:  # the other components sharing a device with it
        return frozenset(c for c, on in p.placement.items() if c != component and set(on) & set(p.placement[component]))

    devices, neighbours = plan.placement[component], neighbours_in(plan)

    def likeness(m: Measurement) -> tuple:
        theirs = neighbours_in(m.plan)
        union = neighbours | theirs
        overlap = len(neighbours & theirs) / len(union) if union else 1.0
        return (m.plan.key() == plan.key(), overlap, len(m.plan.placement[component]) == len(devices),
                m.plan.placement[component] == devices, -abs(m.plan.num_chunks - plan.num_chunks))

    return max(measured, key=likeness)


@dataclass(frozen=True)
class Calibrated:
    """What calibration settled on: the plan (its prediction its price in ``compared``), the profile
    rescaled by its factors, every measurement in the order taken (the choice twice when it was
    measured again), each measured plan's price as compared, and each candidate's price."""

    plan: Plan
    profile: Profile
    measurements: tuple[Measurement, ...]
    compared: tuple[Measurement, ...]
    """One per measured plan, in the order first measured, as the run compared them: its
    measurement, at the run's latest pace where the choice was measured again after it
    (:func:`bring_to_now`). The plan settled on is the fastest of these."""
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


class Phase(enum.Enum):
    """Where calibration stands: ``OFF`` (not started, ``plan.calibrate=0``, or a run too short for
    one measurement), else ``WARM_UP -> CHOICE -> CANDIDATE* -> [AGAIN] -> SETTLED``."""

    OFF = "off"
    WARM_UP = "warm-up"  # the run's first iteration (resets, first calls): the choice runs, unmeasured
    CHOICE = "choice"  # measuring the planner's choice: free (the run would run it anyway), over a longer window
    CANDIDATE = "candidate"  # measuring a candidate that may beat the best measured plan, on the budget
    AGAIN = "again"  # measuring the choice again after the others, so that all compare at one pace
    SETTLED = "settled"  # done: the run keeps the fastest measured plan


@dataclass(frozen=True)
class State:
    """A phase and the plan the run measures in it."""

    phase: Phase
    plan: Plan | None = None  # the plan the run runs in this phase (None: off, settled)
    free: bool = False
    """Whether its iterations cost the budget nothing: the choice, measured first or measured again
    while it is the fastest measured plan (the run would switch back to it anyway)."""


@dataclass(frozen=True)
class _Run:
    """What :meth:`Calibrator.start` fixes for a run."""

    profile: Profile
    candidates: tuple[Plan, ...]  # distinct micro flows, the planner's choice first
    choice: Plan
    budget: int  # iterations that may run under plans other than the choice (plan.calibrate's share)
    run_left: int  # the run's iterations after the warm-up: the most a free measurement may take


_MEASURING = (Phase.CHOICE, Phase.CANDIDATE, Phase.AGAIN)


class Calibrator:
    """Drives calibration over a run's first iterations (see the module docstring). ``share``:
    the most of the run's iterations calibration may take (``plan.calibrate``); ``margin``: how
    much dearer than the best measured plan a candidate's corrected price may be and still be
    measured (``plan.calibrate_margin``). It keeps its :class:`State`, the iterations of the
    measurement in progress and every measurement taken; the budget spent, the prices as compared
    and the candidates' ranking are derived from those."""

    def __init__(self, workflow: Workflow, share: float, margin: float = MARGIN) -> None:
        self.workflow, self.share, self.margin = workflow, share, margin
        self._run: _Run | None = None
        self._state = State(Phase.OFF)
        self._samples: list[tuple[int, dict[str, Any]]] = []  # the measurement in progress: (iteration, metrics)
        self._history: list[tuple[Measurement, bool]] = []  # every measurement, in order, and whether it was free
        self._ranking: tuple[int, list[tuple[Plan, float]]] | None = None  # (measurements priced with, ranking)

    @property
    def phase(self) -> Phase:
        return self._state.phase

    @property
    def active(self) -> bool:
        """Whether calibration still decides the run's plan (warming up or measuring)."""
        return self._state.phase is Phase.WARM_UP or self._state.phase in _MEASURING

    @property
    def budget(self) -> int:
        """Iterations calibration may run under plans other than the planner's choice."""
        return self._run.budget if self._run is not None else 0

    @property
    def spent(self) -> int:
        """Iterations run so far on the budget (under plans other than the choice, or the choice
        measured again as one more candidate)."""
        paid = sum(len(m.iterations) for m, free in self._history if not free)
        return paid + (0 if self._state.free else len(self._samples))

    @property
    def choice_s(self) -> float:
        """Seconds of iterations the planner's choice is measured for (:func:`choice_window_s`)."""
        run = self._run
        return choice_window_s(run.choice.predicted_iteration_s, run.run_left) if run is not None else MEASURE_S

    @property
    def choice_n(self) -> int:
        """The iterations the choice's longer window may take (:func:`choice_iterations`)."""
        return choice_iterations(self._run.run_left) if self._run is not None else 0

    def start(self, result: PlanResult, profile: Profile, iterations_left: int) -> None:
        """Calibrate among ``result``'s candidates (the distinct micro flows, fastest predicted
        first; the planner's choice first of all) within ``share`` of ``iterations_left``."""
        seen: dict[tuple, Plan] = {result.best.key(): result.best}
        for plan, _ in result.candidates:
            seen.setdefault(plan.key(), plan)
        self._run = _Run(profile, tuple(seen.values()), result.best, int(self.share * iterations_left),
                         iterations_left - 1)
        self._samples, self._history, self._ranking = [], [], None
        fits = self.share > 0 and self._run.run_left >= iterations_for(result.best.predicted_iteration_s)
        self._state = State(Phase.WARM_UP, result.best, free=True) if fits else State(Phase.OFF)

    def observe(self, iteration: int, metrics: dict[str, Any], layout: Layout) -> CalibrationStep | None:
        """Record iteration ``iteration`` (1-based, run under ``layout``); returns the layout to
        run next when this iteration completed a measurement (None: go on as is)."""
        state = self._state
        if state.phase in _MEASURING:
            if metrics.get("time/train_s") is None:  # nothing trained (staleness 1's first collection)
                return None
            assert state.plan is not None and layout.plan.key() == state.plan.key()
            self._samples.append((iteration, metrics))
            if not self._complete():
                return None
            self._history.append((self._measure(state.plan, layout, self._samples), state.free))
            self._samples = []
        elif state.phase is not Phase.WARM_UP:
            return None
        self._state = self._transition()
        if state.phase is Phase.WARM_UP:  # the choice runs on, now measured
            return None
        if self._state.phase is Phase.SETTLED:
            settled = self._settle()
            return CalibrationStep(self.workflow.layout_of(settled.plan), settled)
        assert self._state.plan is not None
        return CalibrationStep(self.workflow.layout_of(self._state.plan))

    def _transition(self) -> State:
        """The state after the current one ends (the warm-up after one iteration, a measurement
        once :meth:`_complete`): the choice; then each candidate that may beat the best measured
        plan within the budget; then the choice again where it fits (free while it is the fastest)."""
        run, phase = self._started(), self._state.phase
        if phase is Phase.WARM_UP:
            return State(Phase.CHOICE, run.choice, free=True)
        if phase is Phase.AGAIN:
            return State(Phase.SETTLED)
        candidate = self._next_candidate()
        if candidate is not None:
            return State(Phase.CANDIDATE, candidate)
        if len(self._history) > 1:
            prices = self._prices()
            choice_s = prices[run.choice.key()].iteration_s
            free = choice_s <= min(m.iteration_s for m in prices.values())
            if iterations_for(choice_s) <= self._left(free):
                return State(Phase.AGAIN, run.choice, free)
        return State(Phase.SETTLED)

    def corrected(self, plan: Plan) -> float | None:
        """``plan``'s predicted seconds per iteration corrected by the measurements: a measured
        plan's price as compared (the price it is settled on, to the last digit); any other plan
        re-simulated with :meth:`correction` (None before any plan is measured)."""
        measured = self._prices().get(plan.key())
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
        measured = list(self._prices().values())
        if not measured:
            return None
        sources = {component: _ran_alike(measured, plan, component) for component in plan.placement}
        factors = {component: m.factors[component] for component, m in sources.items() if component in m.factors}
        return factors, _closest(measured, plan).residual_s

    # --- internals ---------------------------------------------------------------------------------
    def _started(self) -> _Run:
        assert self._run is not None, "Calibrator.start() first"
        return self._run

    def _prices(self) -> dict[tuple, Measurement]:
        """Each measured plan's measurement as the run compares them, in the order first measured:
        as measured, or, once the choice was measured again, at the run's pace now (:func:`bring_to_now`)."""
        measured: dict[tuple, Measurement] = {}
        for m, _ in self._history:
            measured.setdefault(m.plan.key(), m)
        if len(self._history) > len(measured):  # the choice, measured again last
            return bring_to_now(measured, self._history[-1][0])
        return measured

    def _left(self, free: bool) -> int:
        """Iterations still open to a measurement: the run's where it is free, else the budget's."""
        if not free:
            return self.budget - self.spent
        return self._started().run_left - sum(len(m.iterations) for m, _ in self._history) - len(self._samples)

    def _complete(self) -> bool:
        """Whether the current plan's iterations so far complete its measurement (a free one's
        window is the choice's longer one: :attr:`choice_s`, :attr:`choice_n`)."""
        plan, free = self._state.plan, self._state.free
        assert plan is not None
        full = [self._full_s(plan, m) for _, m in self._samples]
        took = sum(m["time/iteration_s"] for _, m in self._samples)
        left = self._left(free)
        if not free:
            return measured_enough(full, left, took)
        return (measured_enough(full, left, took, MEASURE_S, max(MAX_ITERATIONS, self.choice_n))
                and (took >= self.choice_s or len(self._samples) >= self.choice_n or left <= 0))

    def _predict(self, plan: Plan, factors: dict[str, float], metrics: dict[str, Any] | None = None) -> float:
        """``plan``'s simulated seconds at the per-call ``factors``: of a full iteration, or with
        ``metrics`` of the iteration they describe (an episodic one may end early)."""
        seconds, _ = predict(plan, rescale(self._started().profile, factors), self.workflow.macro_flow(metrics),
                             self.workflow.resources())
        return seconds

    def _measure(self, plan: Plan, layout: Layout, samples: list[tuple[int, dict[str, Any]]]) -> Measurement:
        profile = self._started().profile
        per_call = [self.workflow.measured_factors(profile, layout, m) for _, m in samples]
        names = sorted({n for f in per_call for n in f})
        factors = {n: statistics.median(f[n] for f in per_call if n in f) for n in names}
        # the runtime's own seconds (driver calls, weight sync, metrics): what each iteration took
        # beyond the simulation of its own shape; paid once per iteration however early it ended
        residual = statistics.median(m["time/iteration_s"] - self._predict(plan, factors, m) for _, m in samples)
        seconds = self._predict(plan, factors) + residual
        return Measurement(plan, seconds, factors, residual, tuple(i for i, _ in samples))

    def _full_s(self, plan: Plan, metrics: dict[str, Any]) -> float:
        """The measured seconds of an iteration as those of a full one: an episodic iteration that
        ended early (a young policy's short episodes) scaled by the simulations of both shapes, so
        that a measurement's iterations, which lengthen as the policy learns, do not look spread
        to :func:`measured_enough` (the plans themselves compare by :attr:`Measurement.iteration_s`)."""
        return metrics["time/iteration_s"] / self.workflow.shape_scale(plan, self._started().profile, metrics)

    def _ranked(self) -> list[tuple[Plan, float]]:
        """The candidates by corrected price, fastest first (priced once per new measurement: a
        long iteration's simulation is not free)."""
        if self._ranking is None or self._ranking[0] != len(self._history):
            priced = [(p, self.corrected(p)) for p in self._started().candidates]
            ranked = sorted(((p, s) for p, s in priced if s is not None), key=lambda ps: ps[1])
            self._ranking = (len(self._history), ranked)
        return self._ranking[1]

    def _next_candidate(self) -> Plan | None:
        """The fastest unmeasured candidate by corrected price while it may beat the best measured
        plan (within the margin) and one measurement of it fits the budget."""
        prices = self._prices()
        best = min(m.iteration_s for m in prices.values())
        left = self._left(False)
        for plan, seconds in self._ranked():
            if seconds >= best * (1 + self.margin):
                return None
            if plan.key() not in prices and iterations_for(seconds) <= left:
                return plan
        return None

    def _settle(self) -> Calibrated:
        profile, ranked, prices = self._started().profile, self._ranked(), self._prices()
        history = [m for m, _ in self._history]
        best = min(prices.values(), key=lambda m: m.iteration_s)
        # its price as compared: its measurement (at the run's pace now where the choice was
        # measured again after it; re-simulating the scaled factors would not scale the seconds
        # no factor covers, and put the prediction slightly off its own price)
        plan = dataclasses.replace(best.plan, predicted_iteration_s=best.iteration_s)
        measured_on = [i for m in history for i in m.iterations]
        runs = ", ".join(f"{describe_plan(m.plan)} {m.iteration_s:.3f} s (profiled {m.plan.predicted_iteration_s:.3f})"
                         for m in history)
        again = ""
        if len(history) > len(prices):  # one plan was measured again: the others priced at its pace now
            again_key = history[-1].plan.key()
            now = [f"{describe_plan(m.plan)} {m.iteration_s:.3f} s" for k, m in prices.items() if k != again_key]
            again = f"; measured again last, the others at its pace now: {', '.join(now)}"
        factors = ", ".join(f"{n} {f:.2f}x" for n, f in best.factors.items())
        reason = (f"calibrated on iterations {min(measured_on)}-{max(measured_on)}: {runs}{again}; chosen "
                  f"{describe_plan(plan)}, predicted {plan.predicted_iteration_s:.3f} s/iteration (measured/profiled "
                  f"per call: {factors}; runtime {best.residual_s:+.3f} s/iteration)")
        return Calibrated(plan, rescale(profile, best.factors), tuple(history), tuple(prices.values()),
                          tuple(ranked), reason)
