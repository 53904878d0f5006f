"""The on-policy workflow's cost model and planning glue: what the planner is asked and how its answer is read.

    machine = machine_of(cfg, cluster)            # this machine's cores; every node's cores and GPUs
    profile = profile_embodied(cfg, cluster)     # pipelines.probes: measured, cached per env, policy and hardware
    result = plan_embodied(cfg, profile, machine.resources)   # scheduler.plan: ranked candidates
    layout = Layout.of(result.best, machine, ranks)          # each rank's node, cores, GPUs; chunks, offloads

The macro flow of a config (:func:`macro_flow_of`), the machine it plans on (:func:`machine_of`), the
modes the runtime runs as modelled (:func:`runnable_modes`), the simplest plan within a margin of the
fastest (:func:`prefer_simple`), and measured / predicted factors for re-planning (:func:`measured_factors`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from embodied.errors import UserError
from embodied.runtime import Cluster
from pipelines.collect import resolve_device
from pipelines.config import EmbodiedConfig
from pipelines.layout import Machine, NodeSpec
from pipelines.onpolicy.modes import RUN_MODES, simulated_walls, simulator_device
from pipelines.workflow import Layout, cpu_resources
from scheduler import (
    MODES,
    MacroFlow,
    Plan,
    PlanResult,
    Profile,
    Resources,
    call_sizes,
    plan,
)


def resources_of(cfg: EmbodiedConfig) -> Resources:
    """This machine as planner devices: one device per CPU core the run may use."""
    return cpu_resources(cfg.cluster.num_cpus)


def macro_flow_of(cfg: EmbodiedConfig, metrics: dict[str, Any] | None = None) -> MacroFlow:
    """The macro flow as the planner sees it: every env takes ``algo.rollout_steps`` decisions and
    the trainer trains on all of them. With an iteration's ``metrics``, the iteration as it ran (see
    :func:`iteration_shape`): an episodic one that ended early took fewer decisions and trained on
    fewer samples."""
    num_envs = cfg.env.num_envs * cfg.workers.env
    decisions, samples = iteration_shape(cfg, metrics) if metrics is not None else (None, None)
    trained = samples if samples is not None else num_envs * cfg.algo.rollout_steps
    return MacroFlow.embodied(
        num_envs=num_envs,
        rollout_steps=decisions if decisions is not None else cfg.algo.rollout_steps,
        train_epochs=cfg.algo.epochs,
        train_minibatch=max(1, trained // cfg.algo.num_minibatches),
        train_overlap=cfg.algo.staleness > 0,
        ranks={"env": cfg.workers.env, "rollout": cfg.workers.rollout, "trainer": cfg.workers.trainer},
        train_samples=samples,
    )


def iteration_shape(cfg: EmbodiedConfig, metrics: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(decisions, samples)`` of the iteration ``metrics`` describe where it ended early, else
    None each: an episodic (GRPO) iteration stops a chunk once its episodes are over, so it takes
    ``rollout/decisions`` decisions per chunk (the mean over chunks, rounded up) and trains on
    ``charts/samples`` (the decisions the episodes took; staleness 1: the previous collection's)."""
    T = cfg.algo.rollout_steps
    taken = metrics.get("rollout/decisions")
    decisions = None if taken is None or taken >= T else max(1, math.ceil(taken))
    trained = metrics.get("charts/samples")
    full = cfg.env.num_envs * cfg.workers.env * T
    samples = None if trained is None or int(trained) >= full else max(1, int(trained))
    return decisions, samples


