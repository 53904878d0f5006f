"""M2Flow planner: from a macro flow, a measured profile and the devices, the micro flow to run.

Pure Python (stdlib only): no torch, no ray, no clock, no I/O; every result is deterministic.

    from scheduler import Profile, Resources, MacroFlow, plan, simulate
    result = plan(MacroFlow.embodied(num_envs=64, rollout_steps=80), profile, Resources.gpus(4, 80))
    print(result.format_table())
    result.best.to_dict()  # -> runs/<name>/plan.json

See docs/planner.md for the model and its assumptions.
"""

from scheduler.bounds import Bound, GapToBound, gap_to_bound, lower_bound
from scheduler.cost_model import CostModel, fit_cost_model
from scheduler.graph import Dep, Task, call_sizes, chunk_sizes
from scheduler.memory import memory_violations, peak_memory_gib
from scheduler.placements import PLACEMENT_MODES
from scheduler.plans import GPU_OVERLAP, GPU_SHARING, GPU_SWITCH, MODES, SHARED, STREAMS, Plan, Span, Timeline, split_devices
from scheduler.profile import WEIGHT_SYNC, ComponentProfile, Profile
from scheduler.resources import Device, Resources
from scheduler.search import PlanningError, PlanResult, plan, sequential_plan
from scheduler.simulate import predict, simulate, task_graph
from scheduler.flows import FLOW_KINDS, MacroFlow, FlowKind

__all__ = [
    "GPU_OVERLAP",
    "GPU_SHARING",
    "GPU_SWITCH",
    "MODES",
    "PLACEMENT_MODES",
    "SHARED",
    "STREAMS",
    "WEIGHT_SYNC",
    "FLOW_KINDS",
    "Bound",
    "ComponentProfile",
    "CostModel",
    "Dep",
    "Device",
    "GapToBound",
    "Plan",
    "PlanResult",
    "PlanningError",
    "Profile",
    "Resources",
    "Span",
    "Task",
    "Timeline",
    "MacroFlow",
    "FlowKind",
    "call_sizes",
    "chunk_sizes",
    "fit_cost_model",
    "gap_to_bound",
    "lower_bound",
    "memory_violations",
    "peak_memory_gib",
    "plan",
    "predict",
    "sequential_plan",
    "simulate",
    "split_devices",
    "task_graph",
]
