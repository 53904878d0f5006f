"""The Runner owns a run; a Workflow owns its workers and one iteration.

    Runner(cfg, run_dir, workflow).run()

The run, in order: seed; open the metrics sinks (``metrics.jsonl``, TensorBoard, wandb); start the
cluster; profile and plan (``plan.json``, ``profile.json``); build the workflow's workers on the
plan's layout; continue from the latest checkpoint on ``resume=``; then iterate until the budget is
spent, with progress, metrics, evaluation every ``eval.every`` iterations, calibration of the plan
over the first iterations (:mod:`pipelines.calibrate`), re-planning on drift
(:mod:`pipelines.replan`) and checkpoints every ``checkpoint.every``; finally a checkpoint, the
final evaluation (with its video) and ``summary.json``.

A first Ctrl-C (SIGINT), SIGTERM or SIGHUP (the terminal closed) while iterating stops the run
after the current iteration: a checkpoint and ``summary.json`` are written, every process the run
started is stopped, and the run ends with ``KeyboardInterrupt`` (exit code 130) or ``Terminated``
(143, 129); a second one, or one while the run starts or runs its final evaluation, aborts at once
(:class:`GracefulStop`).

``resume=`` of a run with no checkpoint yet (it failed before its first one) starts it again from
its beginning in the same run dir, its earlier metrics dropped.
"""

from __future__ import annotations

import _thread
import json
import logging
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.checkpoint import iteration_of, latest_checkpoint, load_checkpoint, save_checkpoint
from embodied.config import to_dict
from embodied.errors import FailureContext, Terminated
from embodied.metrics import MetricsLogger, ResumePoint, read_metrics
from embodied.progress import Progress
from embodied.rl import ZeroSignalMonitor
from embodied.runtime import Cluster
from embodied.seeding import seed_everything
from pipelines.calibrate import Calibrated, Calibrator
from pipelines.learn import CostLearner, describe_provenance
from pipelines.replan import Replanner
from pipelines.rundir import RunDir, has_checkpoint
from pipelines.workflow import Layout, Workflow
from scheduler import PlanResult, Profile

LOG = logging.getLogger("embodied")


#: An iteration's share of GRPO groups whose rewards are all equal (the embodied and the reasoning
#: workflow's names): at 1.0 the iteration's update does nothing.
ZERO_SPREAD_METRICS = ("grpo/frac_reward_zero_std", "reward/frac_reward_zero_std")

#: The signals that stop a run: Ctrl-C, a scheduler's or ``kill``'s SIGTERM, the terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class GracefulStop:
    """A run's handling of :data:`STOP_SIGNALS` (a context manager; main thread only, a no-op
    elsewhere; the previous handlers and wakeup fd come back on exit).

    Every arrival counts. Python runs a signal's handler once for however many arrivals came
    before the main thread got to it, and a driver waiting in ``ray.wait`` gets to it only about
    once a second, so two Ctrl-Cs 0.2 s apart would be one. The arrivals are therefore read from
    Python's signal wakeup fd (one byte per arrival, written by the C-level handler) by a thread:
    the first one while the runner iterates (:attr:`Runner.stopping_allowed`) sets
    :attr:`Runner.stop_signal` and says so on the terminal at once; a second one, or a first one
    while the run starts or evaluates at the end, makes the main thread raise
    ``KeyboardInterrupt`` (SIGINT) or ``Terminated`` (128 + signal) at its next check, within a
    second in ``ray.wait`` and at once elsewhere. It raises once: cleanup is not interrupted by
    more signals.

    A closed terminal sends SIGHUP to the whole process group, the run's Ray processes, workers and
    env processes with it, which it would kill on the spot. The main thread therefore blocks
    SIGHUP while the run lives: every process it starts (Ray's, and through them the workers and
    their env processes; the driver's env processes) inherits the blocked signal, and the driver's
    SIGHUP is taken by the watcher thread, the one thread that leaves it unblocked."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.saved: dict[int, Any] = {}
        self.abort: int | None = None  # the signal that aborts the run, once decided
        self.raised = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        for sig in STOP_SIGNALS:
            self.saved[sig] = signal.signal(sig, self.handle)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="embodied-signals", daemon=True)
        self._thread.start()  # before the main thread blocks SIGHUP: it keeps it unblocked
        self._previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        return self

    def _watch(self) -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        while True:
            try:
                data = self._reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._arrived(signum)

    def _arrived(self, signum: int) -> None:
        runner, name = self.runner, signal.Signals(signum).name
        with self._lock:
            if self.abort is not None:  # aborting already (or this is the echo of our own interrupt)
                return
            if runner.stop_signal is None and runner.stopping_allowed:
                runner.stop_signal = signum
                LOG.info(f"[embodied] {name}: stopping after the current iteration (a checkpoint and summary.json "
                         "are written); send it again to abort at once")
                return
            self.abort = signum
        LOG.info(f"[embodied] {name}: aborting now")
        _thread.interrupt_main(signum)  # the main thread runs handle() at its next check

    def handle(self, signum: int, frame: Any) -> None:
        """The Python-level handler: raises once the watcher decided to abort. (A first signal
        runs it too, before or after the watcher has read it: then it does nothing.)"""
        if self.abort is not None and not self.raised:
            self.raised = True
            raise KeyboardInterrupt if self.abort == signal.SIGINT else Terminated(self.abort)

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        signal.pthread_sigmask(signal.SIG_SETMASK, self._previous_mask)
        signal.set_wakeup_fd(self._previous_fd)
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        self._writer.close()  # the watcher reads the end of the stream and returns
        self._thread.join(timeout=2.0)
        self._reader.close()


def _profile_log(line: str) -> None:
    """A run's ``log`` for profiling: progress lines (``[m2flow] ...``) on the terminal, the probes'
    measurements (indented lines) in the run's log only."""
    (LOG.debug if line.startswith(" ") else LOG.info)(line)