def machine_of(cfg: EmbodiedConfig, cluster: Cluster) -> Machine:
    """The devices a run plans on: this machine's CPU cores; on a cluster of several nodes (or
    with a worker on CUDA) every node's cores and GPUs, each device tagged with its node."""
    nodes = cluster.nodes()
    devices = {"rollout_device": cfg.workers.rollout_device, "trainer_device": cfg.workers.trainer_device,
               "env_device": simulator_device(cfg)}
    cuda = any(resolve_device(d).type == "cuda" for d in devices.values())
    if len(nodes) <= 1 and not cuda:
        return Machine.local_cpus(cfg.cluster.num_cpus)
    if cuda and not any(node.gpus for node in nodes):
        asked = ", ".join(f"workers.{k}={d}" for k, d in devices.items() if resolve_device(d).type == "cuda")
        raise UserError(f"{asked}, but the cluster has no GPU (Ray sees none on its {len(nodes)} node(s)). Use cpu or "
                        "auto, or start the run on a machine (or a Ray cluster) with CUDA GPUs.")
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0
    local = Machine.local_cpus(cfg.cluster.num_cpus)
    cpu_gib = local.resources.devices[0].memory_gib
    specs = []
    for i, node in enumerate(nodes):
        cpus = int(node.cpus) if len(nodes) > 1 else len(local.resources)
        specs.append(NodeSpec(node.node_id if len(nodes) > 1 else None, f"node{i}", cpus,
                              int(node.gpus) if cuda else 0, cpu_gib, gpu_gib))
    return Machine.of_nodes([n for n in specs if n.cpus or n.gpus])


def trainer_micro_batch(configured: int | None, planned: int | None, ranks: int) -> int | None:
    """Samples per forward/backward pass of one trainer rank: ``algo.micro_batch_size`` when set,
    else the plan's ``train_microbatch`` (samples per call over all ranks) divided over the ranks,
    else None (whole blocks)."""
    if configured is not None:
        return configured
    return None if planned is None else max(1, math.ceil(planned / ranks))


SIMPLICITY_MARGIN = 0.02
"""A plan with more chunks or a less simple mode must be predicted this much faster to be chosen:
more chunks mean more messages, and a prediction within noise does not pay for that risk."""
MODE_RANK = {mode: rank for rank, mode in enumerate(MODES)}
"""How simple each mode is (0: simplest), in the planner's tie-break order."""


def plan_embodied(cfg: EmbodiedConfig, profile: Profile, resources: Resources | None = None,
                  multi_node: bool = False, shortfall_of: Callable[[Plan], str | None] | None = None) -> PlanResult:
    """Plan ``cfg``'s workflow on ``resources`` (default: this machine's cores); ``plan.mode`` /
    ``plan.chunks`` restrict the search. Where there are GPUs, each component may only use the
    kind of device it runs on (:func:`with_device_kinds`). ``shortfall_of``: what a plan's ranks
    would reserve beyond the cluster (None when they fit); the candidates it refuses are never
    chosen (:func:`only_buildable`).

    Among the candidates predicted within SIMPLICITY_MARGIN of the fastest, the one with the fewest
    chunks and the simplest mode becomes ``best``; the ranked table is kept as the search made it.
    """
    resources = resources or resources_of(cfg)
    if any(d.kind == "gpu" for d in resources.devices):
        profile = with_device_kinds(cfg, profile)
    result = plan(
        macro_flow_of(cfg),
        profile,
        resources,
        max_chunks=min(cfg.plan.max_chunks, cfg.env.num_envs),
        force_mode=None if cfg.plan.mode == "auto" else cfg.plan.mode,
        force_chunks=cfg.plan.chunks,
        modes=runnable_modes(cfg, multi_node),
    )
    if shortfall_of is not None:
        result = only_buildable(result, shortfall_of)
    return prefer_simple(result)


def only_buildable(result: PlanResult, shortfall_of: Callable[[Plan], str | None]) -> PlanResult:
    """``result`` without the candidates whose ranks the cluster cannot hold (``shortfall_of``:
    what a plan's ranks reserve beyond the cluster, None when they fit); ``best`` is the fastest
    of the others. None fits: a UserError that names what the fastest plan asks for."""
    kept = [(p, t) for p, t in result.candidates if shortfall_of(p) is None]
    if not kept:
        best = result.best
        raise UserError(f"No plan fits the cluster: the worker groups of every candidate ask for more than it has (the "
                        f"fastest, {best.mode} with {best.num_chunks} chunk(s): {shortfall_of(best)}). Lower "
                        "workers.<group>_cpus / _resources, run fewer ranks (workers.<group>), or give the cluster more "
                        "(cluster.num_cpus, cluster.num_gpus for a local Ray; nodes for a cluster).")
    return dataclasses.replace(result, best=kept[0][0], best_timeline=kept[0][1], candidates=kept)


