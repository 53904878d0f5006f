"""Calibration: the planner's best candidates measured in the pipeline before a run settles (pipelines/calibrate.py).

A stand-in pipeline prices every component's calls at the profile times a factor that depends on
the plan's mode (what the probes cannot see: neighbours sharing cores), plus seconds of its own per
iteration; the calibrator sees only the metrics an iteration reports.
"""

from __future__ import annotations

import dataclasses
import random
import statistics

import pytest

from embodied.config import apply_overrides
from embodied.errors import ConfigError
from pipelines.calibrate import (CHOICE_MAX_ITERATIONS, CHOICE_MEASURE_S, MARGIN, MAX_ITERATIONS, MEASURE_S, TARGET_RSE,
                                 Calibrator, Phase, choice_iterations, choice_window_s, iterations_for, measured_enough, relative_standard_error)
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.workflow import EmbodiedWorkflow
from pipelines.replan import rescale
from pipelines.workflow import Layout
from scheduler import MODES, ComponentProfile, CostModel, Plan, Profile, predict

METRIC = {"env": "time/sim_s", "rollout": "time/infer_s", "trainer": "time/train_s"}


def _workflow(*overrides: str) -> EmbodiedWorkflow:
    cfg = apply_overrides(EmbodiedConfig, {}, ["env.id=CartPole-v1", "env.num_envs=8", "algo.rollout_steps=16",
                                               "algo.epochs=2", "algo.num_minibatches=4", "cluster.num_cpus=2",
                                               "plan.max_chunks=2", *overrides])
    return EmbodiedWorkflow(cfg)


def _profile() -> Profile:
    return Profile({
        "env": ComponentProfile("env", CostModel(0.0, 0.01, 0.0)),
        "rollout": ComponentProfile("rollout", CostModel(0.004, 0.0, 0.0)),
        "trainer": ComponentProfile("trainer", CostModel(0.0, 0.001, 1.0)),
    })


class Pipeline:
    """Runs an iteration of ``layout`` as the stand-in machine would: each component's calls cost
    the profile's times ``slowdown[mode][component]``, the iteration the planner's simulation of
    those costs plus ``runtime_s``."""

    def __init__(self, workflow: EmbodiedWorkflow, profile: Profile, slowdown: dict[str, dict[str, float]], runtime_s: float):
        self.workflow, self.profile, self.slowdown, self.runtime_s = workflow, profile, slowdown, runtime_s

    def factors(self, plan: Plan) -> dict[str, float]:
        return self.slowdown.get(plan.mode, {})

    def iteration_s(self, plan: Plan) -> float:
        seconds, _ = predict(plan, rescale(self.profile, self.factors(plan)), self.workflow.macro_flow(),
                             self.workflow.resources())
        return seconds + self.runtime_s

    def run(self, layout: Layout) -> dict:
        # profiled seconds of each component in this iteration: what 1 s measured would be a factor of
        unit = self.workflow.measured_factors(self.profile, layout, {key: 1.0 for key in METRIC.values()})
        metrics = {METRIC[c]: self.factors(layout.plan).get(c, 1.0) / unit[c] for c in METRIC}
        metrics["time/iteration_s"] = self.iteration_s(layout.plan)
        return metrics


def _calibrate(calibrator: Calibrator, pipeline: Pipeline, layout: Layout, limit: int = 100):
    """Iterate until calibration settles; returns (settled, layouts run per iteration)."""
    runs = []
    for iteration in range(1, limit + 1):
        runs.append(layout.plan)
        step = calibrator.observe(iteration, pipeline.run(layout), layout)
        if step is not None:
            layout = step.layout
            if step.settled is not None:
                return step.settled, runs
    raise AssertionError("calibration did not settle")


def _settled(pipeline: Pipeline, share: float = 0.5, iterations_left: int = 100):
    """Calibrate the planner's candidates on ``pipeline`` until the run settles:
    (workflow, planner's result, pipeline, calibrator, settled, plans run per iteration)."""
    workflow, profile = pipeline.workflow, pipeline.profile
    result = workflow.plan(profile)
    calibrator = Calibrator(workflow, share=share)
    calibrator.start(result, profile, iterations_left=iterations_left)
    settled, runs = _calibrate(calibrator, pipeline, workflow.layout_of(result.best))
    return workflow, result, pipeline, calibrator, settled, runs


