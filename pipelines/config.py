"""The schema of a training run: ``embodied train RECIPE key=value ...`` builds a :class:`TrainConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from embodied.runtime.cluster import ClusterConfig
from envs.config import EnvConfig
from policies.config import PolicyConfig


@dataclass
class RunConfig:
    """Where the run writes and how often."""

    dir: str | None = None
    """Run directory; default ``runs/<recipe>-<timestamp>``."""
    checkpoint_every: int = 10
    """Save a checkpoint every N iterations (and always at the end); 0 saves only at the end."""
    keep_checkpoints: int = 3
    """Number of most recent checkpoints kept on disk."""
    log_every_s: float = 10.0
    """Seconds between plain log lines when stdout is not a terminal."""


@dataclass
class PPOConfig:
    """Proximal Policy Optimization (``algo.*`` keys)."""

    total_env_steps: int = 100_000
    """Training budget in env steps (summed over all envs)."""
    rollout_steps: int = 128
    """Decisions per env per iteration (the rollout length T): env steps, or action chunks of
    ``policy.action_chunk`` env steps each."""
    lr: float = 3e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Linearly decay the learning rate to 0 over the budget."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    epochs: int = 4
    """Passes over each iteration's data."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    clip_ratio: float = 0.2
    """PPO ratio clip."""
    dual_clip: float | None = None
    """Dual-clip bound (> 1) for negative advantages; None disables it."""
    value_clip: float | None = 0.2
    """Clip of the value update around the old values; None disables it."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Gradient norm clip."""
    target_kl: float | None = None
    """Stop the epoch loop early when the approximate KL exceeds this; None never stops."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    reward_scale: float = 1.0
    """Multiply rewards by this before GAE."""
    bootstrap_terminated: bool = False
    """Bootstrap from the value of the final observation on termination too, as ManiSkill's own PPO
    baselines do. For tasks that terminate on *success* this values reaching the goal like staying
    there, not like a dead end (with a small gamma an agent otherwise learns to hover next to the
    goal, collecting shaped reward). Leave it off where termination means failure (falling over)."""
    staleness: int = 0
    """Weight versions the rollout may lag behind the trainer. 0: strictly on-policy (collect, then
    train). 1: the trainer updates on the previous iteration's trajectories while the next ones are
    collected with weights one version behind, so training overlaps simulation and inference (PPO's
    ratio to the behaviour policy's log-probs accounts for the lag); the planner then gives the
    trainer devices of its own where that is faster. A resumed run starts by collecting again: the
    batch that awaited training at the checkpoint is not saved."""


@dataclass
class WorkersConfig:
    """How many ranks of each worker and the resources of each rank."""

    env: int = 1
    """Env worker ranks (each steps ``env.num_envs`` envs)."""
    rollout: int = 1
    """Rollout (inference) worker ranks."""
    env_cpus: float = 1.0
    """CPUs reserved per env rank (fractions let workers share cores)."""
    rollout_cpus: float = 0.5
    """CPUs reserved per rollout rank."""
    trainer_cpus: float = 0.5
    """CPUs reserved for the trainer."""
    rollout_threads: int = 1
    """torch intra-op threads of each rollout rank (and of env ranks, which use torch only for
    batched simulators) when the run is not planned (``plan.profile=false``); a plan sets them
    from its placement."""
    trainer_threads: int = 1
    """torch threads of the trainer when the run is not planned (small MLPs train fastest on one
    thread; raise it for big models)."""
    rollout_device: str = "cpu"
    """Device of rollout inference and of evaluation: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""
    trainer_device: str = "cpu"
    """Device of the trainer: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""


@dataclass
class EvalConfig:
    """Evaluation episodes (``eval.*`` keys)."""

    episodes: int = 10
    """Episodes per evaluation."""
    num_envs: int | None = None
    """Parallel envs for evaluation; default ``min(episodes, env.num_envs)``."""
    every: int = 0
    """Evaluate every N iterations; 0 only at the end."""
    deterministic: bool = True
    """Take the policy's mode instead of sampling."""
    video: bool = False
    """Record the final evaluation to ``videos/`` as mp4 (envs that can render)."""


@dataclass
class LoggingConfig:
    """Where metrics go (``logging.*`` keys)."""

    tensorboard: bool = True
    """Write TensorBoard event files to the run dir."""
    wandb: bool = True
    """Log to a wandb run in the run dir (offline unless WANDB_MODE=online or wandb_mode=online)."""
    wandb_project: str = "embodied"
    """wandb project name."""
    wandb_mode: str | None = None
    """wandb mode (``offline``, ``online``, ``disabled``); default: $WANDB_MODE or ``offline``."""
    progress: Literal["auto", "bar", "lines", "none"] = "auto"
    """``auto``: a live bar on a terminal, plain periodic lines otherwise."""


@dataclass
class PlanConfig:
    """How the M2Flow planner shapes the micro flow (``plan.*`` keys)."""

    mode: Literal["auto", "colocated", "disaggregated", "hybrid"] = "auto"
    """Placement mode; ``auto`` lets the planner choose from the profile."""
    chunks: int | None = None
    """Env micro-chunks per env worker; None lets the planner choose."""
    profile: bool = True
    """Profile the components and plan from the measurements (cached per env, policy and
    hardware). False skips both: every worker on every core, ``chunks`` (default 1) as given."""
    reprofile: bool = False
    """Measure again even when a cached profile exists."""
    max_chunks: int = 8
    """Largest chunk count the planner considers."""
    offload: list[str] | None = None
    """Force these components (``trainer``) to offload between phases; None follows the plan."""
    replan_threshold: float = 0.25
    """Re-plan between iterations when the measured iteration time differs from the prediction by
    more than this fraction for two iterations in a row (0 disables re-planning)."""


@dataclass
class TrainConfig:
    """A whole training run."""

    recipe: str = ""
    """Name of the recipe this run started from."""
    description: str = ""
    """One line on what the recipe trains."""
    seed: int = 0
    """Seeds torch, numpy, python and the envs (env i of worker r gets seed + 1000 * r + i)."""
    resume: str | None = None
    """A run dir to continue from its latest checkpoint."""
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: PPOConfig = field(default_factory=PPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)

    def __post_init__(self) -> None:
        problems = []
        if self.algo.rollout_steps < 1:
            problems.append(f"algo.rollout_steps must be >= 1 (got {self.algo.rollout_steps})")
        if self.algo.num_minibatches < 1:
            problems.append(f"algo.num_minibatches must be >= 1 (got {self.algo.num_minibatches})")
        if self.algo.staleness not in (0, 1):
            problems.append(f"algo.staleness must be 0 (on-policy) or 1 (train beside the next collection), got {self.algo.staleness}")
        if self.algo.dual_clip is not None and self.algo.dual_clip <= 1:
            problems.append(f"algo.dual_clip must be > 1 (got {self.algo.dual_clip})")
        if self.plan.chunks is not None and not 1 <= self.plan.chunks <= self.env.num_envs:
            problems.append(f"plan.chunks must be between 1 and env.num_envs={self.env.num_envs} (got {self.plan.chunks})")
        if self.workers.env < 1 or self.workers.rollout < 1:
            problems.append("workers.env and workers.rollout must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def steps_per_iteration(self) -> int:
        """Env steps an iteration asks for (an env whose episode ends inside an action chunk skips
        the rest of that chunk, so it may take a few less)."""
        return self.workers.env * self.env.num_envs * self.algo.rollout_steps * self.policy.action_chunk