class Runner:
    """Runs ``workflow`` under ``cfg`` into ``run`` (None: no files, e.g. a benchmark)."""

    def __init__(self, cfg: Any, run: RunDir | None, workflow: Workflow) -> None:
        self.cfg = cfg
        self.run_dir = run
        self.workflow = workflow
        self.iteration = 0
        self.steps = 0
        self.wall_s_before = 0.0
        self.profile: Profile | None = None
        self.layout: Layout | None = None
        self.replanner = Replanner(workflow, cfg.plan.replan_threshold)
        self.calibrator = Calibrator(workflow, cfg.plan.calibrate, cfg.plan.calibrate_margin)
        self.calibrated: Calibrated | None = None
        self.planned: PlanResult | None = None  # the planner's first result (its candidates go to plan.json)
        self.learner = CostLearner(workflow, cfg.plan.learn, str(run.path) if run is not None else "?")
        self.zero_signal = ZeroSignalMonitor(unit="iteration")
        self.doing = "starting"  # what the run is doing, for failure messages
        self.stop_signal: int | None = None  # a first Ctrl-C / SIGTERM / SIGHUP: stop after this iteration
        self.stopping_allowed = False  # whether a first signal stops after the iteration (else: abort)

    # --- setup -------------------------------------------------------------------------------------
    def plan(self, cluster: Cluster) -> PlanResult | None:
        """Profile (cached) and plan; sets :attr:`layout`. Returns the planner's result (None when
        ``plan.profile=false`` or the workflow has no cost model: every worker on every core,
        ``plan.chunks`` as given)."""
        cfg = self.cfg
        if not cfg.plan.profile or not self.workflow.has_cost_model():
            self.layout = self.workflow.unplanned_layout()
            return None
        self.workflow.machine(cluster)  # the devices the plan is made for (every node's, on a cluster)
        self.profile = self.workflow.profile(cluster, force=cfg.plan.reprofile, log=_profile_log)
        self.learner.start(self.profile)
        LOG.debug(f"[m2flow] {describe_provenance(self.profile)}")
        result = self.workflow.plan(self.profile)
        self.planned = result
        self.layout = self.workflow.layout_of(result.best)
        LOG.debug("[m2flow] candidate plans (predicted seconds per iteration):\n" + result.format_table(limit=8))
        bound = f"; no plan below {result.bound.iteration_s:.3f} s" if result.bound is not None else ""
        left = max(0, self.workflow.total_steps - self.steps) // max(1, self.workflow.steps_per_iteration)
        self.calibrator.start(result, self.profile, left)
        calibrating = (f"; calibrating: the first iterations measure it and the candidates that may beat it "
                       f"(up to {self.calibrator.budget} iterations)") if self.calibrator.active else ""
        LOG.info(f"[m2flow] chosen: {result.best.mode}, {result.best.num_chunks} chunk(s), "
                 f"predicted {result.best.predicted_iteration_s:.3f} s/iteration{bound}{calibrating}")
        return result

    def start(self, cluster: Cluster) -> PlanResult | None:
        """Plan and build the workflow's workers (what a benchmark or test needs before iterating)."""
        result = self.plan(cluster)
        assert self.layout is not None
        LOG.info("[embodied] starting the workers (their processes, envs and models) ...")
        t0 = time.perf_counter()
        self.workflow.build(cluster, self.layout, self.profile)
        LOG.info(f"[embodied] workers started in {time.perf_counter() - t0:.0f}s")
        return result

    def read_checkpoint(self) -> tuple[dict[str, Any], ResumePoint]:
        """The checkpoint ``resume=`` continues from (the latest intact one with
        ``resume_fallback=true``) and the point the metrics continue from."""
        assert self.run_dir is not None
        model, optimizer, state = load_checkpoint(self.run_dir.path, fallback=self.cfg.resume_fallback)
        generator = state.get("generator")
        trainer = {"model": model, "optimizer": optimizer, "version": state["version"],
                   "generator": None if generator is None else torch.tensor(generator, dtype=torch.uint8)}
        self.iteration = int(state["iteration"])
        self.steps = int(state["env_steps"])
        self.wall_s_before = float(state.get("wall_s", 0.0))
        self.resumed_from = state["path"]
        return trainer, ResumePoint(self.iteration, self.steps)

    # --- the run loop ------------------------------------------------------------------------------
    def lr(self) -> float:
        """The learning rate of the next iteration (decayed linearly with ``algo.anneal_lr``)."""
        algo = self.cfg.algo
        if not algo.anneal_lr:
            return algo.lr
        return algo.lr * max(0.0, 1.0 - self.steps / self.workflow.total_steps)

    def done(self) -> bool:
        """Whether the budget is spent (whole iterations: the last one may go past it)."""
        return self.steps >= self.workflow.total_steps

    def step(self) -> dict[str, Any]:
        """One iteration of the workflow, counted; returns its metrics (``iteration``, ``env_steps``)."""
        last = self.steps + self.workflow.steps_per_iteration >= self.workflow.total_steps
        metrics = self.workflow.iterate(self.iteration, self.lr(), last)
        self.steps += int(metrics.pop("steps"))
        self.iteration += 1
        spread = next((metrics[k] for k in ZERO_SPREAD_METRICS if metrics.get(k) is not None), None)
        warning = self.zero_signal.observe(float(spread)) if spread is not None else None
        if warning is not None:  # the trainer's own warning reaches only its log on Ray
            LOG.warning(f"[grpo] {warning}")
        return {"iteration": self.iteration, "env_steps": self.steps, **metrics}

    def run(self) -> dict[str, Any]:
        """The whole run (see the module docstring); returns the summary. A stop requested by a
        signal ends it with ``KeyboardInterrupt`` / ``Terminated`` after the checkpoint and summary."""
        cfg, run = self.cfg, self.run_dir
        assert run is not None, "Runner.run() writes a run dir"
        seed_everything(cfg.seed)
        trainer_state, resume_point = None, None
        if cfg.resume is not None:  # without a checkpoint: again from the beginning, the old rows dropped
            trainer_state, resume_point = self.read_checkpoint() if has_checkpoint(run.path) else (None, ResumePoint(0, 0))
        logger = MetricsLogger(
            run.path, to_dict(cfg), cfg.logging.tensorboard, cfg.logging.wandb,
            cfg.logging.wandb_project, cfg.logging.wandb_mode, resume=cfg.resume is not None, resume_from=resume_point,
        )
        progress = None
        cluster = None
        try:
            with self.graceful_stop():
                self.doing = "starting the cluster"
                cluster = Cluster(cfg.cluster, run_dir=run.path)
                self.doing = "profiling and planning"
                self.start(cluster)
                self.save_plan()
                if trainer_state is not None:
                    self.workflow.load_trainer_state(trainer_state)
                    LOG.info(f"[embodied] resumed from {self.resumed_from} at iteration {self.iteration}, {self.steps:,} env steps")
                rows = read_metrics(run.path)  # a resumed run's iterations so far
                rate_key = self.workflow.throughput_metric  # the rate summary.json reports, also on the bar
                progress = Progress(self.workflow.total_steps, cfg.logging.progress, cfg.run.log_every_s, self.steps,
                                    unit=self.workflow.unit, shown=self.workflow.headline, rate_key=rate_key,
                                    rates=[r[rate_key] for r in rows if r.get(rate_key)])
                t_start = time.perf_counter()
                # a resumed run with nothing left to do still reports its last iteration's numbers
                last: dict[str, Any] = dict(rows[-1]) if rows else {}
                self.stopping_allowed = True
                while not self.done() and self.stop_signal is None:
                    self.doing = f"running iteration {self.iteration + 1}"
                    metrics = self.step()
                    metrics["wall_s"] = self.wall_s_before + time.perf_counter() - t_start
                    if cfg.eval.every and self.iteration % cfg.eval.every == 0 and not self.done():
                        self.doing = f"evaluating after iteration {self.iteration}"
                        metrics.update(self.workflow.evaluate(video_dir=None))
                    self.learn(metrics)
                    self.calibrate(metrics)
                    self.watch_plan(metrics)
                    logger.log(metrics, step=self.steps)
                    progress.update(self.steps, metrics)
                    last = metrics
                    if cfg.checkpoint.every and self.iteration % cfg.checkpoint.every == 0:
                        self.checkpoint(metrics["wall_s"])
                self.doing = "training on the last batch"
                self.workflow.drain(self.lr())  # a batch still waiting for training (staleness 1)
                self.learn(None)
                progress.close()
                progress = None
                wall_s = self.wall_s_before + time.perf_counter() - t_start
                self.checkpoint(wall_s)
                self.stopping_allowed = False  # a signal now ends the final evaluation at once
                final_eval = {} if self.stop_signal is not None else self.final_evaluation()
                summary = self.summary(last, wall_s, final_eval)
                logger.summary(summary)
            if self.stop_signal is not None:
                self.doing = f"stopping after iteration {self.iteration} on {signal.Signals(self.stop_signal).name}"
                raise KeyboardInterrupt if self.stop_signal == signal.SIGINT else Terminated(self.stop_signal)
            return summary
        finally:
            if progress is not None:
                progress.close()
            logger.close()
            self.workflow.close()
            if cluster is not None:
                cluster.shutdown()

    def summary(self, last: dict[str, Any], wall_s: float, final_eval: dict[str, Any]) -> dict[str, Any]:
        """``summary.json``: the run's size and time, the ``last`` iteration's headline metrics,
        the mean throughput and the final evaluation; marked interrupted when a signal ended it."""
        summary = {
            "recipe": self.cfg.recipe,
            "iterations": self.iteration,
            "env_steps": self.steps,
            "wall_s": wall_s,
            **{key: last.get(key) for _, key in self.workflow.headline},
            self.workflow.throughput_metric: self.mean_throughput(),
            **final_eval,
        }
        if self.stop_signal is not None:
            summary["interrupted"] = signal.Signals(self.stop_signal).name
        return summary

    def final_evaluation(self) -> dict[str, Any]:
        """The final evaluation's metrics; {} when a signal ended it (:attr:`stop_signal` set:
        the summary is still written, marked interrupted)."""
        try:
            self.doing = "evaluating the final policy"
            video = self.run_dir.path / "videos" if getattr(self.cfg.eval, "video", False) and self.run_dir is not None else None
            return self.workflow.evaluate(video_dir=video)
        except KeyboardInterrupt:
            self.stop_signal = signal.SIGINT
        except Terminated as stop:
            self.stop_signal = stop.signum
        LOG.info("[embodied] the final evaluation was stopped; summary.json is written without it")
        return {}

    def graceful_stop(self) -> GracefulStop:
        """Within the block, a first SIGINT, SIGTERM or SIGHUP while iterating asks the run to stop
        after the current iteration (:attr:`stop_signal`); a second one, or a first one while the
        run starts or evaluates at the end, aborts at once (``KeyboardInterrupt`` / ``Terminated``).
        See :class:`GracefulStop`."""
        return GracefulStop(self)

    def failure_context(self) -> FailureContext:
        """What the failure paragraph needs: what the run was doing, its last checkpoint, how to resume."""
        run_dir = self.run_dir.path if self.run_dir is not None else None
        ckpt = latest_checkpoint(run_dir) if run_dir is not None else None
        return FailureContext(doing=self.doing, run_dir=run_dir, checkpoint=ckpt,
                              checkpoint_iteration=iteration_of(ckpt) if ckpt is not None else None)

    def learn(self, metrics: dict[str, Any] | None) -> None:
        """Refine the cached profile from this run's measured costs (:mod:`pipelines.learn`):
        after the first iterations (``metrics`` of the iteration just run), or at the end of a
        short run (``metrics`` None)."""
        if self.layout is None:
            return
        learned = self.learner.observe(self.iteration, metrics, self.layout) if metrics is not None else self.learner.finish()
        if learned is not None:
            LOG.info(f"[m2flow] {learned.describe()}")
            if metrics is not None:
                metrics.update({f"plan/learned_{name}_factor": f for name, f in learned.factors.items()})

    @property
    def calibrating(self) -> bool:
        """Whether the run is still measuring candidate plans (:mod:`pipelines.calibrate`)."""
        return self.calibrator.active and self.layout is not None

    def calibrate(self, metrics: dict[str, Any]) -> None:
        """Calibration (see :mod:`pipelines.calibrate`): after the iteration just run, switch to
        the next candidate, or settle on the fastest measured plan and its corrected prediction."""
        if not self.calibrating:
            return
        assert self.layout is not None
        metrics["plan/calibrating"] = True
        step = self.calibrator.observe(self.iteration, metrics, self.layout)
        if step is None:
            return
        self.workflow.switch(step.layout, step.settled.profile if step.settled is not None else None)
        self.layout = step.layout
        if step.settled is not None:
            self.profile = step.settled.profile
            self.calibrated = step.settled
            LOG.info(f"[m2flow] {step.settled.reason}")
            metrics["plan/calibrated"] = step.settled.reason
            self.save_plan()

    def settle(self) -> int:
        """Run iterations until calibration settles on a plan (what a benchmark of the plan a run
        settles on does before it times it); returns the iterations run (0 when not calibrating)."""
        iterations = 0
        while self.calibrating:
            self.calibrate(self.step())
            iterations += 1
        return iterations

    def watch_plan(self, metrics: dict[str, Any]) -> None:
        """Re-plan when the measured iterations drift from the prediction (see :mod:`pipelines.replan`);
        not while calibrating (its iterations run other candidates on purpose)."""
        if self.profile is None or self.layout is None or metrics.get("plan/calibrating"):
            return
        outcome = self.replanner.observe(self.iteration, metrics, self.profile, self.layout)
        if outcome is None:
            return
        self.profile = outcome.profile
        self.workflow.switch(outcome.layout, outcome.profile)
        self.layout = outcome.layout
        if outcome.reason:
            LOG.info(f"[m2flow] {outcome.reason}")
            metrics["plan/replanned"] = outcome.reason
            self.save_plan()

    def save_plan(self) -> None:
        """Write the plan being executed (and the candidates the planner ranked, and what
        calibration measured) to ``plan.json``."""
        if self.run_dir is None or self.layout is None:
            return
        result = self.planned
        data: dict[str, Any] = {"plan": self.layout.plan.to_dict(), "planned": self.profile is not None,
                                "layout": self.layout.to_dict(), "workers": self.workflow.locations()}
        if self.calibrated is not None:
            data["calibration"] = self.calibrated.to_dict()
        if result is not None:
            data["candidates"] = [
                {"mode": m, "chunks": k, "placement": p, "predicted_s": t, "mean_utilization": u} for m, k, p, t, u in result.table()
            ]
            if result.bound is not None:
                data["bound"] = result.bound.to_dict()
        if self.profile is not None:
            data["workflow"] = self.workflow.macro_flow().to_dict()
            (self.run_dir.path / "profile.json").write_text(json.dumps(self.profile.to_dict(), indent=2))
        (self.run_dir.path / "plan.json").write_text(json.dumps(data, indent=2))

    def mean_throughput(self) -> float | None:
        """Mean of the workflow's throughput metric (env steps/s) over every iteration of the run
        (resumed ones included)."""
        assert self.run_dir is not None
        key = self.workflow.throughput_metric
        rates = [r[key] for r in read_metrics(self.run_dir.path) if r.get(key)]
        return float(np.mean(rates)) if rates else None

    def checkpoint(self, wall_s: float) -> Path | None:
        """Save the workflow's state as the checkpoint of this iteration (None: the workflow keeps
        no state, :meth:`Workflow.trainer_state`)."""
        assert self.run_dir is not None
        self.doing = f"saving the checkpoint of iteration {self.iteration}"
        state = self.workflow.trainer_state()
        if state is None:
            return None
        generator = state.get("generator")
        return save_checkpoint(
            self.run_dir.path / "checkpoints",
            self.iteration,
            state["model"],
            state["optimizer"],
            {"env_steps": self.steps, "version": state["version"], "wall_s": wall_s, "recipe": self.cfg.recipe,
             "generator": None if generator is None else generator.tolist()},
            keep=self.cfg.checkpoint.keep,
        )
