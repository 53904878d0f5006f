"""The schema of an off-policy run (``workflow: offpolicy``): SAC or RLPD from a replay buffer.

    embodied train maniskill_pushcube_sac algo.utd=1.0 checkpoint.replay=true

Each iteration every env steps ``algo.rollout_steps`` times (``workers.env x env.num_envs x
rollout_steps`` transitions: ManiSkill's ``training_freq``), and the trainer takes ``algo.utd``
gradient steps per transition once the buffer holds ``algo.learning_starts`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from embodied.algorithms.sac import SACConfig
from envs.config import EnvConfig
from pipelines.config import CheckpointConfig, EvalConfig, RunConfig


@dataclass
class OffPolicyAlgoConfig(SACConfig):
    """The algorithm (``algo.*``: SAC or RLPD, see embodied/algorithms/sac.py) and the off-policy
    schedule: how much each iteration collects, the buffer, when updates start, how many per step."""

    total_env_steps: int = 1_000_000
    """Training budget in env steps (summed over all envs); the run does whole iterations."""
    rollout_steps: int = 2
    """Env steps per env per iteration (with 32 envs: ManiSkill's ``training_freq`` of 64)."""
    buffer_size: int = 1_000_000
    """Transitions the replay buffer holds (the oldest are overwritten), on the trainer's device."""
    learning_starts: int = 4000
    """Transitions in the buffer before the first update; until then the envs act uniformly at random."""
    utd: float = 0.5
    """Update-to-data ratio: gradient steps per transition collected (fractions carry over between
    iterations)."""
    sync_every: int = 1
    """Gradient steps between weight syncs to the env workers: the actors get the trainer's
    weights at the start of the first iteration after this many updates."""
    overlap: bool = False
    """Train beside the next collection: the envs step with the weights of the last sync while the
    trainer takes the updates owed for the data collected before (one iteration's lag). False:
    collect, then update (ManiSkill's order)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        for key in ("total_env_steps", "rollout_steps", "buffer_size", "sync_every"):
            if getattr(self, key) < 1:
                problems.append(f"algo.{key} must be >= 1 (got {getattr(self, key)})")
        if self.learning_starts < 0 or self.utd < 0:
            problems.append(f"algo.learning_starts and algo.utd must be >= 0 (got {self.learning_starts}, {self.utd})")
        if self.learning_starts > self.buffer_size:
            problems.append(f"algo.learning_starts ({self.learning_starts}) cannot exceed algo.buffer_size ({self.buffer_size})")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class OffPolicyWorkersConfig:
    """The env worker ranks and the trainer, and where each runs."""

    env: int = 1
    """Env worker ranks (each steps ``env.num_envs`` envs with its copy of the actor)."""
    env_cpus: float = 1.0
    """CPUs reserved per env rank."""
    trainer_cpus: float = 1.0
    """CPUs reserved for the trainer."""
    env_threads: int = 1
    """torch threads of each env rank (its actor's inference)."""
    trainer_threads: int = 1
    """torch threads of the trainer."""
    trainer_device: str = "cpu"
    """Device of the trainer and its replay buffer: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""
    rollout_device: str = "cpu"
    """Device of evaluation."""

    def __post_init__(self) -> None:
        problems = []
        if self.env < 1 or self.env_threads < 1 or self.trainer_threads < 1:
            problems.append("workers.env, workers.env_threads and workers.trainer_threads must be >= 1")
        if self.env_cpus <= 0 or self.trainer_cpus <= 0:
            problems.append("workers.env_cpus and workers.trainer_cpus must be > 0")
        for key in ("trainer_device", "rollout_device"):
            v = getattr(self, key)
            if v not in ("cpu", "cuda", "auto") and not (v.startswith("cuda:") and v[5:].isdigit()):
                problems.append(f"workers.{key} must be cpu, cuda, cuda:N or auto (got {v!r})")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class OffPolicyCheckpointConfig(CheckpointConfig):
    """Checkpoints (``checkpoint.*``), optionally with the replay buffer."""

    replay: bool = False
    """Save the replay buffer (and the demonstrations) with every checkpoint, so a resumed run
    samples exactly what the run would have; the files grow with the buffer. False: a resumed
    run refills the buffer: ``algo.learning_starts`` transitions, collected at random, before it
    updates again."""


@dataclass
class DemosConfig:
    """Demonstrations for RLPD (``demos.*``): an expert's episodes recorded as transitions at the
    start of the run and mixed into every batch at ``algo.demo_ratio``."""

    path: list[str] | None = None
    """Demonstration files in ManiSkill's trajectory format (``.h5`` with its ``.json``), e.g. the
    scripted expert's of ``embodied demos PickCube-v1 obs_mode=state``, recorded on this env's task,
    controller and ``state`` observation; read as transitions with their recorded rewards."""
    expert: str | None = None
    """Or who demonstrates when the run starts: ``package.module:function`` (a scripted expert:
    observations -> env actions) or the run dir of a trained policy on this env's ``state`` (e.g. a
    ``maniskill_pickcube_ppo`` run). Neither: no demonstrations (``algo.name=rlpd`` needs them)."""
    episodes: int = 50
    """Episodes kept (of an expert; of the files: at most this many)."""
    num_envs: int = 8
    """Envs that record in parallel."""
    successful_only: bool = True
    """Keep only the episodes the expert finished successfully (envs without a success signal: all)."""
    max_attempts: int = 0
    """Most episodes the expert runs to find ``episodes`` kept ones; 0: 4 x ``episodes``."""

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.num_envs < 1 or self.max_attempts < 0:
            raise ValueError("demos.episodes and demos.num_envs must be >= 1, demos.max_attempts >= 0")
        if self.path is not None and self.expert is not None:
            raise ValueError("demos.path and demos.expert are two sources of demonstrations: set one of them")

    @property
    def given(self) -> bool:
        """Whether the run has demonstrations (files or an expert)."""
        return bool(self.path) or self.expert is not None


@dataclass
class OffPolicyConfig(RunConfig):
    """An off-policy run: env workers that step continuously and a trainer with a replay buffer."""

    workflow: Literal["offpolicy"] = "offpolicy"
    """The workflow this schema belongs to (``offpolicy``)."""
    seed: int = 0
    """Seeds torch, numpy, python and the envs (env i of worker r gets seed + 1000 * r + i)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    workers: OffPolicyWorkersConfig = field(default_factory=OffPolicyWorkersConfig)
    algo: OffPolicyAlgoConfig = field(default_factory=OffPolicyAlgoConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: OffPolicyCheckpointConfig = field(default_factory=OffPolicyCheckpointConfig)
    demos: DemosConfig = field(default_factory=DemosConfig)

    def __post_init__(self) -> None:
        problems = []
        if self.plan.chunks is not None and not 1 <= self.plan.chunks <= self.env.num_envs:
            problems.append(f"plan.chunks must be between 1 and env.num_envs={self.env.num_envs} (got {self.plan.chunks})")
        if self.algo.name == "rlpd" and not self.demos.given:
            problems.append("algo.name=rlpd mixes demonstrations into every batch: set demos.path (ManiSkill trajectory "
                            "files, e.g. of `embodied demos ENV_ID obs_mode=state`) or demos.expert (a run dir of a "
                            "trained state policy, or package.module:function)")
        if self.algo.buffer_size < self.num_envs:
            problems.append(f"algo.buffer_size ({self.algo.buffer_size}) must hold one step of all {self.num_envs} envs")
        if self.env.obs_mode != "state":
            problems.append(f"the off-policy workflow trains on state observations: env.obs_mode=state (got {self.env.obs_mode!r})")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def num_envs(self) -> int:
        """Envs over all env workers (the replay buffer's env streams)."""
        return self.workers.env * self.env.num_envs

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.algo.rollout_steps

