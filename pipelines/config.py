"""The schema of an embodied training run: ``embodied train RECIPE key=value ...`` builds an
:class:`EmbodiedConfig`. What every workflow's run shares is here too: :class:`RunConfig`, the
base of every workflow's schema (the recipe, the seed, resuming, and the ``run``, ``checkpoint``,
``cluster``, ``logging`` and ``plan`` sections the Runner reads)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from embodied.algorithms import AlgoConfig
from embodied.runtime.cluster import ClusterConfig
from envs.config import EnvConfig
from envs.registry import takes_device
from policies.config import PolicyConfig


@dataclass
class RunDirConfig:
    """Where the run writes."""

    dir: str | None = None
    """Run directory; default ``runs/<recipe>-<timestamp>``."""
    log_every_s: float = 10.0
    """Seconds between plain progress lines when stdout is not a terminal."""

    def __post_init__(self) -> None:
        if self.log_every_s <= 0:
            raise ValueError(f"run.log_every_s must be > 0 (got {self.log_every_s})")


@dataclass
class CheckpointConfig:
    """When checkpoints are written and how many are kept (``checkpoint.*`` keys)."""

    every: int = 10
    """Save a checkpoint every N iterations (and always at the end); 0 saves only at the end.
    Lower it when iterations are long and a crash would lose much work."""
    keep: int = 3
    """The most recent checkpoints kept on disk (at least 1)."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"checkpoint.every must be >= 0 (got {self.every})")
        if self.keep < 1:
            raise ValueError(f"checkpoint.keep must be >= 1 (got {self.keep})")


