"""A Workflow owns its worker groups, channels and one iteration; the Runner owns the run.

    workflow = WORKFLOWS.get(cfg.workflow).build(cfg)   # embodied PPO/GRPO, reasoning GRPO, ...
    Runner(cfg, run_dir, workflow).run()

The Runner (``pipelines/runner.py``) drives every workflow the same way: profile and plan
(:meth:`Workflow.profile`, :meth:`Workflow.plan`), build the workers on a layout, then
:meth:`Workflow.iterate` until the budget is spent, with metrics, checkpoints
(:meth:`Workflow.trainer_state`), evaluation (:meth:`Workflow.evaluate`) and re-planning on drift
(:meth:`Workflow.measured_factors`). A new workflow implements these verbs and never copies the
run loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.progress import EPISODE_METRICS
from embodied.registry import Registry
from embodied.runtime import Cluster
from pipelines.layout import Layout, Machine
from scheduler import Plan, PlanResult, Profile, Resources, predict
from scheduler import MacroFlow

__all__ = ["WORKFLOWS", "Layout", "Machine", "Workflow", "WorkflowSpec", "cpu_resources", "schema_of"]


def cpu_resources(num_cpus: int | None) -> Resources:
    """This machine as planner devices: one device per CPU core the run may use."""
    return Machine.local_cpus(num_cpus).resources


class Workflow(ABC):
    """One macro flow. Subclasses set :attr:`components` and implement the abstract verbs."""

    #: the planner's component names, in flow order (``env``, ``rollout``, ``trainer``, ...)
    components: tuple[str, ...]
    #: the unit of ``steps_per_iteration`` in progress displays (``steps``, ``prompts``)
    unit: str = "steps"
    #: what the progress display and ``summary.json`` report of the last iteration: (label, metric key)
    headline: tuple[tuple[str, str], ...] = EPISODE_METRICS
    #: the per-iteration throughput metric whose run mean ``summary.json`` reports
    throughput_metric: str = "perf/env_steps_per_s"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.machine_: Machine | None = None
        self.layout: Layout | None = None  # what the workers run (set by build and apply)
        self.priced_on: Profile | None = None  # the profile the running plan's prediction is priced on
        # (plan key, planner workflow) -> (the profile it was priced on, predicted seconds)
        self._predictions: dict[tuple, tuple[Profile, float]] = {}

    def preflight(self) -> tuple[Any, ...]:
        """Check the config's inputs (files, models, envs) before a run dir is written; raise a
        UserError naming what to fix. Returns what :meth:`check_checkpoint` needs after the
        checkpoint (the embodied workflow: the env's spaces)."""
        return ()

    def describe(self) -> str:
        """One line on what an iteration does, for ``embodied plan``."""
        fields = self.macro_flow().to_dict()
        return ", ".join(f"{k}={v}" for k, v in fields.items() if v not in (0, None, False))

    # --- sizes -------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def steps_per_iteration(self) -> int:
        """Env steps (or samples) one iteration asks for."""

    @property
    @abstractmethod
    def total_steps(self) -> int:
        """The run's budget in the same unit."""

    # --- planning ----------------------------------------------------------------------------------
    def machine(self, cluster: Cluster | None = None) -> Machine:
        """The devices this workflow is planned on (kept from the first call that had the
        cluster): this machine's CPU cores by default."""
        if self.machine_ is None:
            if cluster is None:
                return Machine.local_cpus(self.cfg.cluster.num_cpus)
            self.machine_ = self.discover(cluster)
        return self.machine_

    def discover(self, cluster: Cluster) -> Machine:
        """The devices of ``cluster`` this workflow can use (default: this machine's CPU cores)."""
        return Machine.local_cpus(self.cfg.cluster.num_cpus)

    def resources(self) -> Resources:
        return self.machine().resources

    def ranks(self) -> dict[str, int]:
        """Ranks per component (default one each)."""
        return {c: 1 for c in self.components}

    def ranks_for(self, plan: Plan) -> dict[str, int]:
        """Ranks per component under ``plan`` (default: :meth:`ranks`; a plan may set some)."""
        return self.ranks()

    def layout_of(self, plan: Plan) -> Layout:
        """``plan`` laid out on this workflow's machine and ranks."""
        return Layout.of(plan, self.machine(), self.ranks_for(plan))

    @abstractmethod
    def macro_flow(self, metrics: dict[str, Any] | None = None) -> MacroFlow:
        """The macro flow as the planner sees it; with an iteration's ``metrics``, that iteration
        as it ran (an episodic iteration may end early)."""

    def shape_scale(self, plan: Plan, profile: Profile, metrics: dict[str, Any]) -> float:
        """The predicted seconds of the iteration ``metrics`` describe over those of a full one under
        ``plan`` (the simulations of both shapes, :meth:`macro_flow`): 1.0 unless the
        iteration ended early. A measured iteration divided by it is a full one's measurement."""
        shaped, full = self.macro_flow(metrics), self.macro_flow()
        if shaped == full:
            return 1.0
        return self._predicted_s(plan, profile, shaped) / self._predicted_s(plan, profile, full)

    def predicted_as_ran(self, plan: Plan, profile: Profile, metrics: dict[str, Any]) -> float:
        """``plan``'s predicted seconds for the iteration ``metrics`` describe: the simulation of
        that iteration's shape on ``profile`` (the one ``plan`` was priced on), plus what ``plan``'s
        prediction holds beyond the simulation of a full iteration (calibration's runtime residual:
        seconds every iteration pays, however early it ended; 0 for a plan priced by the planner).
        A full iteration: ``plan.predicted_iteration_s``."""
        shaped, full = self.macro_flow(metrics), self.macro_flow()
        if shaped == full:
            return plan.predicted_iteration_s
        beyond = plan.predicted_iteration_s - self._predicted_s(plan, profile, full)
        return self._predicted_s(plan, profile, shaped) + beyond

    def _predicted_s(self, plan: Plan, profile: Profile, workflow: MacroFlow) -> float:
        """``plan``'s simulated seconds for ``workflow`` on ``profile`` (cached: a long iteration's
        simulation is not free, and a run asks once per iteration)."""
        key = (plan.key(), workflow)
        hit = self._predictions.get(key)
        if hit is None or hit[0] is not profile:
            if len(self._predictions) > 256:
                self._predictions.clear()
            hit = self._predictions[key] = (profile, predict(plan, profile, workflow, self.resources())[0])
        return hit[1]

    @abstractmethod
    def profile(self, cluster: Cluster, force: bool, log: Callable[[str], None]) -> Profile:
        """Measure (or read from the cache) the components' costs on this machine."""

    @abstractmethod
    def plan(self, profile: Profile) -> PlanResult:
        """The planner's ranked candidates for this workflow (honouring ``plan.*`` overrides)."""

    def unplanned_layout(self) -> Layout:
        return Layout.unplanned(self.components, len(self.resources()), self.cfg.plan.chunks or 1, self.ranks())

    @abstractmethod
    def measured_factors(self, profile: Profile, layout: Layout, metrics: dict[str, Any]) -> dict[str, float]:
        """Measured / predicted seconds per component in one iteration's ``metrics`` (re-planning)."""

    # --- running -----------------------------------------------------------------------------------
    @abstractmethod
    def build(self, cluster: Cluster, layout: Layout, profile: Profile | None) -> None:
        """Create the worker groups and channels for ``layout``."""

    @abstractmethod
    def apply(self, layout: Layout) -> None:
        """Reconfigure the running workers for a new layout (between iterations)."""

    def switch(self, layout: Layout, profile: Profile | None = None) -> None:
        """Run ``layout`` from the next iteration: reconfigure the workers (:meth:`apply`) when its
        micro flow differs from the one running, else only take its plan's new prediction.
        ``profile``: the one that prediction was priced on (calibration's or re-planning's,
        rescaled by measured costs), for :meth:`predicted_as_ran`."""
        if profile is not None:
            self.priced_on = profile
        if self.layout is not None and self.layout.plan.key() == layout.plan.key():
            self.layout = layout
        else:
            self.apply(layout)

    @abstractmethod
    def iterate(self, iteration: int, lr: float, last: bool) -> dict[str, Any]:
        """One iteration; returns its metrics with ``steps`` (what it added to the budget).
        ``last``: no iteration follows (a workflow that overlaps training with the next
        collection trains on its last batch too)."""

    def drain(self, lr: float) -> None:
        """Train on anything collected but not yet trained on (the run is ending)."""

    @abstractmethod
    def trainer_state(self) -> dict[str, Any]:
        """What a checkpoint holds: ``model``, ``optimizer`` (tensors), ``version``, ..."""

    @abstractmethod
    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state."""

    @abstractmethod
    def check_checkpoint(self, checkpoint: Path, *spaces: Any) -> None:
        """Raise a UserError naming every difference when ``checkpoint`` does not fit the model
        this config builds (before a resume writes anything)."""

    @abstractmethod
    def evaluate(self, video_dir: Path | None) -> dict[str, Any]:
        """Evaluate the trainer's current weights (``eval/*`` metrics)."""

    def locations(self) -> dict[str, list[dict[str, Any]]]:
        """Where each rank of each worker group runs (``plan.json``'s ``workers``): host, Ray
        node id, pid. Empty before :meth:`build`."""
        return {}

    def close(self) -> None:
        """Release workers (the cluster's shutdown ends them anyway)."""


@dataclass(frozen=True)
class WorkflowSpec:
    """A registered workflow: its config schema and its class."""

    config: type
    workflow: Callable[[Any], Workflow]

    def build(self, cfg: Any) -> Workflow:
        return self.workflow(cfg)


WORKFLOWS: Registry[WorkflowSpec] = Registry("workflow")


def schema_of(data: dict[str, Any]) -> type:
    """The config class of a recipe's dict (its ``workflow`` key; ``embodied`` by default)."""
    import pipelines.onpolicy.workflow  # noqa: F401  (registers the built-in workflows)
    import pipelines.reasoning.workflow  # noqa: F401

    return WORKFLOWS.get(str(data.get("workflow", "embodied"))).config
