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
* **Shared pool** (``shared`` mode): a task with a ``lane`` does not occupy its devices (the pool
  of cores); it runs on its lane (one worker process) after the lane's previous task, once its
  inputs have arrived. Lane tasks running at the same time share the pool's P cores: with N
  threads running in all (a task asks for ``threads``), each runs at speed ``min(1, P / N)`` of
  its ``duration_s`` (processor sharing, work-conserving: as the OS shares unpinned threads). A
  message between lane tasks is free only within one lane. The pool starts when all its devices
  are free and is free again when its last lane task ends; no other task on a pool device may be
  ordered between the pool's lane tasks.
* **GPU sharing** (``Plan.gpu_sharing``, where a GPU simulator shares its GPUs): ``switch``: the
  rules above, and a task that follows another component's task on a GPU starts
  ``Profile.gpu_switch_s`` after it (the context switch). ``overlap``: the env and rollout tasks are
  lane tasks on the pool of their GPUs (the env worker one lane, the rollout worker the other),
  whose capacity is ``2 / Profile.gpu_contention`` tasks: one task alone runs at full speed, two at
  once each at ``1 / gpu_contention`` of it.
* Each offloaded component X gets, on each of its devices, an ``onload`` span before its phase's
  first task there and an ``offload`` span after the phase's last task there. Over an iteration
  in steady state every offloaded component pays one onload and one offload per device.
"""

from __future__ import annotations

import math

from scheduler.graph import OFFLOAD, ONLOAD, Task
from scheduler.plans import GPU_OVERLAP, GPU_SWITCH, LANE_MODES, Plan, Span, Timeline
from scheduler.profile import Profile
from scheduler.resources import Resources
from scheduler.flows import MacroFlow


def context_switch_tasks(plan: Plan, profile: Profile, workflow: MacroFlow) -> list[Task]:
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


def task_graph(plan: Plan, profile: Profile, workflow: MacroFlow, resources: Resources) -> list[Task]:
    """All tasks of one iteration (work, weight sync, context switches), after validating the plan."""
    validate_plan(plan, profile, workflow, resources)
    return workflow.spec.build(workflow, plan, profile) + context_switch_tasks(plan, profile, workflow)


def schedule(tasks: list[Task], profile: Profile, switch_devices: frozenset[int] = frozenset(),
             pool_capacity: float | None = None) -> dict[str, tuple[float, float]]:
    """Task name -> (start_s, end_s) under the rules of this module. ``switch_devices``: the
    devices where a change of component costs ``profile.gpu_switch_s``; ``pool_capacity``: the
    lane pool's capacity in tasks at full speed (default: its number of cores)."""
    by_name = {t.name: t for t in tasks}
    if len(by_name) != len(tasks):
        raise ValueError("task names must be unique")
    ordered = sorted(tasks, key=_order)
    lane_tasks = [t for t in ordered if t.lane is not None]
    _check_pool(ordered, lane_tasks)
    device_free_s: dict[int, float] = {}
    last_component: dict[int, str] = {}  # device -> component of its last task (switch costs)
    times: dict[str, tuple[float, float]] = {}
    for task in ordered:
        if task.lane is not None:
            if task is lane_tasks[0]:  # the whole pool at once: its tasks slow each other down
                pool = task.devices
                start_s = max((device_free_s.get(d, 0.0) for d in pool), default=0.0)
                end_s = _share(lane_tasks, start_s, times, by_name, profile, pool_capacity)
                for d in pool:
                    device_free_s[d] = end_s
            continue
        ready_s = _inputs_ready(task, times, by_name, profile)
        for d in task.devices:
            free_s = device_free_s.get(d, 0.0)
            if d in switch_devices and last_component.get(d, task.component) != task.component:
                free_s += profile.gpu_switch_s
            if free_s > ready_s:
                ready_s = free_s
        end_s = ready_s + task.duration_s
        times[task.name] = (ready_s, end_s)
        for d in task.devices:
            device_free_s[d] = end_s
            last_component[d] = task.component
    return times


def _inputs_ready(task: Task, times: dict[str, tuple[float, float]], by_name: dict[str, Task], profile: Profile) -> float:
    """When the last input message of ``task`` arrives (its senders must have been scheduled)."""
    ready_s = 0.0
    for dep in task.deps:
        if dep.task not in times:
            raise AssertionError(f"task {task.name!r} is ordered before its input {dep.task!r}")
        sender = by_name[dep.task]
        arrive_s = times[dep.task][1]
        if _pays_message(sender, task, profile.cross_process_messages):
            arrive_s += profile.message_s(dep.size_mib)
        if arrive_s > ready_s:
            ready_s = arrive_s
    return ready_s


def _pays_message(sender: Task, receiver: Task, cross_process: bool) -> bool:
    if sender.process is not None and sender.process == receiver.process:
        return False
    if sender.lane is not None or receiver.lane is not None:
        return sender.lane != receiver.lane
    return sender.devices != receiver.devices or (cross_process and sender.component != receiver.component)


