"""A Workflow owns its worker groups, channels and one iteration; the Runner owns the run.

    workflow = WORKFLOWS.get(cfg.workflow).build(cfg)   # embodied PPO/GRPO, reasoning GRPO, ...
    Runner(cfg, run_dir, workflow).run()

The Runner (``pipelines/runner.py``) drives every workflow the same way: profile and plan
(:meth:`Workflow.profile`, :meth:`Workflow.plan`), build the workers on a layout, then
:meth:`Workflow.iterate` until the budget is spent, with metrics, checkpoints
(:meth:`Workflow.trainer_state`), evaluation (:meth:`Workflow.evaluate`) and re-planning on drift
(:meth:`Workflow.measured_factors`). A new workflow implements these verbs and never copies the
run loop.

What a workflow must write, and what it may add:

* **required**: :attr:`~Workflow.steps_per_iteration`, :attr:`~Workflow.total_steps`,
  :meth:`~Workflow.build` and :meth:`~Workflow.iterate`. Such a workflow runs on a fixed layout
  (:meth:`Workflow.unplanned_layout`: every component on every core, ``plan.chunks`` chunks),
  writes no checkpoints and reports no evaluation.
* **state**: :meth:`~Workflow.trainer_state` and :meth:`~Workflow.load_trainer_state` (checkpoints
  and ``resume=``), :meth:`~Workflow.check_checkpoint` (a resume that does not fit fails before it
  writes); :meth:`~Workflow.evaluate` (``eval/*`` metrics).
* **a cost model** (planning): :meth:`~Workflow.macro_flow`, :meth:`~Workflow.profile`,
  :meth:`~Workflow.plan` and :meth:`~Workflow.measured_factors`, all four (a workflow that defines
  some of them is refused when its class is defined), and :meth:`~Workflow.apply` to switch the
  running workers to another layout. With them the Runner profiles, plans, calibrates and
  re-plans (:meth:`Workflow.has_cost_model`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.errors import UserError
from embodied.progress import EPISODE_METRICS
from embodied.registry import Registry
from embodied.runtime import Cluster
from pipelines.layout import Layout, Machine
from scheduler import Plan, PlanResult, Profile, Resources, predict
from scheduler import MacroFlow

__all__ = ["COST_MODEL", "WORKFLOWS", "Layout", "Machine", "Workflow", "WorkflowSpec", "cpu_resources", "schema_of"]

#: the methods of a workflow's cost model: a workflow plans when it defines all of them
COST_MODEL = ("macro_flow", "profile", "plan", "measured_factors")


def cpu_resources(num_cpus: int | None) -> Resources:
    """This machine as planner devices: one device per CPU core the run may use."""
    return Machine.local_cpus(num_cpus).resources


class Workflow(ABC):
    """One macro flow. Subclasses implement the abstract verbs (sizes, :meth:`build`,
    :meth:`iterate`) and add state, evaluation and a cost model where their runs need them (see
    the module docstring)."""

    #: the planner's component names, in flow order (``env``, ``rollout``, ``trainer``, ...)
    components: tuple[str, ...] = ()
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        defined = [name for name in COST_MODEL if getattr(cls, name) is not getattr(Workflow, name)]
        if defined and len(defined) < len(COST_MODEL):
            missing = [name for name in COST_MODEL if name not in defined]
            raise TypeError(f"{cls.__name__} defines {', '.join(defined)} but not {', '.join(missing)}: a cost model "
                            f"is all of {', '.join(COST_MODEL)} (or none of them: the workflow runs unplanned)")

    @classmethod
    def has_cost_model(cls) -> bool:
        """Whether the workflow can be planned: it defines every method of :data:`COST_MODEL`
        (else the Runner runs it on :meth:`unplanned_layout`, without profiling or re-planning)."""
        return all(getattr(cls, name) is not getattr(Workflow, name) for name in COST_MODEL)

    def _no_cost_model(self, method: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} has no cost model ({method} is one of "
                                   f"{', '.join(COST_MODEL)}): it runs unplanned, as every workflow does with plan.profile=false")

    def preflight(self) -> tuple[Any, ...]:
        """Check the config's inputs (files, models, envs) before a run dir is written; raise a
        UserError naming what to fix. Returns what :meth:`check_checkpoint` needs after the
        checkpoint (the embodied workflow: the env's spaces)."""
        return ()

    def describe(self) -> str:
        """One line on what an iteration does, for ``embodied plan``."""
        if not self.has_cost_model():
            return f"{self.steps_per_iteration} {self.unit} per iteration"
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

    def macro_flow(self, metrics: dict[str, Any] | None = None) -> MacroFlow:
        """The macro flow as the planner sees it; with an iteration's ``metrics``, that iteration
        as it ran (an episodic iteration may end early). Part of the cost model."""
        raise self._no_cost_model("macro_flow")

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

    def profile(self, cluster: Cluster, force: bool, log: Callable[[str], None]) -> Profile:
        """Measure (or read from the cache) the components' costs on this machine. Part of the
        cost model."""
        raise self._no_cost_model("profile")

    def plan(self, profile: Profile) -> PlanResult:
        """The planner's ranked candidates for this workflow (honouring ``plan.*`` overrides).
        Part of the cost model."""
        raise self._no_cost_model("plan")

    def unplanned_layout(self) -> Layout:
        """The fixed layout of a run without a plan: every component on every core, not pinned,
        ``plan.chunks`` (default 1) chunks."""
        return Layout.unplanned(self.components, len(self.resources()), self.cfg.plan.chunks or 1, self.ranks())

    def measured_factors(self, profile: Profile, layout: Layout, metrics: dict[str, Any]) -> dict[str, float]:
        """Measured / predicted seconds per component in one iteration's ``metrics`` (calibration,
        re-planning, learning). Part of the cost model."""
        raise self._no_cost_model("measured_factors")

    # --- running -----------------------------------------------------------------------------------
    @abstractmethod
    def build(self, cluster: Cluster, layout: Layout, profile: Profile | None) -> None:
        """Create the worker groups and channels for ``layout``."""

    def apply(self, layout: Layout) -> None:
        """Reconfigure the running workers for a new layout (between iterations; only a planned
        run switches layouts: calibration and re-planning)."""
        raise NotImplementedError(f"{type(self).__name__} cannot switch its workers to another layout (apply)")

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

    def trainer_state(self) -> dict[str, Any] | None:
        """What a checkpoint holds: ``model``, ``optimizer`` (tensors), ``version``, ... None (the
        default): the workflow keeps no state, and the run writes no checkpoints."""
        return None

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state."""
        raise UserError(f"The {type(self).__name__} workflow writes no checkpoints, so resume= cannot continue it: "
                        "start a new run")

    def check_checkpoint(self, checkpoint: Path, *spaces: Any) -> None:
        """Raise a UserError naming every difference when ``checkpoint`` does not fit the model
        this config builds (before a resume writes anything). The default checks nothing beyond
        :meth:`load_trainer_state`."""
        if type(self).trainer_state is Workflow.trainer_state:
            self.load_trainer_state({})  # refuses: this workflow keeps no state to resume

    def evaluate(self, video_dir: Path | None) -> dict[str, Any]:
        """Evaluate the trainer's current weights (``eval/*`` metrics); the default has none."""
        return {}

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
    import pipelines.offpolicy.workflow  # noqa: F401

    return WORKFLOWS.get(str(data.get("workflow", "embodied"))).config