def test_calibration_finds_the_plan_the_probes_misprice_and_predicts_it():
    """Colocated plans pay a 3x rollout the probes did not see; calibration measures the
    planner's choice, finds it slower than priced, measures the candidates that may beat it and
    settles on the truly fastest, with a prediction that matches what it then measures."""
    workflow, profile = _workflow(), _profile()
    result = workflow.plan(profile)
    pipeline = Pipeline(workflow, profile, {"colocated": {"rollout": 3.0, "env": 1.2}}, runtime_s=0.02)
    calibrator = Calibrator(workflow, share=0.5)
    calibrator.start(result, profile, iterations_left=100)
    assert calibrator.active and calibrator.budget == 50
    settled, runs = _calibrate(calibrator, pipeline, workflow.layout_of(result.best))

    truth = {p.key(): pipeline.iteration_s(p) for p, _ in result.candidates}
    fastest = min(truth.values())
    assert truth[settled.plan.key()] == pytest.approx(fastest)
    assert settled.plan.predicted_iteration_s == pytest.approx(truth[settled.plan.key()])
    # the first iteration is the warm-up: run under the planner's choice, measured by nobody
    assert runs[0].key() == result.best.key()
    assert settled.measurements[0].iterations[0] == 2
    # the budget holds the iterations under plans other than the planner's choice (measuring the
    # choice is free: the run would run it anyway)
    assert sum(p.key() != result.best.key() for p in runs) == calibrator.spent <= calibrator.budget
    # each measurement: its factors and the runtime's own seconds, recovered from the metrics
    for m in settled.measurements:
        expected = pipeline.factors(m.plan)
        assert m.factors == pytest.approx({c: expected.get(c, 1.0) for c in METRIC})
        assert m.residual_s == pytest.approx(0.02)
        # about MEASURE_S seconds of its iterations; the planner's choice (free) longer
        longer = iterations_for(m.iteration_s, calibrator.choice_s, calibrator.choice_n) if m.plan.key() == result.best.key() else 0
        assert len(m.iterations) == max(iterations_for(m.iteration_s), longer)
    # every candidate priced like its measured neighbours: unmeasured plans of a measured mode exactly
    measured_modes = {m.plan.mode for m in settled.measurements}
    for plan, seconds in settled.predictions:
        if plan.mode in measured_modes:
            assert seconds == pytest.approx(truth[plan.key()])
    # the settled profile carries the chosen plan's factors
    chosen_factors = pipeline.factors(settled.plan)
    assert settled.profile["rollout"].cost.fixed_s == pytest.approx(0.004 * chosen_factors.get("rollout", 1.0))


def test_calibration_measures_only_the_candidates_that_may_beat_the_choice():
    """The machine runs as profiled: calibration measures the planner's choice and the candidates
    priced within the margin of it, no other, and keeps the fastest with its prediction unchanged."""
    workflow, result, pipeline, calibrator, settled, runs = _settled(Pipeline(_workflow(), _profile(), {}, runtime_s=0.0))
    fastest = min(p.predicted_iteration_s for p, _ in result.candidates)
    close = {p.key() for p, _ in result.candidates if p.predicted_iteration_s < fastest * (1 + MARGIN)}
    assert {m.plan.key() for m in settled.measurements} == close | {result.best.key()}
    assert settled.measurements[0].plan.key() == result.best.key()
    assert settled.plan.predicted_iteration_s == pytest.approx(fastest)
    assert not calibrator.active
    layout = workflow.layout_of(settled.plan)
    assert calibrator.observe(len(runs) + 1, pipeline.run(layout), layout) is None


