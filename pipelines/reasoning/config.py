"""The schema of a reasoning-RL run: ``embodied train reasoning_grpo ...`` builds a :class:`ReasoningConfig`.

GRPO on a causal language model with rule-checked rewards. What every workflow's run shares (the
recipe, the seed, resuming, the ``run``, ``checkpoint``, ``cluster``, ``logging`` and ``plan``
sections) comes from :class:`pipelines.config.RunConfig`; the
algorithm section extends :class:`embodied.algorithms.AlgoConfig` (veRL's names, TRL's as aliases)
with its own schedule. Key names follow veRL where a user knows them from there:

| here | veRL |
|---|---|
| ``data.train_batch_size`` | ``data.train_batch_size`` (prompts per iteration) |
| ``algo.group_size`` | ``actor_rollout_ref.rollout.n`` (TRL ``num_generations``) |
| ``algo.num_minibatches`` | ``train_batch_size / actor.ppo_mini_batch_size`` |
| ``algo.epochs`` | ``actor.ppo_epochs`` |
| ``algo.iterations`` | ``trainer.total_training_steps`` |
| ``data.max_prompt_length`` | ``data.max_prompt_length`` |
| ``policy.kwargs.max_new_tokens`` | ``data.max_response_length`` |

Everything that can be checked without files is checked when the config is built; files, the model
directory and prompt lengths by :func:`pipelines.reasoning.preflight.preflight` before a run dir is
written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from embodied.algorithms import AlgoConfig
from embodied.config import Alias
from pipelines.config import RunConfig
from pipelines.reasoning.data import DataConfig
from pipelines.reasoning.sft import SFTConfig
from pipelines.reasoning.verifiers import RewardConfig
from policies.config import PolicyConfig
from policies.lm.options import CAUSAL_LM_DEFAULTS

_DEVICES = ("cpu", "cuda", "auto")


def _check_device(key: str, value: str) -> str | None:
    if value in _DEVICES or (value.startswith("cuda:") and value[5:].isdigit()):
        return None
    return f"{key} must be cpu, cuda, cuda:N or auto (got {value!r})"


@dataclass
class ReasoningAlgoConfig(AlgoConfig):
    """GRPO on a language model (``algo.*``): the loss, the optimizer and the run's length.

    Defaults are veRL's GSM8K GRPO settings (constant lr 1e-6, token-mean, clip 0.2/0.2, no KL,
    gradient clip 1.0, one PPO epoch)."""

    ALIASES: ClassVar[dict[str, Alias]] = {
        **AlgoConfig.ALIASES,
        "ppo_epochs": ("epochs", None),
        "total_training_steps": ("iterations", None),
    }

    name: Literal["grpo"] = "grpo"
    """``grpo``: critic-free, each response compared with the other responses to its prompt."""
    lr: float = 1e-6
    """Adam learning rate (veRL's GSM8K default; a tiny model trained from scratch wants ~1e-3)."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over the run (veRL keeps it constant)."""
    epochs: int = 1
    """Passes over each iteration's samples (veRL ``ppo_epochs``). With ``minibatch_mix=groups``
    the first pass streams: each minibatch trains as soon as its groups are scored."""
    num_minibatches: int = 1
    """Optimizer steps per epoch: the iteration's responses are cut into this many minibatches
    (``data.train_batch_size / ppo_mini_batch_size`` in veRL; TRL ``steps_per_generation``). Must
    divide ``data.train_batch_size``; chunks of the plan carry whole minibatches."""
    minibatch_mix: Literal["groups", "shuffled"] = "groups"
    """What a minibatch holds: ``groups``: whole groups (all responses to its prompts), so each
    minibatch trains as soon as its chunks are scored (the first epoch streams; later epochs shuffle
    responses across groups); ``shuffled``: the iteration's responses shuffled across groups in
    every epoch, so each optimizer step sees part of every group, as TRL's ``GRPOTrainer`` does. With
    ``shuffled`` the trainer waits for the whole batch: the plan has one chunk (``plan.chunks`` > 1
    is an error)."""
    max_grad_norm: float = 1.0
    """Gradient norm clip (veRL ``actor.grad_clip``)."""
    norm_adv: bool = False
    """PPO's per-minibatch advantage normalization; off (group advantages are already normalized)."""
    outcome: Literal["success", "return", "return_to_go"] = "return"
    """What scores a response: ``return`` (the reward: the verifier's score plus any overlong
    penalty) or ``success`` (the answer is right). One decision per response, so ``return_to_go``
    equals ``return``."""
    iterations: int = 100
    """GRPO iterations (veRL ``total_training_steps``); each draws ``data.train_batch_size`` prompts."""
    total_prompts: int | None = None
    """Budget in prompts instead of iterations (whole iterations: the last may go past it); None
    uses ``iterations``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        if self.iterations < 1:
            problems.append(f"algo.iterations must be >= 1 (got {self.iterations})")
        if self.total_prompts is not None and self.total_prompts < 1:
            problems.append(f"algo.total_prompts must be >= 1 or null (got {self.total_prompts})")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class ReasoningDataConfig(DataConfig):
    """The prompts (``data.*``): veRL or TRL files and where each field of a row is."""

    train_files: list[str] = field(default_factory=list)
    """Training prompt files (``.jsonl``, ``.json``, ``.parquet``); required unless the warm start
    provides them."""
    val_files: list[str] = field(default_factory=list)
    """Held-out prompt files for evaluation (``eval.*``); empty: no evaluation."""
    train_batch_size: int = 64
    """Prompts per iteration; each gets ``algo.group_size`` responses."""
    max_prompt_length: int = 512
    """P: prompt tokens (chat template included); prompts are left-padded to it."""
    filter_overlong_prompts: bool = False
    """Drop prompts longer than ``max_prompt_length`` (counted in the log) instead of stopping with
    an error naming the first one (veRL's option of the same name)."""
    shuffle: bool = True
    """Draw each epoch's prompts in a fresh order (seeded by ``seed``); False keeps file order."""

    def __post_init__(self) -> None:
        problems = []
        if self.train_batch_size < 1:
            problems.append(f"data.train_batch_size must be >= 1 (got {self.train_batch_size})")
        if self.max_prompt_length < 1:
            problems.append(f"data.max_prompt_length must be >= 1 (got {self.max_prompt_length})")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class ReasoningEvalConfig:
    """Held-out accuracy (``eval.*``): greedy and sampled answers to the first problems of
    ``data.val_files``, every ``every`` iterations and at the end."""

    problems: int = 500
    """Held-out problems evaluated (the first ones of ``data.val_files``; 0: all of them)."""
    samples: int = 4
    """Sampled responses per problem (``eval/sampled_acc`` = their mean accuracy, pass@1;
    ``eval/pass@N`` = any of them right). 0: greedy accuracy only."""
    every: int = 0
    """Evaluate every N iterations; 0 only at the end."""
    batch_size: int = 512
    """Sequences per ``generate`` call during evaluation."""

    def __post_init__(self) -> None:
        problems = [f"eval.{k} must be >= 0 (got {getattr(self, k)})" for k in ("problems", "samples", "every")
                    if getattr(self, k) < 0]
        if self.batch_size < 1:
            problems.append(f"eval.batch_size must be >= 1 (got {self.batch_size})")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class WarmStartConfig:
    """A supervised warm start before GRPO (``warm_start.*``): the tiny recipe trains a tiny Qwen2 on
    synthetic arithmetic (cached by config), then GRPO starts from it on the same problems."""

    enabled: bool = False
    """Run the cached SFT of ``warm_start.sft`` first; its model becomes ``policy.kwargs.model_path``
    and its data ``data.train_files`` / ``data.val_files`` (where those are empty)."""
    cache_dir: str = "~/.cache/embodied/sft"
    """Where SFT results are cached (one directory per config hash)."""
    require_target: bool = True
    """Refuse to start GRPO unless the SFT stopped because it reached its sampled-accuracy target
    (``sft/stop_reason`` = ``target``): from a weaker start most groups are all wrong and GRPO gets
    no gradient."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The SFT run (model size, task, budget, stopping rule); its defaults are the calibrated ones."""


@dataclass
class ReasoningWorkersConfig:
    """How many ranks of each worker, their resources and the rollout engine (``workers.*``)."""

    rollout: int = 1
    """Rollout (generation) ranks; chunk c of an iteration goes to rank ``c % rollout``."""
    reward: int = 1
    """Reward (verifier) ranks; chunk c goes to rank ``c % reward``."""
    rollout_cpus: float = 0.5
    """CPUs reserved per rollout rank."""
    reward_cpus: float = 0.25
    """CPUs reserved per reward rank."""
    trainer_cpus: float = 0.5
    """CPUs reserved for the trainer."""
    rollout_threads: int = 1
    """torch threads of each rollout rank when the run is not planned (a plan sets them)."""
    trainer_threads: int = 1
    """torch threads of the trainer when the run is not planned."""
    rollout_device: str = "cpu"
    """Device of generation and evaluation: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""
    trainer_device: str = "cpu"
    """Device of the trainer: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``."""
    rollout_backend: str = "transformers"
    """The generation engine (``pipelines.reasoning.rollout.ROLLOUT_BACKENDS``): ``transformers``
    (batched ``generate`` with a KV cache, the sampled tokens' logprobs recorded)."""

    def __post_init__(self) -> None:
        problems = [f"workers.{k} must be >= 1 (got {getattr(self, k)})"
                    for k in ("rollout", "reward", "rollout_threads", "trainer_threads") if getattr(self, k) < 1]
        problems += [f"workers.{k} must be > 0 (got {getattr(self, k)})"
                     for k in ("rollout_cpus", "reward_cpus", "trainer_cpus") if getattr(self, k) <= 0]
        problems += [p for k in ("rollout_device", "trainer_device") if (p := _check_device(f"workers.{k}", getattr(self, k)))]
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class LMPolicyConfig(PolicyConfig):
    """The language model (``policy.*``): ``causal_lm`` with its ``kwargs`` (model_path, dtype,
    max_new_tokens, temperature, top_k, top_p, chat_template, LoRA; see docs/reasoning.md)."""

    name: str = "causal_lm"
    """The policy: ``causal_lm`` (a local Hugging Face causal LM)."""


@dataclass
class ReasoningConfig(RunConfig):
    """A GRPO run of a causal language model on verifiable problems: rollout, reward and trainer workers."""

    workflow: Literal["reasoning"] = "reasoning"
    """The workflow this schema belongs to (set by the recipe)."""
    seed: int = 0
    """Seeds torch, numpy and python, the prompt order and each rollout rank's sampling."""
    workers: ReasoningWorkersConfig = field(default_factory=ReasoningWorkersConfig)
    policy: LMPolicyConfig = field(default_factory=LMPolicyConfig)
    data: ReasoningDataConfig = field(default_factory=ReasoningDataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: ReasoningAlgoConfig = field(default_factory=ReasoningAlgoConfig)
    eval: ReasoningEvalConfig = field(default_factory=ReasoningEvalConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)

    def __post_init__(self) -> None:
        problems = []
        B, M = self.data.train_batch_size, self.algo.num_minibatches
        if self.policy.name != "causal_lm":
            problems.append(f"policy.name must be causal_lm for the reasoning workflow (got {self.policy.name!r})")
        if B % M:
            problems.append(f"algo.num_minibatches={M} must divide data.train_batch_size={B}: a minibatch is a "
                            "whole number of prompts (veRL: train_batch_size must be a multiple of ppo_mini_batch_size)")
        chunks = self.plan.chunks
        if self.algo.minibatch_mix == "shuffled" and chunks is not None and chunks != 1:
            problems.append(f"plan.chunks={chunks} streams whole groups to the trainer, but algo.minibatch_mix=shuffled "
                            "mixes every group into every minibatch, so the trainer needs the whole batch first: set "
                            "plan.chunks=1 (or leave it unset), or algo.minibatch_mix=groups to stream")
        elif chunks is not None and (chunks < 1 or M % chunks):
            problems.append(f"plan.chunks={chunks} must divide algo.num_minibatches={M}: each chunk streams whole "
                            "minibatches to the trainer (raise algo.num_minibatches for more chunks)")
        if self.plan.offload is not None and "env" in self.plan.offload:
            problems.append("plan.offload names components of this workflow: rollout, reward or trainer")
        K = self.max_new_tokens
        if self.reward.max_response_length == 0:
            self.reward.max_response_length = K  # the overlong penalty's L_max is the rollout's limit
        elif self.reward.max_response_length != K:
            problems.append(f"reward.max_response_length={self.reward.max_response_length} differs from "
                            f"policy.kwargs.max_new_tokens={K}; leave it 0 (it follows max_new_tokens)")
        if problems:
            raise ValueError("; ".join(problems))
        self.reward.validate()

    # --- sizes -------------------------------------------------------------------------------------
    @property
    def samples_per_iteration(self) -> int:
        """Responses an iteration generates and trains on (prompts x group size)."""
        return self.data.train_batch_size * self.algo.group_size

    @property
    def total_prompts(self) -> int:
        """The run's budget in prompts (``algo.total_prompts``, else iterations x batch)."""
        if self.algo.total_prompts is not None:
            return self.algo.total_prompts
        return self.algo.iterations * self.data.train_batch_size

    @property
    def total_iterations(self) -> int:
        return math.ceil(self.total_prompts / self.data.train_batch_size)

    @property
    def max_new_tokens(self) -> int:
        """K: response tokens (``policy.kwargs.max_new_tokens``)."""
        return int(self.policy.kwargs.get("max_new_tokens", CAUSAL_LM_DEFAULTS["max_new_tokens"]))
