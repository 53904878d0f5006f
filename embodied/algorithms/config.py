"""The algorithm's typed config (``algo.*`` keys), with veRL's option names and TRL's as aliases.

Which keys matter for which algorithm:

* both: ``name``, ``adv_estimator``, ``lr``, ``epochs``, ``num_minibatches``, ``micro_batch_size``,
  the clip range (``clip_ratio``, ``clip_ratio_low``/``_high``, ``clip_ratio_c``), ``entropy_coeff``,
  ``loss_agg_mode``, ``max_grad_norm``, ``target_kl``, ``rollout_is*``, ``reward_scale``,
  ``norm_adv`` (on for PPO, off for GRPO unless set);
* critic-based advantages (``gae``, PPO's default): ``gamma``, ``gae_lambda``,
  ``bootstrap_terminated``, ``vf_coef``, ``value_clip``;
* group advantages (``grpo``, ``rloo``, GRPO's default): ``group_size``, ``norm_adv_by_std_in_grpo``,
  ``outcome``, ``filter_groups``; a frozen reference policy with ``use_kl_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from embodied.config import Alias
from embodied.rl.aggregation import LOSS_AGG_ALIASES, LOSS_AGG_MODES
from embodied.rl.kl import KL_ESTIMATORS


def _scale_rewards(value: object) -> bool:
    """TRL's ``scale_rewards`` (``group``/``batch``/``none`` or a bool) as ``norm_adv_by_std_in_grpo``."""
    if isinstance(value, bool):
        return value
    table = {"group": True, "batch": True, "none": False}
    if value not in table:
        raise ValueError(f"expects 'group', 'none' or a bool, got {value!r}")
    return table[value]


def _loss_type(value: object) -> str:
    """TRL's ``loss_type`` names as veRL's ``loss_agg_mode``."""
    if value in LOSS_AGG_ALIASES:
        return LOSS_AGG_ALIASES[value].mode
    return str(value)


