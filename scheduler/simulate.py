"""Deterministic discrete-event simulation of one iteration under a plan.

Rules (the runtime must behave the same way for the prediction to hold):

* A task occupies all devices of its component's worker group for its whole duration; a device
  runs one task at a time.
* Each device runs its tasks in the static order of their ``order`` keys (see
  :mod:`scheduler.graph`); a task starts when all its devices have finished their previous tasks
  and all its input messages have arrived.
* A message between tasks whose device sets differ arrives ``transfer_latency_s +
  size_mib * transfer_s_per_mib`` after its sender ends; transfers do not occupy devices.
  Between identical device sets it is free.
* Each offloaded component X gets, on each of its devices, an ``onload`` span before its phase's
  first task there and an ``offload`` span after the phase's last task there. Over an iteration
  in steady state every offloaded component pays one onload and one offload per device.
"""

from __future__ import annotations

from scheduler.graph import OFFLOAD, ONLOAD, Task
from scheduler.plans import Plan, Span, Timeline
from scheduler.profile import Profile
from scheduler.resources import Resources
from scheduler.workflows import Workflow


def context_switch_tasks(plan: Plan, profile: Profile, workflow: Workflow) -> list[Task]:
    """Onload/offload tasks of the plan's offloaded components (omitted where they cost 0 s)."""
    spec = workflow.spec
    tasks = []
    for name in plan.offload:
        component, phase, rank = profile[name], spec.phases[name], spec.components.index(name)
        for d in plan.placement[name]:
            if component.onload_s > 0:
                tasks.append(Task(f"onload {name} @{d}", name, (d,), component.onload_s, (),
                                  (phase, ONLOAD, rank, d, 0), kind="onload"))
            if component.offload_s > 0:
                tasks.append(Task(f"offload {name} @{d}", name, (d,), component.offload_s, (),
                                  (phase, OFFLOAD, rank, d, 0), kind="offload"))
    return tasks


def task_graph(plan: Plan, profile: Profile, workflow: Workflow, resources: Resources) -> list[Task]:
    """All tasks of one iteration (work, weight sync, context switches), after validating the plan."""
    validate_plan(plan, profile, workflow, resources)
    return workflow.spec.build(workflow, plan, profile) + context_switch_tasks(plan, profile, workflow)


def schedule(tasks: list[Task], profile: Profile) -> dict[str, tuple[float, float]]:
    """Task name -> (start_s, end_s) under the rules of this module."""
    devices_of = {t.name: t.devices for t in tasks}
    component_of = {t.name: t.component for t in tasks}
    cross_process = profile.cross_process_messages
    if len(devices_of) != len(tasks):
        raise ValueError("task names must be unique")
    latency_s, s_per_mib = profile.transfer_latency_s, profile.transfer_s_per_mib
    device_free_s: dict[int, float] = {}
    times: dict[str, tuple[float, float]] = {}
    for task in sorted(tasks, key=_order):
        ready_s = 0.0
        devices = task.devices
        for dep in task.deps:
            if dep.task not in times:
                raise AssertionError(f"task {task.name!r} is ordered before its input {dep.task!r}")
            arrive_s = times[dep.task][1]
            if devices_of[dep.task] != devices or (cross_process and component_of[dep.task] != task.component):
                arrive_s += latency_s + dep.size_mib * s_per_mib
            if arrive_s > ready_s:
                ready_s = arrive_s
        for d in devices:
            free_s = device_free_s.get(d, 0.0)
            if free_s > ready_s:
                ready_s = free_s
        end_s = ready_s + task.duration_s
        times[task.name] = (ready_s, end_s)
        for d in devices:
            device_free_s[d] = end_s
    return times


def _order(task: Task) -> tuple[int, int, int, int, int]:
    return task.order


def simulate(plan: Plan, profile: Profile, workflow: Workflow, resources: Resources) -> Timeline:
    """Simulate one iteration of ``workflow`` under ``plan``: spans, makespan, utilization."""
    tasks = task_graph(plan, profile, workflow, resources)
    times = schedule(tasks, profile)
    makespan_s, utilization = _summary(tasks, times, len(resources.devices))
    spans = []
    for task in tasks:
        start_s, end_s = times[task.name]
        for d in task.devices:
            spans.append(Span(task.component, d, start_s, end_s, task.step, task.chunk, task.name, task.kind))
    spans.sort(key=lambda s: (s.start_s, s.device, s.end_s, s.label))
    return Timeline(tuple(spans), makespan_s, utilization)


def predict(plan: Plan, profile: Profile, workflow: Workflow, resources: Resources) -> tuple[float, dict[int, float]]:
    """``(makespan_s, utilization)`` of :func:`simulate` without materialising spans (the search's fast path)."""
    tasks = task_graph(plan, profile, workflow, resources)
    return _summary(tasks, schedule(tasks, profile), len(resources.devices))


def _summary(tasks: list[Task], times: dict[str, tuple[float, float]], num_devices: int) -> tuple[float, dict[int, float]]:
    makespan_s = max((end for _, end in times.values()), default=0.0)
    busy_s = dict.fromkeys(range(num_devices), 0.0)
    for task in tasks:
        if task.kind in ("work", "sync"):
            start_s, end_s = times[task.name]
            for d in task.devices:
                busy_s[d] += end_s - start_s
    return makespan_s, {d: (b / makespan_s if makespan_s > 0 else 0.0) for d, b in busy_s.items()}


def validate_plan(plan: Plan, profile: Profile, workflow: Workflow, resources: Resources) -> None:
    """Raise ValueError if the plan does not match the workflow, the profile or the resources."""
    spec = workflow.spec
    if set(plan.placement) != set(spec.components):
        raise ValueError(f"{workflow.kind} plan must place exactly {list(spec.components)}, got {sorted(plan.placement)}")
    missing = [c for c in spec.components if c not in profile.components]
    if missing:
        raise ValueError(f"profile lacks component(s) {missing} of the {workflow.kind} workflow; has {sorted(profile.components)}")
    limit = spec.chunk_total(workflow)
    if plan.num_chunks > limit:
        raise ValueError(f"num_chunks={plan.num_chunks} exceeds the {limit} items the chunks partition")
    for name, devices in plan.placement.items():
        for d in devices:
            if not 0 <= d < len(resources.devices):
                raise ValueError(f"{name!r} placed on device {d}; resources have {len(resources.devices)} devices")
            kind = profile[name].device_kind
            if kind is not None and resources.devices[d].kind != kind:
                raise ValueError(f"{name!r} needs {kind} devices but is placed on {resources.describe(d)}")