def _check_pool(ordered: list[Task], lane_tasks: list[Task]) -> None:
    """One pool, its lane tasks contiguous in the static order of its devices."""
    if not lane_tasks:
        return
    pool = lane_tasks[0].devices
    if any(t.devices != pool for t in lane_tasks):
        raise ValueError("all lane tasks must share one pool of devices")
    first, last = _order(lane_tasks[0]), _order(lane_tasks[-1])
    for t in ordered:
        if t.lane is None and set(t.devices) & set(pool) and first < _order(t) < last:
            raise ValueError(f"task {t.name!r} on the pool is ordered between its lane tasks")


_DONE = 1e-12  # remaining work (s) below which a lane task counts as finished (float noise)


def _share(
    lane_tasks: list[Task], start_s: float, times: dict[str, tuple[float, float]], by_name: dict[str, Task],
    profile: Profile, capacity: float | None = None,
) -> float:
    """Processor sharing of ``lane_tasks`` (in static order) on their pool from ``start_s``;
    writes their (start, end) into ``times`` and returns when the last one ends. ``capacity``:
    threads the pool runs at full speed (default: its cores)."""
    cores = len(lane_tasks[0].devices) if capacity is None else capacity
    queues: dict[str, list[Task]] = {}
    for t in lane_tasks:
        queues.setdefault(t.lane, []).append(t)  # type: ignore[arg-type]
    heads = dict.fromkeys(queues, 0)
    remaining: dict[str, float] = {}  # running task -> seconds of work left at full speed
    running_lane: dict[str, str] = {}  # lane -> its running task
    now = end_s = start_s
    left = len(lane_tasks)
    while left:
        # Start every lane's next task whose inputs are in; note when the next one will be.
        next_ready = math.inf
        finished_at_once = False  # a task of no duration ended: scan again (a lane may wait on it)
        for lane, queue in queues.items():
            while lane not in running_lane and heads[lane] < len(queue):
                task = queue[heads[lane]]
                if any(d.task not in times or d.task in remaining for d in task.deps):
                    break  # an input is still being computed
                ready_s = max(start_s, _inputs_ready(task, times, by_name, profile))
                if ready_s > now:
                    next_ready = min(next_ready, ready_s)
                    break
                heads[lane] += 1
                if task.duration_s <= 0:
                    times[task.name] = (now, now)
                    left -= 1
                    finished_at_once = True
                    continue
                running_lane[lane] = task.name
                remaining[task.name] = task.duration_s
                times[task.name] = (now, math.nan)
        if finished_at_once:
            continue
        if not running_lane:
            if math.isinf(next_ready):
                raise AssertionError("lane tasks wait for each other in a cycle")
            now = next_ready
            continue
        threads = sum(by_name[name].threads for name in running_lane.values())
        speed = min(1.0, cores / threads)
        dt = min(min(remaining.values()) / speed, next_ready - now)
        now += dt
        for lane, name in list(running_lane.items()):
            remaining[name] -= dt * speed
            if remaining[name] <= _DONE * max(1.0, by_name[name].duration_s):
                del remaining[name], running_lane[lane]
                times[name] = (times[name][0], now)
                end_s = max(end_s, now)
                left -= 1
    return end_s


def _order(task: Task) -> tuple[int, int, int, int, int]:
    return task.order


def simulate(plan: Plan, profile: Profile, workflow: MacroFlow, resources: Resources) -> Timeline:
    """Simulate one iteration of ``workflow`` under ``plan``: spans, makespan, utilization."""
    tasks = task_graph(plan, profile, workflow, resources)
    switch_devices, pool_capacity = gpu_sharing_rules(plan, profile, resources)
    times = schedule(tasks, profile, switch_devices, pool_capacity)
    gpu_pool = pool_capacity is not None  # an overlap plan: a lane task uses all its GPUs
    makespan_s, utilization = _summary(tasks, times, len(resources.devices), gpu_pool)
    spans = []
    shown_on = {} if gpu_pool else _pool_rows(tasks, times)
    for task in tasks:
        start_s, end_s = times[task.name]
        for d in shown_on.get(task.name, task.devices):
            spans.append(Span(task.component, d, start_s, end_s, task.step, task.chunk, task.name, task.kind))
    spans.sort(key=lambda s: (s.start_s, s.device, s.end_s, s.label))
    return Timeline(tuple(spans), makespan_s, utilization)


