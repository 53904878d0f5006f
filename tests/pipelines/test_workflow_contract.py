"""The Workflow contract: a workflow that writes only its sizes, ``build`` and ``iterate`` runs
through the Runner on a fixed layout; planning comes with a whole cost model or not at all."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from embodied.errors import UserError
from embodied.metrics import read_metrics
from embodied.runtime import Cluster, Worker, WorkerGroup
from embodied.runtime.cluster import ClusterConfig
from pipelines.config import LoggingConfig, RunConfig, RunDirConfig
from pipelines.runner import Runner
from pipelines.rundir import RunDir
from pipelines.workflow import Layout, Workflow
from scheduler import Profile


class Counter(Worker):
    """Counts what it is asked to add: the whole of this workflow's work."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, n: int) -> int:
        self.total += n
        return self.total


@dataclass
class CountAlgoConfig:
    lr: float = 0.1
    """What the Runner hands each iteration."""
    anneal_lr: bool = False
    """Keep ``lr`` over the run."""


@dataclass
class CountEvalConfig:
    every: int = 0
    """No evaluation between iterations."""


@dataclass
class CountConfig(RunConfig):
    workflow: str = "count"
    """This schema's workflow."""
    steps: int = 10
    """Steps each iteration adds."""
    total: int = 30
    """The run's budget in steps."""
    algo: CountAlgoConfig = field(default_factory=CountAlgoConfig)
    eval: CountEvalConfig = field(default_factory=CountEvalConfig)


class CountWorkflow(Workflow):
    """The least a workflow writes: its sizes, ``build`` and ``iterate``."""

    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.steps

    @property
    def total_steps(self) -> int:
        return self.cfg.total

    def build(self, cluster: Cluster, layout: Layout, profile: Profile | None) -> None:
        self.layout = layout
        self.counter = WorkerGroup(cluster, Counter, 1)

    def iterate(self, iteration: int, lr: float, last: bool) -> dict[str, Any]:
        total = self.counter.remote.add(self.cfg.steps).result()
        return {"steps": self.cfg.steps, "count/total": total, "count/lr": lr, "perf/env_steps_per_s": 1.0}


def count_config(tmp_path) -> CountConfig:
    return CountConfig(run=RunDirConfig(dir=str(tmp_path / "run")), cluster=ClusterConfig(backend="local"),
                       logging=LoggingConfig(tensorboard=False, wandb=False, progress="none"))


def test_a_workflow_with_only_build_and_iterate_runs_through_the_runner(tmp_path):
    cfg = count_config(tmp_path)
    workflow = CountWorkflow(cfg)
    assert not workflow.has_cost_model()
    with RunDir.create(cfg) as run:
        summary = Runner(cfg, run, workflow).run()
    assert summary["iterations"] == 3 and summary["env_steps"] == 30
    rows = read_metrics(run.path)
    assert [r["count/total"] for r in rows] == [10, 20, 30]
    assert all(r["count/lr"] == 0.1 for r in rows)
    assert json.loads((run.path / "summary.json").read_text())["env_steps"] == 30
    plan = json.loads((run.path / "plan.json").read_text())
    assert plan["planned"] is False and plan["plan"]["num_chunks"] == 1  # the fixed layout, no profile
    assert not (run.path / "profile.json").exists()
    assert not (run.path / "checkpoints").exists()  # it keeps no state: no checkpoints


def test_a_workflow_without_state_refuses_a_resume_and_has_no_plan():
    workflow = CountWorkflow(CountConfig())
    with pytest.raises(UserError, match="CountWorkflow workflow writes no checkpoints"):
        workflow.check_checkpoint(None)
    with pytest.raises(NotImplementedError, match="CountWorkflow has no cost model"):
        workflow.profile(None, False, print)
    assert workflow.evaluate(None) == {}
    assert workflow.describe() == "10 steps per iteration"


def test_a_cost_model_is_all_of_it_or_none():
    with pytest.raises(TypeError, match="defines profile, plan but not macro_flow, measured_factors"):

        class HalfPlanned(CountWorkflow):
            def profile(self, cluster, force, log):
                raise AssertionError

            def plan(self, profile):
                raise AssertionError