@dataclass
class AlgoConfig:
    """The RL algorithm: PPO or GRPO, how advantages are estimated and how the loss is formed."""

    ALIASES: ClassVar[dict[str, Alias]] = {
        # TRL (GRPOConfig) and this project's earlier names
        "num_generations": ("group_size", None),
        "epsilon": ("clip_ratio_low", None),
        "epsilon_high": ("clip_ratio_high", None),
        "beta": ("kl_loss_coef", None),
        "scale_rewards": ("norm_adv_by_std_in_grpo", _scale_rewards),
        "loss_type": ("loss_agg_mode", _loss_type),
        "num_iterations": ("epochs", None),
        "entropy_coef": ("entropy_coeff", None),
        "ent_coef": ("entropy_coeff", None),
        "dual_clip": ("clip_ratio_c", None),
    }

    name: Literal["ppo", "grpo"] = "ppo"
    """``ppo``: clipped surrogate plus a value loss on a critic. ``grpo``: critic-free, advantages
    relative to a group of rollouts from the same initial state (or prompt)."""
    adv_estimator: str | None = None
    """How advantages are estimated: ``gae`` (needs a critic), ``grpo`` (group mean and std),
    ``rloo`` (leave-one-out group baseline). None: ``gae`` for ppo, ``grpo`` for grpo."""
    lr: float = 3e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    epochs: int = 4
    """Passes over each iteration's samples (TRL: ``num_iterations``)."""
    num_minibatches: int = 4
    """Optimizer steps per epoch: the samples are shuffled and cut into this many minibatches."""
    micro_batch_size: int | None = None
    """Samples per forward/backward pass; a minibatch larger than this accumulates gradients over
    micro-batches (same loss and gradient, less memory). None: whole minibatches. Raise it for
    speed, lower it when a large model runs out of memory."""
    gamma: float = 0.99
    """Discount factor per env step (GAE)."""
    gae_lambda: float = 0.95
    """GAE lambda: 1 is the Monte-Carlo return, 0 the one-step TD error."""
    bootstrap_terminated: bool = False
    """Bootstrap from the value of the final observation on termination too, as ManiSkill's own PPO
    baselines do. Turn it on for tasks that terminate on *success* (reaching the goal is then worth
    as much as staying there); leave it off where termination means failure (falling over)."""
    reward_scale: float = 1.0
    """Multiply env rewards by this before estimating advantages (for large-magnitude rewards)."""
    clip_ratio: float = 0.2
    """PPO's ratio clip epsilon: the default of both ends of the clip range."""
    clip_ratio_low: float | None = None
    """Lower clip epsilon (ratio >= 1 - low); None: ``clip_ratio`` (TRL: ``epsilon``)."""
    clip_ratio_high: float | None = None
    """Upper clip epsilon (ratio <= 1 + high); None: ``clip_ratio``. DAPO's clip-higher uses 0.28
    to keep exploration alive (TRL: ``epsilon_high``)."""
    clip_ratio_c: float | None = None
    """Dual clip (> 1): caps the loss of negative-advantage samples at ``-c * A`` so one sample the
    new policy made far more likely cannot dominate; veRL uses 3.0. None disables it."""
    value_clip: float | None = 0.2
    """Clip of the value update around the old values (PPO2); None disables it."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coeff: float = 0.0
    """Entropy bonus weight. Keep 0 for GRPO on language models (a bonus there tends to blow up)."""
    max_grad_norm: float = 0.5
    """Gradient norm clip."""
    target_kl: float | None = None
    """Stop an iteration's epochs early once the approximate KL to the behaviour policy exceeds
    this; None never stops."""
    critic_warmup: int = 0
    """PPO: the first N updates of a run train only the critic (the policy's ``critic_parameters``:
    its value head), so that RL from an SFT or pretrained policy starts from a critic fitted to it
    rather than following a random critic's advantages. Counted by the trainer's weight version, so
    a resumed run does not warm up again."""
    norm_adv: bool | None = None
    """Normalize advantages to mean 0 / std 1 per minibatch. None: the algorithm's habit, on for
    PPO, off for GRPO (group advantages are normalized per group already; switch it on where they
    are not, e.g. Dr. GRPO's, or per-step returns-to-go)."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses become one number: ``token-mean`` (every token of the minibatch weighs
    the same, independent of micro-batching), ``seq-mean-token-sum``, ``seq-mean-token-mean`` (the
    original GRPO), ``seq-mean-token-sum-norm`` (Dr. GRPO). For action-level policies (one entry
    per decision) every mode is the mean over decisions. TRL's ``loss_type`` names are accepted."""
    loss_scale_factor: float | None = None
    """Divisor of ``seq-mean-token-sum-norm``; None: the number of scored tokens per sample."""
    group_size: int = 8
    """Rollouts per group (GRPO): envs reset to the same initial state, or samples per prompt
    (veRL: ``rollout.n``, TRL: ``num_generations``). The number of envs must be a multiple."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-centred rewards by the group's std (GRPO); False is Dr. GRPO (TRL:
    ``scale_rewards``)."""
    outcome: Literal["success", "return", "return_to_go"] = "success"
    """What a GRPO rollout is scored by: ``success`` (1 if the env reported success at any step of
    the episode, else 0) or ``return`` (the episode's summed reward), one score per episode; or
    ``return_to_go``: each decision's reward from there to the episode's end, discounted by
    ``gamma``, compared with the group's members at the same step (a step-wise group baseline: an
    action is not credited with rewards that came before it, nor much with those long after it,
    which lowers the variance on long episodes with dense rewards)."""
    episode_weight: Literal["decisions", "equal"] = "decisions"
    """How much an episode weighs in a GRPO loss (embodied; ``success`` and ``return`` outcomes):
    ``decisions``: in proportion to its decisions (every decision's tokens count alike, as in
    ``token-mean``), so a 12-step failure outweighs a 4-step success three times and the update
    mostly pushes down the failures' actions (the policy's entropy rises); ``equal``: every episode
    the same, as a sequence in the original GRPO (a decision's advantage is scaled by the batch's
    mean episode length / its episode's length)."""
    filter_groups: bool = False
    """Dynamic sampling (DAPO): leave groups whose rewards have no spread out of the update (they
    carry no signal but dilute token-mean); their share is logged as ``frac_reward_zero_std``."""
    use_kl_loss: bool = False
    """Add a KL penalty to a frozen copy of the initial policy (the reference) to the loss."""
    kl_loss_coef: float = 0.001
    """Weight of the KL penalty (TRL: ``beta``)."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: ``k1``/``kl``, ``k2``/``mse``, ``k3``/``low_var_kl``, ``abs``; a trailing ``+``
    keeps the value and takes k2's gradient."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Truncated importance-sampling correction between the rollout's logprobs and the trainer's
    recomputation with the same weights (they differ across inference engines, precisions, or a
    version of staleness): weights per token or per sequence. None: no correction."""
    rollout_is_threshold: float = 2.0
    """Upper bound of the importance weights."""
    rollout_is_mode: Literal["truncate", "mask"] = "truncate"
    """``truncate`` caps weights at the threshold; ``mask`` drops samples above it."""

    def __post_init__(self) -> None:
        problems = []

        def need(ok: bool, text: str) -> None:
            if not ok:
                problems.append(text)

        need(self.lr > 0, f"algo.lr must be > 0 (got {self.lr})")
        need(self.epochs >= 1, f"algo.epochs must be >= 1 (got {self.epochs})")
        need(self.num_minibatches >= 1, f"algo.num_minibatches must be >= 1 (got {self.num_minibatches})")
        need(self.micro_batch_size is None or self.micro_batch_size >= 1, f"algo.micro_batch_size must be >= 1 or null (got {self.micro_batch_size})")
        need(0 <= self.gamma <= 1, f"algo.gamma must be in [0, 1] (got {self.gamma})")
        need(0 <= self.gae_lambda <= 1, f"algo.gae_lambda must be in [0, 1] (got {self.gae_lambda})")
        for key in ("clip_ratio", "clip_ratio_low"):
            v = getattr(self, key)
            need(v is None or 0 < v < 1, f"algo.{key} must be in (0, 1) (got {v})")
        need(self.clip_ratio_high is None or self.clip_ratio_high > 0, f"algo.clip_ratio_high must be > 0 (got {self.clip_ratio_high})")
        need(self.clip_ratio_c is None or self.clip_ratio_c > 1, f"algo.clip_ratio_c (dual clip) must be > 1 (got {self.clip_ratio_c})")
        need(self.value_clip is None or self.value_clip > 0, f"algo.value_clip must be > 0 or null (got {self.value_clip})")
        need(self.max_grad_norm > 0, f"algo.max_grad_norm must be > 0 (got {self.max_grad_norm})")
        need(self.target_kl is None or self.target_kl > 0, f"algo.target_kl must be > 0 or null (got {self.target_kl})")
        need(isinstance(self.critic_warmup, int) and self.critic_warmup >= 0, f"algo.critic_warmup must be an integer >= 0 (got {self.critic_warmup})")
        need(self.group_size >= 1, f"algo.group_size must be >= 1 (got {self.group_size})")
        need(self.kl_loss_coef >= 0, f"algo.kl_loss_coef must be >= 0 (got {self.kl_loss_coef})")
        need(self.rollout_is_threshold > 1, f"algo.rollout_is_threshold must be > 1 (got {self.rollout_is_threshold})")
        need(self.loss_agg_mode in LOSS_AGG_MODES,
             f"algo.loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES.names())} (got {self.loss_agg_mode!r})")
        need(self.kl_loss_type.rstrip("+") in KL_ESTIMATORS,
             f"algo.kl_loss_type must be one of {', '.join(KL_ESTIMATORS.names())} (optionally with '+'; got {self.kl_loss_type!r})")
        need(not (self.episode_weight == "equal" and self.outcome == "return_to_go"),
             "algo.episode_weight=equal weighs whole episodes; with algo.outcome=return_to_go each decision is "
             "compared at its own step (use episode_weight=decisions)")
        if self.estimator in ("grpo", "rloo"):
            need(self.group_size >= 2, f"algo.group_size must be >= 2 for {self.estimator} advantages: a group of one has "
                                       f"no baseline to compare with (got {self.group_size})")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def estimator(self) -> str:
        """The advantage estimator in effect (``adv_estimator`` or the algorithm's default)."""
        return self.adv_estimator or {"ppo": "gae", "grpo": "grpo"}[self.name]

    @property
    def normalizes_advantages(self) -> bool:
        """Whether minibatch advantages are normalized (``norm_adv`` or the algorithm's default)."""
        return self.name == "ppo" if self.norm_adv is None else self.norm_adv

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high