@pytest.mark.parametrize("margin", [0.0, 0.3, 1.0])
def test_the_margin_sets_how_far_behind_a_candidate_may_be_priced_and_still_be_measured(margin):
    """``plan.calibrate_margin``: on a machine that runs as profiled, the candidates measured are
    those priced below (1 + margin) x the fastest (the choice measured again last when any other
    was), and a margin of 0 measures the choice alone."""
    workflow, profile = _workflow(), _profile()
    result = workflow.plan(profile)
    pipeline = Pipeline(workflow, profile, {}, runtime_s=0.0)
    calibrator = Calibrator(workflow, share=1.0, margin=margin)
    calibrator.start(result, profile, iterations_left=2000)
    settled, _ = _calibrate(calibrator, pipeline, workflow.layout_of(result.best), limit=2000)
    fastest = min(p.predicted_iteration_s for p, _ in result.candidates)
    close = {p.key() for p, _ in result.candidates if p.predicted_iteration_s < fastest * (1 + margin)}
    assert {m.plan.key() for m in settled.measurements} == close | {result.best.key()}
    assert len(settled.compared) == len(close | {result.best.key()})
    again = len(settled.compared) > 1
    assert len(settled.measurements) == len(settled.compared) + again
    assert settled.measurements[-1].plan.key() == result.best.key()
    if margin == 0.0:
        assert len(settled.measurements) == 1
    if margin == 1.0:
        assert len(close) > 3  # the wide margin measures plans the default one leaves out
    assert settled.plan.predicted_iteration_s == pytest.approx(fastest)


def test_calibration_spends_at_most_its_share_and_is_off_at_zero():
    workflow, profile = _workflow(), _profile()
    result = workflow.plan(profile)
    pipeline = Pipeline(workflow, profile, {"colocated": {"rollout": 3.0}, "hybrid": {"env": 2.0},
                                            "disaggregated": {"trainer": 2.0}}, runtime_s=0.0)
    calibrator = Calibrator(workflow, share=0.1)
    calibrator.start(result, profile, iterations_left=60)  # 6 iterations: room for 1-2 plans beside the choice
    settled, runs = _calibrate(calibrator, pipeline, workflow.layout_of(result.best))
    others = [m for m in settled.measurements if m.plan.key() != result.best.key()]
    assert sum(len(m.iterations) for m in others) <= 6
    assert sum(p.key() != result.best.key() for p in runs) <= 6

    off = Calibrator(workflow, share=0.0)
    off.start(result, profile, iterations_left=1000)
    assert not off.active
    assert off.observe(1, pipeline.run(workflow.layout_of(result.best)), workflow.layout_of(result.best)) is None
    short = Calibrator(workflow, share=0.1)
    # the warm-up and less than one measurement
    short.start(result, profile, iterations_left=iterations_for(result.best.predicted_iteration_s))
    assert not short.active


def test_a_run_whose_share_holds_no_other_plan_still_measures_the_choice():
    """A 25-iteration run with a share of 0.1 has two iterations of budget: too few for another plan,
    but measuring the planner's choice is free (the run would run it anyway). The run measures it
    within its iterations and settles on it, priced with what the probes leave out (its neighbours'
    slowdown, the runtime's own seconds per iteration)."""
    workflow, profile = _workflow(), _profile()
    result = workflow.plan(profile)
    pipeline = Pipeline(workflow, profile, {mode: {"rollout": 1.5, "env": 1.3} for mode in MODES}, runtime_s=0.05)
    needed = iterations_for(result.best.predicted_iteration_s)
    calibrator = Calibrator(workflow, share=0.1)
    calibrator.start(result, profile, iterations_left=25)
    assert calibrator.budget < needed and calibrator.active
    settled, runs = _calibrate(calibrator, pipeline, workflow.layout_of(result.best))
    assert [m.plan.key() for m in settled.measurements] == [result.best.key()]
    assert all(p.key() == result.best.key() for p in runs) and len(runs) <= 25
    assert settled.plan.key() == result.best.key() and calibrator.spent == 0
    truth = pipeline.iteration_s(result.best)
    assert result.best.predicted_iteration_s < truth / 1.2  # the probes alone: far below
    assert settled.plan.predicted_iteration_s == pytest.approx(truth)
    assert settled.measurements[0].residual_s == pytest.approx(0.05)
    # a run of just the warm-up and one measurement still measures it, within the run
    tight = Calibrator(workflow, share=0.1)
    tight.start(result, profile, iterations_left=needed + 1)
    assert tight.active
    settled, runs = _calibrate(tight, pipeline, workflow.layout_of(result.best))
    assert len(runs) <= needed + 1 and settled.plan.predicted_iteration_s == pytest.approx(truth)


def test_config_rejects_a_share_outside_zero_to_one():
    with pytest.raises(ConfigError, match="plan.calibrate"):
        apply_overrides(EmbodiedConfig, {}, ["plan.calibrate=1.5"])