def runnable_modes(cfg: EmbodiedConfig, multi_node: bool = False) -> tuple[str, ...]:
    """The modes the runtime runs as the planner models them for ``cfg`` (each mode's
    :meth:`~pipelines.onpolicy.modes.RunMode.runs`; ``multi_node``: on a cluster of several nodes)."""
    return tuple(m for m in MODES if RUN_MODES.get(m).runs(cfg, multi_node))


def with_device_kinds(cfg: EmbodiedConfig, profile: Profile) -> Profile:
    """``profile`` with each component bound to the kind of device it runs on: the rollout and
    the trainer to their configured devices, the env to the device its simulator runs on
    (:func:`~pipelines.onpolicy.modes.simulator_device`: a GPU simulator is a GPU component)."""
    kinds = {
        "env": "gpu" if resolve_device(simulator_device(cfg)).type == "cuda" else "cpu",
        "rollout": "gpu" if resolve_device(cfg.workers.rollout_device).type == "cuda" else "cpu",
        "trainer": "gpu" if resolve_device(cfg.workers.trainer_device).type == "cuda" else "cpu",
    }
    components = {name: dataclasses.replace(c, device_kind=kinds.get(name, c.device_kind))
                  for name, c in profile.components.items()}
    return dataclasses.replace(profile, components=components)


def prefer_simple(result: PlanResult, margin: float = SIMPLICITY_MARGIN) -> PlanResult:
    """``result`` with ``best`` replaced by the simplest candidate within ``margin`` of the fastest."""
    fastest = result.best.predicted_iteration_s
    close = [(p, t) for p, t in result.candidates if p.predicted_iteration_s <= fastest * (1 + margin)]
    plan_, timeline = min(close, key=lambda pt: (pt[0].num_chunks, MODE_RANK.get(pt[0].mode, 9), len(pt[0].offload)))
    return dataclasses.replace(result, best=plan_, best_timeline=timeline)


def shared_wall_s(profile: Profile, layout: Layout, cfg: EmbodiedConfig, metrics: dict[str, Any] | None = None) -> dict[str, float]:
    """A shared plan's predicted wall seconds of every env and rollout call in one iteration (of
    the shape ``metrics`` describe, see :func:`macro_flow_of`), per component (the simulation's
    spans: a call slowed down while more threads than cores run in the pool takes longer than its
    profiled cost, as it does when measured)."""
    return simulated_walls(profile, layout, macro_flow_of(cfg, metrics), resources_of(cfg))


def measured_factors(profile: Profile, layout: Layout, cfg: EmbodiedConfig, metrics: dict[str, Any]) -> dict[str, float]:
    """Measured / profiled seconds per call of env, rollout and trainer in one iteration. The env's
    and the rollout's calls are predicted per rank as the plan's mode makes them
    (:meth:`~pipelines.onpolicy.modes.RunMode.predicted_collection_s`: a shared plan's with their
    simulated wall time, the pool's cores shared, :func:`shared_wall_s`); the metrics are the mean
    over ranks. Calls are counted as the iteration made them (an episodic iteration that ended
    early made fewer)."""
    workflow = macro_flow_of(cfg, metrics)
    devices = {name: len(placed) for name, placed in layout.plan.placement.items()}
    mode = RUN_MODES.get(layout.plan.mode)
    env_pred, roll_pred = mode.predicted_collection_s(profile, layout, cfg, workflow, resources_of(cfg))
    # the calls of the trainer's simulation: minibatches in micro-batches, for the epochs the update
    # ran (``algo.target_kl`` may stop it early), not the configured ones
    epochs = metrics.get("losses/epochs") or cfg.algo.epochs
    calls = [b for mb in call_sizes(workflow.samples, workflow.train_minibatch) for b in call_sizes(mb, layout.plan.train_microbatch)]
    trainer_pred = epochs * sum(profile["trainer"].cost.time_s(b, devices["trainer"]) for b in calls)
    measured = {"env": metrics["time/sim_s"], "rollout": metrics["time/infer_s"], "trainer": metrics["time/train_s"]}
    predicted = {"env": env_pred, "rollout": roll_pred, "trainer": trainer_pred}
    return {name: measured[name] / predicted[name] for name in measured if predicted[name] > 0 and measured[name] > 0}
