"""The task graph of one iteration: what the simulator schedules.

A :class:`Task` runs on all devices of its component's worker group at once for ``duration_s``;
a task with a ``lane`` instead shares its devices (a pool of cores) with the other lane tasks
running at the time (processor sharing, see :mod:`scheduler.simulate`).
Its ``deps`` are messages it waits for; a message between different device sets also pays
``Profile.message_s(size_mib)``. ``order`` is the task's place in the static per-device order:
each device runs its tasks in ascending ``order`` (the runtime's workers do the same: they handle
their chunks in a fixed order and never reorder by arrival). Every order key is
``(phase, group, a, b, c)`` with group 0 = onload, 1 = work, 2 = offload, so a device finishes one
phase (and its offloads) before the next phase's onloads and work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ONLOAD, WORK, OFFLOAD = 0, 1, 2


@dataclass(frozen=True)
class Dep:
    """A message from task ``task`` of ``size_mib`` MiB that the dependent task waits for."""

    task: str
    size_mib: float = 0.0


@dataclass(frozen=True)
class Task:
    """One schedulable unit of work on a fixed set of devices."""

    name: str
    """Unique; becomes the span label."""
    component: str
    devices: tuple[int, ...]
    duration_s: float
    deps: tuple[Dep, ...]
    order: tuple[int, int, int, int, int]
    step: int | None = None
    chunk: int | None = None
    kind: str = "work"
    """``"work"``, ``"sync"``, ``"onload"`` or ``"offload"``."""
    lane: str | None = None
    """Shared mode: the worker (one process) that runs the task, one task after the other in
    ``order``; the task shares ``devices`` (the pool) with the other lanes' tasks. None: the task
    occupies all its devices alone."""
    threads: int = 1
    """Lane tasks: cores the task keeps busy at full speed (``duration_s`` is its time then)."""
    process: str | None = None
    """The process that runs the task where several components share one (a ``streams`` plan's
    stream): messages between tasks of one process are passed in memory, at no cost."""


def chunk_sizes(total: int, num_chunks: int) -> tuple[int, ...]:
    """Split ``total`` items into ``num_chunks`` contiguous chunks whose sizes differ by at most 1.

    The first ``total % num_chunks`` chunks get one item more: ``chunk_sizes(10, 4) == (3, 3, 2, 2)``.
    The runtime must split its env (or prompt) batch the same way for the predictions to hold.
    """
    if not 1 <= num_chunks <= total:
        raise ValueError(f"need 1 <= num_chunks <= {total}, got {num_chunks}")
    base, extra = divmod(total, num_chunks)
    return tuple(base + 1 if i < extra else base for i in range(num_chunks))


def call_sizes(total: int, microbatch: int | None, unit: int = 1) -> tuple[int, ...]:
    """Items per call when ``total`` items go through in calls of at most ``microbatch`` items.

    Calls are greedy (full micro-batches first, the remainder last) and hold whole ``unit``s
    (a GRPO group); ``microbatch`` is rounded down to a multiple of ``unit`` (at least one unit).
    ``None`` means one call.
    """
    if total <= 0:
        return ()
    if microbatch is None or microbatch >= total:
        return (total,)
    step = max(unit, microbatch // unit * unit)
    full, rest = divmod(total, step)
    return (step,) * full + ((rest,) if rest else ())


def items_per_device(items: int, n_devices: int) -> int:
    """Items one device of an ``n_devices`` worker group holds when ``items`` are spread evenly."""
    return math.ceil(items / n_devices)