class NeighbourPipeline(Pipeline):
    """The env steps 2x slower wherever it shares a core with the rollout (whatever the mode)."""

    def factors(self, plan: Plan) -> dict[str, float]:
        shared = set(plan.placement["env"]) & set(plan.placement["rollout"])
        return {"env": 2.0} if shared else {}


def test_each_component_is_priced_from_the_measured_plan_that_ran_it_beside_the_most_alike_neighbours():
    """Calibration measures hybrid plans (env alone) and a colocated one (env beside the rollout);
    a disaggregated plan, never measured, puts the env beside the rollout again: it is priced
    with the colocated env's factor, not with the hybrid's, though no plan of its mode was measured.
    (Without streams plans, which need Ray workers: a streams plan puts the env beside the rollout
    too, and with the probes' prices it would be measured first.)"""
    workflow = _workflow("cluster.backend=local")
    _, _, pipeline, _, settled, _ = _settled(NeighbourPipeline(workflow, _profile(), {}, runtime_s=0.0))
    assert {m.plan.mode for m in settled.measurements} == {"hybrid", "colocated"}
    unmeasured = [p for p, _ in settled.predictions if p.mode == "disaggregated"]
    assert unmeasured
    # every other component runs as profiled wherever it runs: each price must be the truth
    for plan, seconds in settled.predictions:
        assert seconds == pytest.approx(pipeline.iteration_s(plan)), plan


def test_the_choice_is_measured_longer_within_a_quarter_of_the_run():
    """The planner's choice is measured free (the run would run it anyway) and its price becomes
    the run's prediction: a long run measures it CHOICE_MEASURE_S (a host whose speed wanders over
    tens of seconds pins a plan's time down slowly), the candidates that may beat it MEASURE_S
    each; a short run measures it longer only within a quarter of its predicted seconds and of its
    iterations (a young GRPO policy's iterations are a fraction of the full ones its seconds are
    predicted in), and no less than any plan."""
    assert choice_window_s(0.2, 10_000) == CHOICE_MEASURE_S
    assert choice_window_s(0.2, 200) == pytest.approx(0.25 * 200 * 0.2)  # 10 s: a quarter of a 40 s run
    assert choice_window_s(0.2, 40) == MEASURE_S and choice_window_s(0.0, 10_000) == MEASURE_S
    # and within a quarter of the run's iterations
    assert choice_iterations(10_000) == CHOICE_MAX_ITERATIONS and choice_iterations(400) == 100
    assert choice_iterations(24) == 6 and choice_iterations(0) == 0
    # the env runs 2x slower beside the rollout: the candidates that may beat the choice are measured after it
    workflow, profile = _workflow("cluster.backend=local"), _profile()
    result = workflow.plan(profile)
    pipeline = NeighbourPipeline(workflow, profile, {}, runtime_s=0.02)
    seconds = pipeline.iteration_s(result.best)
    long = Calibrator(workflow, share=0.5)
    long.start(result, profile, iterations_left=100_000)
    assert long.choice_s == CHOICE_MEASURE_S
    settled, runs = _calibrate(long, pipeline, workflow.layout_of(result.best), limit=1000)
    first, *others = settled.measurements
    assert first.plan.key() == result.best.key() and others
    took = len(first.iterations) * seconds
    assert long.choice_n == CHOICE_MAX_ITERATIONS
    assert CHOICE_MEASURE_S <= took < CHOICE_MEASURE_S + seconds or len(first.iterations) == CHOICE_MAX_ITERATIONS
    # the choice stays the fastest: measured again after the others (free, as long), and the run settles on it
    *between, again = others
    assert again.plan.key() == settled.plan.key() == result.best.key() and between
    assert len(again.iterations) == iterations_for(again.iteration_s, long.choice_s, long.choice_n)
    assert settled.plan.predicted_iteration_s == pytest.approx(again.iteration_s) == pytest.approx(seconds)
    for m in between:
        assert len(m.iterations) == iterations_for(m.iteration_s)
    assert sum(p.key() != result.best.key() for p in runs) == long.spent <= long.budget
    # a short run: a quarter of its predicted seconds, within the run
    short = Calibrator(workflow, share=0.5)
    short.start(result, profile, iterations_left=30)
    assert MEASURE_S < short.choice_s < CHOICE_MEASURE_S
    assert short.choice_s == pytest.approx(0.25 * 29 * result.best.predicted_iteration_s)
    settled, _ = _calibrate(short, pipeline, workflow.layout_of(result.best))
    assert len(settled.measurements[0].iterations) == iterations_for(seconds, short.choice_s, short.choice_n) < len(first.iterations)
    # iterations far shorter than the full ones the run's seconds are predicted in (a young GRPO
    # policy's): a quarter of the run's iterations, then as any plan (about MEASURE_S seconds)
    young = Calibrator(workflow, share=0.5)
    young.start(result, profile, iterations_left=30)
    quick = Pipeline(workflow, profile, {}, runtime_s=0.0)
    quick.iteration_s = lambda plan: 0.45  # 9 make MEASURE_S; 8 are a quarter of the run
    settled, _ = _calibrate(young, quick, workflow.layout_of(result.best))
    assert young.choice_n == 8 and len(settled.measurements[0].iterations) == iterations_for(0.45) == 9
    assert iterations_for(0.45, young.choice_s, CHOICE_MAX_ITERATIONS) > 9  # the seconds alone would ask for more


