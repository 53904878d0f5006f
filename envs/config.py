"""Typed config of the env side of a run (``env.*`` keys)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class EnvConfig:
    """Which task to simulate and how to vectorize it."""

    id: str = "CartPole-v1"
    """Task id: a gymnasium id (``HalfCheetah-v5``), gymnasium's ``module:EnvId`` import syntax,
    ``package.module:ClassName`` of a user's env class, a ManiSkill task (``PushCube-v1``) or a
    LIBERO suite/task (``libero_spatial/0``)."""
    adapter: str = "auto"
    """Adapter that builds the env (``embodied recipes --all`` lists them); ``auto`` picks the first
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
    command, used only while commands follow its replies that fast (a tight stepping loop, not
    while a policy runs between steps) and only with no more processes than cores; and the window
    around a step's typical duration in which the parent polls for its reply, only with fewer
    processes than cores. Spinning pays off for fast simulators with few envs per process, where
    a wake-up costs as much as a step; set 0 (always block) when cores are shared with other
    work. docs/benchmarks.md has the measurements."""
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
    nonfinite: Literal["error", "drop"] = "error"
    """What a NaN or inf in an env's observation or reward does. ``error``: the run stops with
    one message naming the env, its index and seed (before the value reaches the policy).
    ``drop``: that env's episode ends there, with a warning: the step is recorded as a time-limit
    cut at the last finite observation with reward 0 (the learner bootstraps from that
    observation's value; nothing non-finite reaches it), the env is reset (a batched simulator,
    which cannot reset one env, has that row masked so until it ends the episode), the step does not
    count towards ``algo.total_env_steps``, the episode is left out of ``train/episode_return``
    and counted in ``env/nonfinite_episodes``. Checked on the whole batch at once (one
    ``isfinite`` per array and step)."""
    timeout_s: float = 60.0
    """Longest wait for one call of the envs (a reset, a step, a chunk of steps, a render): one
    reply of an env process (multiprocess backend) or of the envs' own thread (in-process
    backend). An env that takes longer is stuck (a hanging simulator): the run stops naming it
    (its envs and their seeds), and its Python stack goes to its log. Below
    ``cluster.timeout_s``, so the env's own message comes first."""
    start_timeout_s: float = 600.0
    """Longest wait for the envs to be built (simulator imports, asset loading): the env
    processes starting and building theirs (multiprocess backend), or the in-process backend's
    envs in their thread."""

    def __post_init__(self) -> None:
        problems = []
        if self.num_envs < 1:
            problems.append(f"env.num_envs must be >= 1 (got {self.num_envs})")
        if self.num_procs < 0:
            problems.append(f"env.num_procs must be >= 0 (0: one per core; got {self.num_procs})")
        if self.worker_spin_us < 0:
            problems.append(f"env.worker_spin_us must be >= 0 (got {self.worker_spin_us})")
        for key in ("timeout_s", "start_timeout_s"):
            if not getattr(self, key) > 0:
                problems.append(f"env.{key} must be > 0 seconds (got {getattr(self, key)})")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            problems.append(f"env.max_episode_steps must be >= 1 or null (got {self.max_episode_steps})")
        for key in ("image_size", "render_size"):
            if getattr(self, key) < 8:
                problems.append(f"env.{key} must be >= 8 pixels (got {getattr(self, key)})")
        if problems:
            raise ValueError("; ".join(problems))