@dataclass
class EmbodiedAlgoConfig(AlgoConfig):
    """The RL algorithm (``algo.*``): PPO or GRPO, and how much experience an iteration collects."""

    total_env_steps: int = 100_000
    """Training budget in env steps (summed over all envs); the run does whole iterations."""
    rollout_steps: int = 128
    """Decisions per env per iteration (T): env steps, or action chunks of ``policy.action_chunk``
    env steps each. For GRPO it must cover an episode (one episode per env per iteration)."""
    staleness: int = 0
    """Weight versions the rollout may lag behind the trainer. 0: strictly on-policy (collect, then
    train). 1: the trainer updates on the previous iteration's batch while the next one is collected
    with weights one version behind (PPO's ratio to the behaviour policy accounts for the lag), so
    training overlaps simulation and inference; the planner then gives the trainer devices of its
    own where that is faster. A resumed run starts by collecting again."""

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        if self.total_env_steps < 1:
            problems.append(f"algo.total_env_steps must be >= 1 (got {self.total_env_steps})")
        if self.rollout_steps < 1:
            problems.append(f"algo.rollout_steps must be >= 1 (got {self.rollout_steps})")
        if self.staleness not in (0, 1):
            problems.append(f"algo.staleness must be 0 (on-policy) or 1 (train beside the next collection), got {self.staleness}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class WorkersConfig:
    """How many ranks of each worker and the resources of each rank."""

    env: int = 1
    """Env worker ranks (each steps ``env.num_envs`` envs)."""
    rollout: int = 1
    """Rollout (inference) worker ranks."""
    trainer: int = 1
    """Trainer ranks, data parallel: processes joined by torch.distributed (gloo on CPU, NCCL on
    CUDA). Each receives the whole batch and trains on its block of every minibatch; gradients are
    summed over the ranks, so N ranks take the steps one rank would (up to float rounding).
    Checkpoints hold whole tensors: a run resumes onto any number of ranks. Needs
    ``cluster.backend=ray``."""
    trainer_strategy: Literal["ddp", "fsdp"] = "ddp"
    """How trainer ranks share the model. ``ddp``: every rank holds all of it (torch's
    DistributedDataParallel). ``fsdp``: parameters, gradients and optimizer state sharded over
    the ranks (FSDP2 ``fully_shard``), for models that do not fit one device; not with the
    trainer offloading between phases."""
    env_cpus: float = 1.0
    """CPUs reserved per env rank (fractions let workers share cores)."""
    rollout_cpus: float = 0.5
    """CPUs reserved per rollout rank."""
    trainer_cpus: float = 0.5
    """CPUs reserved for the trainer, split between its ranks (``workers.trainer``)."""
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
    env_device: str = "auto"
    """Device the env's simulator runs on: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (a batched
    simulator's own ``env.kwargs.device``, whose ``auto`` is a GPU where CUDA is available; any
    other backend: CPU). Set, it becomes ``env.kwargs.device`` (over the kwargs' own) of an env
    whose adapter builds its simulator there (MJX); other envs get no device argument (ManiSkill
    picks its GPU itself; a user's env may run on CUDA itself). On CUDA the planner costs the env
    as a GPU component sharing the GPU with the rollout and trainer, and each env rank reserves
    its GPU (a share when colocated)."""
    env_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each env rank asks for, e.g. ``{node_env: 1}`` to run env workers only
    on nodes started with ``ray start --resources='{"node_env": 4}'`` (see docs/cluster.md)."""
    rollout_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each rollout rank asks for (as ``env_resources``)."""
    trainer_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each trainer rank asks for (as ``env_resources``)."""

    def __post_init__(self) -> None:
        problems = [f"workers.{k} must be > 0 (got {getattr(self, k)})"
                    for k in ("env_cpus", "rollout_cpus", "trainer_cpus") if getattr(self, k) <= 0]
        if self.trainer < 1:
            problems.append(f"workers.trainer must be >= 1 (got {self.trainer})")
        for k in ("env_resources", "rollout_resources", "trainer_resources"):
            bad = {name: v for name, v in getattr(self, k).items()
                   if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0 or name in ("CPU", "GPU")}
            if bad:
                problems.append(f"workers.{k} maps custom Ray resource names to amounts > 0 (CPUs and GPUs have "
                                f"keys of their own: workers.*_cpus, workers.*_device); got {bad}")
        problems += [f"workers.{k} must be >= 1 (got {getattr(self, k)})"
                     for k in ("rollout_threads", "trainer_threads") if getattr(self, k) < 1]
        for k in ("rollout_device", "trainer_device", "env_device"):
            v = getattr(self, k)
            if v not in ("cpu", "cuda", "auto") and not (v.startswith("cuda:") and v[5:].isdigit()):
                problems.append(f"workers.{k} must be cpu, cuda, cuda:N or auto (got {v!r})")
        if problems:
            raise ValueError("; ".join(problems))


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

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"eval.episodes must be >= 1 (got {self.episodes})")
        if self.num_envs is not None and self.num_envs < 1:
            raise ValueError(f"eval.num_envs must be >= 1 or null (got {self.num_envs})")
        if self.every < 0:
            raise ValueError(f"eval.every must be >= 0 (got {self.every})")


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

    mode: Literal["auto", "colocated", "disaggregated", "hybrid", "shared", "streams"] = "auto"
    """Placement mode; ``auto`` lets the planner choose from the profile. ``shared`` (env and
    rollout unpinned on all cores, the rollout in one-thread lanes; docs/planner.md) needs an
    ``inprocess`` env and ``cluster.backend=ray``. ``streams`` (the cores cut into streams, each
    one process pinned to its cores that steps one chunk and acts in it) needs ``workers.env=1`` and
    ``cluster.backend=ray``."""
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
    calibrate: float = 0.1
    """Calibration before the run settles on a plan: the planner's best candidates run the first
    training iterations, each for a few (the planner's choice up to 16 s of them, the others about
    4 s), and the fastest measured one is kept, its prediction
    corrected by what it measured (docs/planner.md#calibration). The most of the run's iterations
    calibration may run under plans other than the planner's choice (measuring the choice itself
    costs nothing: the run would run it anyway); 0 keeps the planner's first choice and its
    probe-based prediction."""
    calibrate_margin: float = 0.05
    """Calibration measures a candidate while its price corrected by what was measured is below
    (1 + this) x the best measured plan's (and the budget holds it); larger measures more of the
    candidates the model ranks behind, for a user who would rather measure than trust it."""
    replan_threshold: float = 0.25
    """Re-plan between iterations when the median measured iteration time of a window of
    iterations differs from the prediction by more than this fraction (0 disables re-planning)."""
    learn: bool = True
    """Learn from the run: after its first iterations, the measured seconds per call of each
    component refine the cached profile (with the run recorded in its ``meta.learned``), so the
    next run with the same env, policy and hardware plans from what this one measured."""

    def __post_init__(self) -> None:
        if self.max_chunks < 1:
            raise ValueError(f"plan.max_chunks must be >= 1 (got {self.max_chunks})")
        if not 0 <= self.calibrate <= 1:
            raise ValueError(f"plan.calibrate is a share of the run's iterations, in [0, 1] (got {self.calibrate})")
        if self.calibrate_margin < 0:
            raise ValueError(f"plan.calibrate_margin must be >= 0 (got {self.calibrate_margin})")
        if self.replan_threshold < 0:
            raise ValueError(f"plan.replan_threshold must be >= 0 (got {self.replan_threshold})")
        if self.offload is not None and set(self.offload) - {"env", "rollout", "trainer"}:
            raise ValueError(f"plan.offload names components env, rollout or trainer (got {self.offload})")


@dataclass
class WarmStartConfig:
    """Behaviour cloning before RL (``warmstart.*``): demonstrations of an expert, recorded as the
    policy sees them, and a few epochs of their negative log-likelihood through the policy's
    ``evaluate`` (token policies score the action tokens of ``encode_actions``). The result is
    cached by config; ``policy.init`` is set to it. docs/vla.md#warm-start."""

    expert: str | None = None
    """Who demonstrates: ``package.module:function`` (a scripted expert: a batch of observations,
    numpy, -> env actions (N, A)), or a run dir of a trained policy that acts on this env's
    ``state`` observation (e.g. a state-PPO run of the same task; ManiSkill: ``env.obs_mode=state+rgb``
    gives the VLA its images and the expert its state). None: no warm start."""
    episodes: int = 64
    """Demonstration episodes kept."""
    num_envs: int = 8
    """Envs that record demonstrations in parallel."""
    successful_only: bool = True
    """Keep only the episodes the expert finished successfully (envs without a success signal: all)."""
    expert_noise: float = 0.0
    """Gaussian noise (std, in units of half the action range) added to the action the env executes,
    while the expert's own action is recorded: demonstrations then show how to recover from small
    errors (DART)."""
    epochs: int = 20
    """Passes over the demonstrations, at most."""
    batch_size: int = 64
    """Frames per optimizer step."""
    lr: float = 1.0e-3
    """Adam learning rate."""
    max_grad_norm: float = 1.0
    """Gradient norm clip."""
    val_fraction: float = 0.1
    """Share of the episodes held out to measure the validation NLL (at least one when there are two)."""
    stop_at_success: float = 0.0
    """Stop once the evaluated success rate reaches this (0: run every epoch). A warm start that
    already succeeds often leaves RL little to show; one that never succeeds gives GRPO no signal."""
    eval_every: int = 1
    """Epochs between the evaluations of ``stop_at_success``."""
    eval_episodes: int = 32
    """Episodes per evaluation of ``stop_at_success``."""
    eval_deterministic: bool = False
    """Evaluate ``stop_at_success`` with the policy's mode; False samples, as RL's rollouts do."""
    time_budget_s: float = 0.0
    """Stop training after this many seconds (0: no limit)."""

    def __post_init__(self) -> None:
        problems = [f"warmstart.{k} must be >= 1 (got {getattr(self, k)})"
                    for k in ("episodes", "num_envs", "epochs", "batch_size", "eval_every", "eval_episodes") if getattr(self, k) < 1]
        if self.lr <= 0 or self.max_grad_norm <= 0:
            problems.append("warmstart.lr and warmstart.max_grad_norm must be > 0")
        if self.expert_noise < 0 or self.time_budget_s < 0:
            problems.append("warmstart.expert_noise and warmstart.time_budget_s must be >= 0")
        if not 0 <= self.val_fraction < 1 or not 0 <= self.stop_at_success <= 1:
            problems.append("warmstart.val_fraction must be in [0, 1) and warmstart.stop_at_success in [0, 1]")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class RunConfig:
    """What every workflow's run has, whatever it trains: the base of each workflow's schema,
    which adds its own sections (workers, model, algorithm, evaluation). The Runner reads these
    keys and three of the workflow's: ``algo.lr``, ``algo.anneal_lr`` (the learning rate it hands
    each iteration) and ``eval.every``."""

    workflow: str = ""
    """The workflow this schema belongs to (set by the recipe; each workflow's schema names its own)."""
    recipe: str = ""
    """Name of the recipe this run started from."""
    description: str = ""
    """One line on what the recipe trains."""
    seed: int = 0
    """Seeds torch, numpy and python, and each worker's random streams."""
    resume: str | None = None
    """A run dir to continue from its latest checkpoint."""
    resume_fallback: bool = False
    """With ``resume``: when the latest checkpoint is corrupt (a kill or a full disk while it was
    written), continue from the newest intact one instead of stopping with an error."""
    run: RunDirConfig = field(default_factory=RunDirConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)


@dataclass
class EmbodiedConfig(RunConfig):
    """A training run of an embodied policy: envs, rollout and trainer workers, PPO or GRPO."""

    workflow: Literal["embodied"] = "embodied"
    """The workflow this schema belongs to (set by the recipe; ``embodied`` here)."""
    seed: int = 0
    """Seeds torch, numpy, python and the envs (env i of worker r gets seed + 1000 * r + i)."""
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: EmbodiedAlgoConfig = field(default_factory=EmbodiedAlgoConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        problems = []
        if self.plan.chunks is not None and not 1 <= self.plan.chunks <= self.env.num_envs:
            problems.append(f"plan.chunks must be between 1 and env.num_envs={self.env.num_envs} (got {self.plan.chunks})")
        if self.workers.env < 1 or self.workers.rollout < 1:
            problems.append("workers.env and workers.rollout must be >= 1")
        if self.plan.mode == "streams" and (self.workers.env != 1 or self.cluster.backend != "ray"):
            problems.append("plan.mode=streams splits one env worker's envs over processes pinned to the streams' "
                            f"cores: it needs workers.env=1 and cluster.backend=ray (got workers.env={self.workers.env}, "
                            f"cluster.backend={self.cluster.backend}); or leave plan.mode=auto")
        envs = self.workers.env * self.env.num_envs
        ranks = self.workers.trainer
        if (ranks > 1 or self.workers.trainer_strategy == "fsdp") and self.cluster.backend != "ray":
            what = f"workers.trainer={ranks}" if ranks > 1 else "workers.trainer_strategy=fsdp"
            problems.append(f"{what} runs the trainer's ranks as processes of a process group: it needs "
                            "cluster.backend=ray (the local backend runs every worker in this one process)")
        minibatch = envs * self.algo.rollout_steps // self.algo.num_minibatches
        if ranks > minibatch:
            problems.append(f"workers.trainer={ranks} ranks split each minibatch of {minibatch} samples (workers.env x "
                            "env.num_envs x algo.rollout_steps / algo.num_minibatches): use at most that many ranks")
        if self.workers.trainer_strategy == "fsdp" and "trainer" in (self.plan.offload or []):
            problems.append("workers.trainer_strategy=fsdp keeps the trainer's shards on its devices: drop trainer from "
                            "plan.offload, or use workers.trainer_strategy=ddp")
        if self.workers.env_device != "auto" and takes_device(self.env):
            # the env is built where the planner and Ray place it (workers.env_device wins over the kwargs')
            self.env = dataclasses.replace(self.env, kwargs={**self.env.kwargs, "device": self.workers.env_device})
        if self.algo.name == "grpo" and envs % self.algo.group_size:
            problems.append(f"GRPO starts envs in groups of algo.group_size={self.algo.group_size}: the "
                            f"{envs} envs (workers.env x env.num_envs) must be a multiple of it")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def steps_per_iteration(self) -> int:
        """Env steps an iteration asks for (an env whose episode ends inside an action chunk skips
        the rest of that chunk, so it may take a few less)."""
        return self.workers.env * self.env.num_envs * self.algo.rollout_steps * self.policy.action_chunk