class GrowingEpisodes(Pipeline):
    """Episodic (GRPO) iterations that end early and grow as the policy learns: iteration i takes
    ``min(T, 2 + i // 4)`` decisions per chunk and trains on those of its 8 envs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.iteration = 0

    def shape(self, iteration: int | None = None) -> dict:
        """Iteration ``iteration``'s (default: the current one's) decisions and samples."""
        decisions = min(16, 2 + (self.iteration if iteration is None else iteration) // 4)
        return {"rollout/decisions": float(decisions), "charts/samples": 8 * decisions}

    def iteration_s(self, plan: Plan, shape: dict | None = None) -> float:
        seconds, _ = predict(plan, rescale(self.profile, self.factors(plan)), self.workflow.macro_flow(shape),
                             self.workflow.resources())
        return seconds + self.runtime_s

    def run(self, layout: Layout) -> dict:
        self.iteration += 1
        shape = self.shape()
        unit = self.workflow.measured_factors(self.profile, layout, {**{key: 1.0 for key in METRIC.values()}, **shape})
        metrics = {METRIC[c]: self.factors(layout.plan).get(c, 1.0) / unit[c] for c in METRIC}
        return {**metrics, **shape, "time/iteration_s": self.iteration_s(layout.plan, shape)}


def test_episodic_iterations_that_grow_are_measured_as_full_ones():
    """A young GRPO policy's iterations end early and lengthen from one iteration to the next: the
    calls are counted as they were made (the factors come out exact) and a plan's iterations are
    measured as the full iterations they stand for, so plans measured at different episode lengths
    compare (a plan measured on the shortest iterations is not taken for the fastest)."""
    workflow, profile = _workflow("algo.name=grpo", "algo.group_size=4"), _profile()
    pipeline = GrowingEpisodes(workflow, profile, {"colocated": {"rollout": 3.0, "env": 1.2}}, runtime_s=0.0)
    _, result, _, _, settled, runs = _settled(pipeline)
    truth = {p.key(): pipeline.iteration_s(p) for p, _ in result.candidates}
    assert truth[settled.plan.key()] == pytest.approx(min(truth.values()))
    for m in settled.measurements:
        expected = pipeline.factors(m.plan)
        assert m.factors == pytest.approx({c: expected.get(c, 1.0) for c in METRIC})
        # the iterations measured took 2-13 of 16 decisions, most well under half a full one's time ...
        ran = [pipeline.iteration_s(m.plan, pipeline.shape(i)) for i in m.iterations]
        assert statistics.median(ran) < 0.5 * truth[m.plan.key()] and max(ran) < truth[m.plan.key()]
        # they were measured for about MEASURE_S seconds of what they took, not of what they stand for
        assert sum(ran) >= MEASURE_S or len(m.iterations) == MAX_ITERATIONS
        # ... and count as the full iteration (up to how the factors shift the shape's share)
        assert m.iteration_s == pytest.approx(truth[m.plan.key()], rel=0.1)
    assert settled.plan.predicted_iteration_s == pytest.approx(truth[settled.plan.key()], rel=0.1)
    short = {"rollout/decisions": 4.0, "charts/samples": 32}
    assert 0 < workflow.shape_scale(settled.plan, profile, short) < 0.5
    assert workflow.shape_scale(settled.plan, profile, {"rollout/decisions": 16.0, "charts/samples": 128}) == 1.0


def test_a_measurement_goes_on_while_its_iterations_spread():
    """Two iterations 5.7 and 8.2 s apart (a host whose speed drifts) do not
    pin the plan's time down: calibration measures more, until their median is known to
    TARGET_RSE, the budget runs out or MAX_ITERATIONS are measured; one outlier among steady
    iterations does not hold it up."""
    u = MEASURE_S / 2  # iterations of u seconds: three take longer than MEASURE_S
    assert measured_enough([u, 1.01 * u, u], budget_left=5)  # steady: three are enough
    # two that agree may have agreed by chance: their spread is judged from three
    assert not measured_enough([u, 1.01 * u], budget_left=5) and measured_enough([u, 1.01 * u], budget_left=0)
    assert not measured_enough([5.66, 8.23], budget_left=5)
    assert relative_standard_error([5.66, 8.23]) > TARGET_RSE
    steadier = [5.66, 8.23, 7.0, 6.9, 7.1, 7.05, 6.95, 7.0, 7.02]
    assert relative_standard_error(steadier) < TARGET_RSE and measured_enough(steadier, budget_left=1)
    assert measured_enough([5.66, 8.23], budget_left=0)  # out of budget: what there is
    assert measured_enough([1.0, 2.0] * (MAX_ITERATIONS // 2), budget_left=5)  # at most MAX_ITERATIONS
    assert not measured_enough([0.1, 0.1], budget_left=5)  # still under MEASURE_S seconds
    # episodic iterations that ended early, counted as the full ones they stand for: what they took counts
    assert not measured_enough([0.7, 0.7], budget_left=5, wall_s=0.26)
    assert not measured_enough([0.35 * u] * 4, budget_left=5, wall_s=0.9 * MEASURE_S) and sum([0.7 * u] * 4) > MEASURE_S
    assert measured_enough([0.7 * u] * 4, budget_left=5, wall_s=MEASURE_S)
    assert not measured_enough([3.0, 3.0], budget_left=5) and measured_enough([3.0, 3.0, 3.0], budget_left=5)


class NoisyPipeline(Pipeline):
    """Every iteration 0-60% slower, at random: a host whose speed jumps between iterations."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng = random.Random(0)

    def run(self, layout: Layout) -> dict:
        metrics = super().run(layout)
        metrics["time/iteration_s"] *= 1 + 0.6 * self.rng.random()
        return metrics