def _pool_rows(tasks: list[Task], times: dict[str, tuple[float, float]]) -> dict[str, tuple[int, ...]]:
    """Lane task -> the pool cores its span is drawn on: the lowest cores free at its start (an
    oversubscribed pool draws on the cores that free up first, overlapping)."""
    lane_tasks = sorted((t for t in tasks if t.lane is not None), key=lambda t: (times[t.name][0], _order(t)))
    free_at = {d: -math.inf for d in (lane_tasks[0].devices if lane_tasks else ())}
    rows: dict[str, tuple[int, ...]] = {}
    for task in lane_tasks:
        start_s, end_s = times[task.name]
        chosen = sorted(free_at, key=lambda d: (free_at[d] > start_s, free_at[d] if free_at[d] > start_s else 0.0, d))
        rows[task.name] = tuple(sorted(chosen[: task.threads]))
        for d in rows[task.name]:
            free_at[d] = max(free_at[d], end_s)
    return rows


def predict(plan: Plan, profile: Profile, workflow: MacroFlow, resources: Resources) -> tuple[float, dict[int, float]]:
    """``(makespan_s, utilization)`` of :func:`simulate` without materialising spans (the search's fast path)."""
    tasks = task_graph(plan, profile, workflow, resources)
    switch_devices, pool_capacity = gpu_sharing_rules(plan, profile, resources)
    times = schedule(tasks, profile, switch_devices, pool_capacity)
    return _summary(tasks, times, len(resources.devices), pool_capacity is not None)


def gpu_sharing_rules(plan: Plan, profile: Profile, resources: Resources) -> tuple[frozenset[int], float | None]:
    """``(switch_devices, pool_capacity)`` of :func:`schedule` for ``plan``: a ``switch`` plan's
    GPUs pay the switch cost; an ``overlap`` plan's GPU pool runs ``2 / gpu_contention`` tasks at
    full speed; neither for a plan without GPU sharing."""
    if plan.gpu_sharing == GPU_SWITCH:
        used = {d for devices in plan.placement.values() for d in devices}
        return frozenset(d for d in used if resources.devices[d].kind == "gpu"), None
    if plan.gpu_sharing == GPU_OVERLAP:
        return frozenset(), 2.0 / profile.gpu_contention
    return frozenset(), None


def _summary(tasks: list[Task], times: dict[str, tuple[float, float]], num_devices: int,
             gpu_pool: bool = False) -> tuple[float, dict[int, float]]:
    """Makespan and utilization; ``gpu_pool``: the lane tasks run on GPUs (an overlap plan), each
    busy on all its devices for its ``duration_s``."""
    makespan_s = max((end for _, end in times.values()), default=0.0)
    busy_s = dict.fromkeys(range(num_devices), 0.0)
    for task in tasks:
        if task.kind in ("work", "sync"):
            start_s, end_s = times[task.name]
            # a lane task keeps `threads` cores busy for its duration_s at full speed, however shared
            if task.lane is None:
                share_s = end_s - start_s
            else:
                share_s = task.duration_s if gpu_pool else task.duration_s * task.threads / len(task.devices)
            for d in task.devices:
                busy_s[d] += share_s
    return makespan_s, {d: (b / makespan_s if makespan_s > 0 else 0.0) for d, b in busy_s.items()}


def validate_plan(plan: Plan, profile: Profile, workflow: MacroFlow, resources: Resources) -> None:
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
    if plan.mode in LANE_MODES:
        pool = spec.pool
        if not pool:
            raise ValueError(f"the {workflow.kind} workflow has no {plan.mode} mode (no pool components)")
        cores = plan.placement[pool[0]]
        if any(plan.placement[c] != cores for c in pool):
            raise ValueError(f"a {plan.mode} plan places {list(pool)} on one pool, got {plan.placement_str()}")
        if any(resources.devices[d].kind != "cpu" for d in cores):
            raise ValueError(f"a {plan.mode} plan's pool must be CPU cores, got {plan.placement_str()}")
        if plan.lanes > len(cores):
            raise ValueError(f"Plan.lanes={plan.lanes} exceeds the pool's {len(cores)} cores")
    if plan.gpu_sharing is not None:
        pool = spec.pool
        env_gpus = pool and all(resources.devices[d].kind == "gpu" for d in plan.placement[pool[-1]])
        if not env_gpus:
            raise ValueError(f"Plan.gpu_sharing={plan.gpu_sharing!r} needs the {workflow.kind} workflow's simulator on GPUs, got {plan.placement_str()}")
        if plan.gpu_sharing == GPU_OVERLAP and any(plan.placement[c] != plan.placement[pool[0]] for c in pool):
            raise ValueError(f"an {GPU_OVERLAP} plan places {list(pool)} on the same GPUs, got {plan.placement_str()}")
    for name, devices in plan.placement.items():
        for d in devices:
            if not 0 <= d < len(resources.devices):
                raise ValueError(f"{name!r} placed on device {d}; resources have {len(resources.devices)} devices")
            kind = profile[name].device_kind
            if kind is not None and resources.devices[d].kind != kind:
                raise ValueError(f"{name!r} needs {kind} devices but is placed on {resources.describe(d)}")
