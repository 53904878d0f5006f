"""Typed config of the env side of a run (``env.*`` keys)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EnvConfig:
    """Which task to simulate and how to vectorize it."""

    id: str = "CartPole-v1"
    """Task id: a gymnasium id (``HalfCheetah-v5``), gymnasium's ``module:EnvId`` import syntax,
    ``package.module:ClassName`` of a user's env class, a ManiSkill task (``PushCube-v1``) or a
    LIBERO suite/task (``libero_spatial/0``)."""
    adapter: str = "auto"
    """Adapter that builds the env (``embodied recipes`` lists them); ``auto`` picks the first
    adapter that claims ``id``."""
    num_envs: int = 8
    """Number of parallel envs per env worker."""
    backend: str = "auto"
    """``inprocess`` (one process steps the batch), ``multiprocess`` (envs spread over
    ``num_procs`` processes, for CPU simulators that cannot batch), ``batched`` (ManiSkill: its
    GPU simulation of all envs in one process), or ``auto`` (the adapter's preferred backend for
    this machine)."""
    num_procs: int = 0
    """Processes of the multiprocess backend (each steps num_envs/num_procs envs in sequence);
    0 = one per available core, at most one per env. The M2Flow plan sets it from the env's cores."""
    worker_spin_us: int = 200
    """Multiprocess backend: longest busy-wait (microseconds) of an env process for its next
    command, used only while commands follow its replies that fast (a tight stepping loop; not
    while a policy runs between steps) and only with no more processes than cores; and the window
    around a step's typical duration in which the parent polls for its reply (after sleeping
    through the rest), only with fewer processes than cores. 0 always blocks. Measured in tight
    loops (benchmarks/results/env_worker_spin.json): both spins +30% steps/s for HalfCheetah at 8
    envs per process, +7% at 32, +4% for PushCube's 3 ms steps, and no loss with a policy between
    steps."""
    max_episode_steps: int | None = None
    """Time limit (truncation); None keeps the task's default."""
    ignore_terminations: bool = False
    """Run every episode to its time limit, ignoring the task's ``terminated`` (ManiSkill's
    ``ignore_terminations``): success is then success at the episode's end, and a policy is rewarded
    for holding the goal rather than for touching it once."""
    obs_mode: str = "state"
    """Observation mode: ``state``, ``rgb`` or ``state+rgb`` (pixels where the adapter supports them)."""
    image_size: int = 128
    """Side of rendered square camera images for pixel observations and videos."""
    render_size: int = 256
    """Side of the frames ``VecEnv.render()`` returns for videos (where the adapter can set it)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to the env constructor (e.g. ``control_mode``)."""