def test_a_noisy_host_gets_longer_measurements_within_the_budget():
    workflow, profile = _workflow(), _profile()
    noisy = NoisyPipeline(workflow, profile, {}, runtime_s=0.02)
    _, result, _, calibrator, settled, runs = _settled(noisy, share=0.5, iterations_left=100)
    first = settled.measurements[0]
    window = (calibrator.choice_s, calibrator.choice_n)  # the planner's choice: measured longer (free)
    assert len(first.iterations) > iterations_for(first.iteration_s, *window)  # more than the window alone asks for
    assert calibrator.spent <= calibrator.budget
    steady = Pipeline(workflow, profile, {}, runtime_s=0.02)
    *_, quiet, _ = _settled(steady, share=0.5, iterations_left=100)
    assert len(quiet.measurements[0].iterations) == iterations_for(quiet.measurements[0].iteration_s, *window)


def test_the_runtime_residual_is_paid_per_iteration_however_early_it_ended():
    """The pipeline spends 0.05 s of its own every iteration (driver calls, weight sync, metrics),
    whatever the iteration's length. Calibration measures a young policy's short iterations: their
    residual is that 0.05 s, not 0.05 s over the share of a full iteration they are, and the
    settled plan predicts a full iteration and every shorter one as the pipeline runs them."""
    workflow, profile = _workflow("algo.name=grpo", "algo.group_size=4"), _profile()
    pipeline = GrowingEpisodes(workflow, profile, {"colocated": {"rollout": 3.0, "env": 1.2}}, runtime_s=0.05)
    _, result, _, calibrator, settled, _ = _settled(pipeline)
    for m in settled.measurements:
        assert m.residual_s == pytest.approx(0.05)
        assert m.iteration_s == pytest.approx(pipeline.iteration_s(m.plan))
    plan = settled.plan
    assert plan.predicted_iteration_s == pytest.approx(pipeline.iteration_s(plan))
    # the run prices each iteration as it ran on the profile calibration settled on
    for decisions in (3, 8, 16):
        shape = {"rollout/decisions": float(decisions), "charts/samples": 8 * decisions}
        assert workflow.predicted_as_ran(plan, settled.profile, shape) == pytest.approx(pipeline.iteration_s(plan, shape))
    # every candidate of a measured mode, priced with its correction, at every iteration's shape
    measured_modes = {m.plan.mode for m in settled.measurements}
    shape = {"rollout/decisions": 5.0, "charts/samples": 40}
    for candidate, seconds in settled.predictions:
        if candidate.mode in measured_modes:
            factors, residual = calibrator.correction(candidate)
            assert residual == pytest.approx(0.05)
            priced = dataclasses.replace(candidate, predicted_iteration_s=seconds)
            assert workflow.predicted_as_ran(priced, rescale(profile, factors), shape) == pytest.approx(
                pipeline.iteration_s(candidate, shape))
    # counted as a share of a full iteration instead, the 3-decision iteration's residual
    # would have weighed in the full one's prediction several times over
    short = {"rollout/decisions": 3.0, "charts/samples": 24}
    proportional = pipeline.iteration_s(plan, short) / workflow.shape_scale(plan, settled.profile, short)
    assert proportional > plan.predicted_iteration_s + 0.05


class DriftingPipeline(Pipeline):
    """Every iteration ``growth`` dearer than the one before, under every plan alike (a policy
    that learns to push the cube makes its simulation dearer per step; a host that
    slows): iteration i runs at ``pace(i) = 1 + growth * i`` times the plan's time."""

    def __init__(self, *args, growth: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.growth, self.iteration = growth, 0

    def pace(self, iteration: float) -> float:
        return 1 + self.growth * iteration

    def run(self, layout: Layout) -> dict:
        self.iteration += 1
        return {key: seconds * self.pace(self.iteration) for key, seconds in super().run(layout).items()}


def test_the_choice_is_measured_again_last_and_the_others_compared_at_its_pace():
    """The run's iterations grow 1% dearer each. The planner's choice (hybrid, 2 chunks) is
    measured first; colocated, truly 5% faster, is measured after it and on the dearer iterations
    of later looks slower than the choice did. Calibration measures the choice again after the
    others (free while it looks the fastest: the run would switch back to it anyway), prices every
    plan measured between at the pace of the run now (its time over the choice's where it ran) and
    settles on the truly fastest, priced for the run's latest iterations."""
    workflow, profile = _workflow("cluster.backend=local"), _profile()
    result = workflow.plan(profile)
    pipeline = DriftingPipeline(workflow, profile, {"colocated": {"env": 0.9}}, runtime_s=0.0, growth=0.01)
    calibrator = Calibrator(workflow, share=0.5)
    calibrator.start(result, profile, iterations_left=1000)
    settled, runs = _calibrate(calibrator, pipeline, workflow.layout_of(result.best))
    truth = {p.key(): pipeline.iteration_s(p) for p, _ in result.candidates}
    fastest = min(truth, key=truth.get)
    assert fastest != result.best.key()
    first, *between, again = settled.measurements
    assert first.plan.key() == again.plan.key() == result.best.key() != settled.plan.key() == fastest
    colocated = next(m for m in between if m.plan.key() == fastest)
    assert colocated.iteration_s > first.iteration_s  # as measured, later on the run: slower than the choice
    assert again.iteration_s > colocated.iteration_s  # ... and the choice itself, measured later still
    # every measurement is exact at the pace of the run where its window ran
    for m in settled.measurements:
        assert m.iteration_s == pytest.approx(truth[m.plan.key()] * pipeline.pace(m.middle()))
    # the settled plan priced at the pace of the run's latest iterations, every other measured one too
    assert settled.plan.predicted_iteration_s == pytest.approx(truth[fastest] * pipeline.pace(again.middle()))
    prices = dict((p.key(), s) for p, s in settled.predictions)
    for m in between:
        assert prices[m.plan.key()] == pytest.approx(truth[m.plan.key()] * pipeline.pace(again.middle()))
    assert "measured again last" in settled.reason
    # the prediction is the settled plan's price as compared, exactly, and so is every measured
    # plan's price among the candidates' (what a sweep reports a plan as predicted at)
    assert settled.plan.predicted_iteration_s == min(m.iteration_s for m in settled.compared)
    assert all(prices[m.plan.key()] == m.iteration_s for m in settled.compared)
    # the re-measurement cost the budget nothing: only the plans between spent it
    assert calibrator.spent == sum(len(m.iterations) for m in between) == sum(p.key() != result.best.key() for p in runs)


def test_calibration_moves_through_its_phases_in_order():
    """Off until started; then the warm-up iteration, the planner's choice, the candidates that may
    beat it, the choice again, and settled, where it stays; each phase change but the warm-up's
    hands the runner a layout, the choice's phases the choice's."""
    workflow, profile = _workflow("cluster.backend=local"), _profile()
    result = workflow.plan(profile)
    pipeline = DriftingPipeline(workflow, profile, {"colocated": {"env": 0.9}}, runtime_s=0.0, growth=0.01)
    calibrator = Calibrator(workflow, share=0.5)
    assert calibrator.phase is Phase.OFF and not calibrator.active
    calibrator.start(result, profile, iterations_left=1000)
    assert calibrator.phase is Phase.WARM_UP and calibrator.active
    phases, layout = [Phase.WARM_UP], workflow.layout_of(result.best)
    for iteration in range(1, 1000):
        step = calibrator.observe(iteration, pipeline.run(layout), layout)
        if calibrator.phase is not phases[-1]:
            phases.append(calibrator.phase)
            assert (step is None) == (phases[-2] is Phase.WARM_UP)
        if step is not None:
            layout = step.layout
            if calibrator.phase in (Phase.CHOICE, Phase.AGAIN):
                assert layout.plan.key() == result.best.key()
        if calibrator.phase is Phase.SETTLED:
            assert step is not None and step.settled is not None and not calibrator.active
            break
    assert phases[:2] == [Phase.WARM_UP, Phase.CHOICE] and phases[-2:] == [Phase.AGAIN, Phase.SETTLED]
    assert set(phases[2:-2]) == {Phase.CANDIDATE}
    assert calibrator.observe(iteration + 1, pipeline.run(layout), layout) is None and calibrator.phase is Phase.SETTLED


def test_a_plan_that_looks_faster_only_because_the_run_sped_up_is_not_chosen():
    """The run's iterations grow 0.4% cheaper each (the host speeding up). Hybrid with one chunk,
    truly slower than the planner's choice (hybrid, two chunks), is measured after it and looks
    faster. The choice is measured again last, now as one more candidate (it was not the fastest
    measured: the budget pays), and at one pace the choice is the faster: the run settles on it,
    priced for its latest iterations."""
    workflow, profile = _workflow("cluster.backend=local"), _profile()
    result = workflow.plan(profile)
    pipeline = DriftingPipeline(workflow, profile, {}, runtime_s=0.0, growth=-0.004)
    calibrator = Calibrator(workflow, share=0.5)
    calibrator.start(result, profile, iterations_left=1000)
    settled, runs = _calibrate(calibrator, pipeline, workflow.layout_of(result.best))
    truth = {p.key(): pipeline.iteration_s(p) for p, _ in result.candidates}
    first, *between, again = settled.measurements
    assert first.plan.key() == again.plan.key() == result.best.key() == settled.plan.key() == min(truth, key=truth.get)
    fooled = [m for m in between if m.iteration_s < first.iteration_s]
    assert fooled and all(truth[m.plan.key()] > truth[result.best.key()] for m in fooled)
    assert len(again.iterations) == iterations_for(again.iteration_s)  # measured as any candidate ...
    assert calibrator.spent == sum(len(m.iterations) for m in (*between, again)) <= calibrator.budget  # ... on the budget
    assert settled.plan.predicted_iteration_s == pytest.approx(truth[result.best.key()] * pipeline.pace(again.middle()))
    prices = dict((p.key(), s) for p, s in settled.predictions)
    for m in between:
        assert prices[m.plan.key()] == pytest.approx(truth[m.plan.key()] * pipeline.pace(again.middle()))
