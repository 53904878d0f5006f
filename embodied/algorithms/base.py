"""What every algorithm shares: the registry, the flattening of a batch into samples, and the update loop.

An algorithm (``ppo.py``, ``grpo.py``) supplies three verbs and nothing else:

* ``advantages(batch)``: from a rollout's facts to per-decision advantages (and value targets) and
  the decisions that enter the loss;
* ``loss(policy, minibatch, counts)``: the scalar to minimize on a (micro-)batch of samples, with
  the minibatch's token and sequence counts as denominators, so micro-batching does not change it;
* ``minibatch(samples)`` (optional): a transform of a whole minibatch before it is split into
  micro-batches (by default its advantages are normalized here, with ``algo.norm_adv``).

:meth:`Algorithm.update` runs the loop: epochs, shuffled minibatches, micro-batches with gradient
accumulation, gradient clipping, a finite-gradient check, the optimizer step and early stopping on
the KL. The policy is anything with the contract ``evaluate(obs, actions) -> (logprobs, entropy,
values)`` (``policies.base.Policy``); nothing here branches on the model type.

Data-parallel trainer ranks (``parallel``, :mod:`embodied.runtime.distributed`) run the same loop
on the same samples and the same shuffles: each rank forwards and backwards its block of every
minibatch with the whole minibatch's counts, the ranks' gradients are summed, and the statistics
of a step are summed over ranks before anything reads them (early stopping decides alike
everywhere). N ranks take the optimizer steps of one rank, up to float summation order.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from embodied.algorithms.config import AlgoConfig
from embodied.registry import Registry
from embodied.runtime.distributed import SINGLE, DataParallel
from embodied.rl import (
    LossAggCounts,
    Samples,
    TrajectoryBatch,
    agg_entropy,
    agg_loss,
    is_text,
    kl_penalty,
    loss_agg_counts,
    micro_batches,
    normalize_advantages,
    policy_loss_per_token,
    rollout_is_weights,
    should_stop_early,
)


@dataclass
class Advantages:
    """What an algorithm's ``advantages`` derives from a batch (time-major, on the batch's device).

    advantages: (T, B) per decision.
    returns:    (T, B) value targets, or None for critic-free algorithms.
    mask:       (T, B) bool, the decisions that enter the loss.
    stats:      scalars to log (``grpo/frac_reward_zero_std``, ...).
    """

    advantages: torch.Tensor
    returns: torch.Tensor | None
    mask: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


class Algorithm(ABC):
    """An RL algorithm: ``advantages`` + ``loss``; :meth:`update` is the shared training loop."""

    name: ClassVar[str]
    #: advantage estimators this algorithm can use (``algo.adv_estimator``)
    estimators: ClassVar[tuple[str, ...]]
    #: statistics of ``loss`` that are a micro-batch's share of a minibatch total (aggregated with
    #: the minibatch's counts): summed over micro-batches, where the others are weighted means
    summed_stats: ClassVar[frozenset[str]] = frozenset({"losses/policy", "losses/entropy", "losses/kl_to_reference"})

    def __init__(self, cfg: AlgoConfig) -> None:
        if cfg.estimator not in self.estimators:
            from embodied.errors import ConfigError

            raise ConfigError(
                f"algo.name={self.name} estimates advantages with {' or '.join(self.estimators)}, not "
                f"algo.adv_estimator={cfg.estimator!r}."
            )
        self.cfg = cfg

    @property
    def needs_critic(self) -> bool:
        """Whether the rollout must record values (the policy needs a critic)."""
        return False

    @property
    def needs_reference(self) -> bool:
        """Whether the trainer keeps a frozen reference policy (KL penalty)."""
        return self.cfg.use_kl_loss

    @property
    def grouped(self) -> bool:
        """Whether envs must start each iteration in groups from shared initial states (GRPO)."""
        return False

    # --- the verbs of an algorithm -----------------------------------------------------------------
    @abstractmethod
    def advantages(self, batch: TrajectoryBatch) -> Advantages:
        """Per-decision advantages of a (torch) batch, and the decisions that enter the loss."""

    @abstractmethod
    def loss(self, policy: Any, mb: Samples, counts: LossAggCounts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of a (micro-)batch; ``counts`` are the whole minibatch's token/sequence counts."""

    def minibatch(self, mb: Samples) -> Samples:
        """A transform of a whole minibatch before micro-batching: its advantages normalized to
        mean 0 / std 1 with ``algo.norm_adv`` (PPO's default; a GRPO recipe may switch it on where
        its advantages are not normalized per group, e.g. Dr. GRPO's or per-step returns-to-go)."""
        if self.cfg.normalizes_advantages and len(mb) > 1:
            mb.fields["advantages"] = normalize_advantages(mb.fields["advantages"])
        return mb

    def policy_objective(self, ev: Any, mb: Samples, counts: LossAggCounts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy's part of every algorithm's loss, aggregated with ``algo.loss_agg_mode`` over
        the minibatch's counts: the clipped surrogate (clip-higher, dual clip, importance weights),
        minus ``entropy_coeff`` times the entropy, plus ``kl_loss_coef`` times the KL to the
        reference. ``ev`` is the policy's ``evaluate`` of the micro-batch."""
        cfg = self.cfg
        agg = dict(mode=cfg.loss_agg_mode, num_tokens=counts.num_tokens, num_seqs=counts.num_seqs,
                   loss_scale_factor=cfg.loss_scale_factor)
        per_token, stats = policy_loss_per_token(
            ev.logprobs, mb.logprobs, mb.fields["advantages"], mb.mask,
            clip_ratio_low=cfg.clip_low, clip_ratio_high=cfg.clip_high, clip_ratio_c=cfg.clip_ratio_c,
            is_weights=mb.fields.get("is_weights"),
        )
        policy_loss = agg_loss(per_token, mb.mask, **agg)
        loss = policy_loss
        if cfg.entropy_coeff:
            entropy = agg_entropy(ev.entropy, mb.mask, **agg)
            loss = loss - cfg.entropy_coeff * entropy
        else:  # logged only: no part of the graph the backward pass walks
            with torch.no_grad():
                entropy = agg_entropy(ev.entropy, mb.mask, **agg)
        out = {"losses/policy": policy_loss, "losses/entropy": entropy,
               **{f"losses/{k}": v for k, v in stats.items()}}
        if "ref_logprobs" in mb.fields:
            kl = agg_loss(kl_penalty(ev.logprobs, mb.fields["ref_logprobs"], cfg.kl_loss_type, mb.mask), mb.mask, **agg)
            loss = loss + cfg.kl_loss_coef * kl
            out["losses/kl_to_reference"] = kl
        return loss, {k: v.detach() if v.requires_grad else v for k, v in out.items()}

    # --- shared machinery --------------------------------------------------------------------------
    def samples(self, batch: TrajectoryBatch, adv: Advantages, policy: Any, reference: Any | None,
                parallel: DataParallel = SINGLE) -> Samples:
        """The decisions ``adv.mask`` selects, flat (N = selected decisions), with the algorithm's
        columns: ``advantages``, ``returns`` and ``old_values`` (critic), ``ref_logprobs`` (KL),
        ``is_weights`` (rollout importance correction; ``logprobs`` are then the trainer's own)."""
        cfg = self.cfg
        T, B = batch.num_steps, batch.num_envs
        keep = adv.mask.reshape(T * B)
        rows = torch.nonzero(keep).squeeze(-1)
        host_rows = rows.cpu().numpy()

        def flat(x: Any) -> Any:
            if is_text(x):
                return np.asarray(x).reshape(T * B, *x.shape[2:])[host_rows]
            return x.reshape(T * B, *x.shape[2:])[rows]

        samples = Samples(
            obs={k: flat(v) for k, v in batch.obs.items()},
            actions=flat(batch.actions),
            logprobs=flat(batch.logprobs).float(),
            mask=None if batch.action_mask is None else flat(batch.action_mask).bool(),
            fields={"advantages": flat(adv.advantages).float()},
        )
        if adv.returns is not None:
            samples.fields["returns"] = flat(adv.returns).float()
            samples.fields["old_values"] = flat(batch.values).float()
        if len(samples) and cfg.rollout_is is not None:
            trainer_logprobs = self._score(policy, samples, parallel)
            weights, stats = rollout_is_weights(trainer_logprobs, samples.logprobs, samples.mask, level=cfg.rollout_is,
                                                threshold=cfg.rollout_is_threshold, mode=cfg.rollout_is_mode)
            samples.logprobs = trainer_logprobs
            samples.fields["is_weights"] = weights
            adv.stats.update({f"rollout_is/{k}": float(v) for k, v in stats.items()})
        if len(samples) and self.needs_reference:
            if reference is None:
                raise RuntimeError(f"{self.name} with algo.use_kl_loss needs a reference policy")
            samples.fields["ref_logprobs"] = self._score(reference, samples, parallel)
        return samples

    def _score(self, policy: Any, samples: Samples, parallel: DataParallel = SINGLE) -> torch.Tensor:
        """Log-probabilities of the samples' actions under ``policy``, without gradients, in
        micro-batches of ``algo.micro_batch_size``; each rank scores its block, then all ranks
        get every block."""
        if parallel.world_size == 1:
            index = torch.arange(len(samples), device=samples.actions.device)
            calls = [(i, True) for i in micro_batches(index, self.cfg.micro_batch_size)]
        else:
            calls = parallel.calls(len(samples), self.cfg.micro_batch_size, samples.actions.device)
        parts = []
        with torch.no_grad():
            for i, real in calls:
                logprobs = policy.evaluate(samples[i].obs, samples[i].actions).logprobs.float()
                if real:  # a filler call (FSDP: every rank calls alike) is dropped
                    parts.append(logprobs)
        local = torch.cat(parts) if parts else logprobs[:0]
        return parallel.gather(local, len(samples))

    def update(
        self,
        policy: Any,
        optimizer: torch.optim.Optimizer,
        batch: TrajectoryBatch,
        lr: float,
        generator: torch.Generator | None = None,
        reference: Any | None = None,
        device: torch.device | str = "cpu",
        parallel: DataParallel = SINGLE,
        update_index: int = 0,
    ) -> dict[str, float]:
        """Train ``policy`` on one rollout's batch: ``algo.epochs`` epochs of ``algo.num_minibatches``
        shuffled minibatches, each accumulated over micro-batches of ``algo.micro_batch_size``
        (per rank: ``parallel`` splits every minibatch over its ranks, which all hold ``batch``).
        ``update_index``: the updates before this one in the run; under ``algo.critic_warmup`` the
        first ones step only the critic's parameters.
        Returns the metrics of the update (``losses/*``, ``charts/*``, and the algorithm's own)."""
        cfg = self.cfg
        batch = batch.to_torch(device)
        adv = self.advantages(batch)
        samples = self.samples(batch, adv, policy, reference, parallel)
        for group in optimizer.param_groups:
            group["lr"] = lr
        out: dict[str, float] = {**adv.stats, "charts/lr": lr, "charts/samples": float(len(samples))}
        if len(samples) == 0:  # e.g. every group filtered out: nothing to learn from
            out["losses/epochs"] = 0.0
            return out
        policy.update_normalizer(samples.obs)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        warmup = self.needs_critic and update_index < cfg.critic_warmup
        critic = {id(p) for p in policy.critic_parameters()} if warmup else set()
        frozen = [p for p in params if id(p) not in critic] if warmup else []
        if warmup and len(frozen) == len(params):
            raise ValueError("algo.critic_warmup steps only the critic, but none of the optimizer's parameters is the policy's "
                             "critic_parameters() (FSDP's flattened parameters, or a policy without a value head)")
        if self.needs_critic:
            out["losses/critic_warmup"] = float(warmup)
        meter = _Meter(self.summed_stats)
        skipped = 0
        epochs = 0
        calls = 0
        with parallel.training(policy) as model:
            for _ in range(cfg.epochs):
                epochs += 1
                stop = False
                for idx in samples.minibatches(cfg.num_minibatches, generator):
                    mb = self.minibatch(samples[idx])
                    counts = loss_agg_counts(mb.mask) if mb.mask is not None else LossAggCounts(len(mb), len(mb))
                    optimizer.zero_grad(set_to_none=True)
                    parts = self._calls(len(mb), parallel, idx.device)
                    for j, (part, real) in enumerate(parts):
                        with model.accumulate(last=j == len(parts) - 1):
                            whole = real and len(part) == len(mb)
                            loss, stats = model.loss(self.loss, mb if whole else mb[part], counts)
                            (loss if real else loss * 0.0).backward()  # a filler call of FSDP weighs nothing
                        meter.add(stats, weight=len(part) / len(mb), real=real)
                    calls += len(parts)
                    meter.combine(parallel.all_reduce)  # each rank's share of the step's statistics
                    for p in frozen:  # critic warmup: the actor and the shared features stay as they are
                        p.grad = None
                    grad_norm = parallel.clip_grad_norm(params, cfg.max_grad_norm)
                    if not math.isfinite(grad_norm):
                        skipped += 1  # a non-finite gradient would poison the weights: skip this step
                        optimizer.zero_grad(set_to_none=True)
                    else:
                        optimizer.step()
                    meter.step({"losses/grad_norm": grad_norm})
                    if cfg.target_kl is not None and should_stop_early(meter.last("losses/approx_kl"), cfg.target_kl):
                        stop = True
                        break
                if stop:
                    break
        out.update(meter.means())
        out["losses/epochs"] = float(epochs)
        out["losses/non_finite_steps"] = float(skipped)
        out["charts/micro_batches"] = calls / max(1, len(meter.rows))  # forward/backward calls per step per rank
        return out

    def _calls(self, n: int, parallel: DataParallel, device: torch.device) -> list[tuple[torch.Tensor, bool]]:
        """The forward/backward calls of this rank on a minibatch of ``n`` samples."""
        if parallel.world_size == 1:
            return [(i, True) for i in micro_batches(torch.arange(n, device=device), self.cfg.micro_batch_size)]
        return parallel.calls(n, self.cfg.micro_batch_size, device)


class _Meter:
    """Means over an update's optimizer steps of per-step statistics. Within a step, a
    micro-batch's statistics weigh by its share of the minibatch, except the ``summed`` ones,
    which already are its share of a minibatch total (losses aggregated with the minibatch's
    counts) and add up. A step's statistics are stacked into one tensor and stay on the device
    until :meth:`means` (on a GPU each read would be a synchronization); the step's host numbers
    (the gradient norm) stay Python numbers. Per step this costs one or two tensor ops, which
    matters where a small policy's update is hundreds of cheap optimizer steps on a CPU."""

    def __init__(self, summed: frozenset[str] = frozenset()) -> None:
        self.summed = summed
        self.keys: list[str] | None = None
        self.current: torch.Tensor | None = None
        self.rows: list[torch.Tensor] = []
        self.host_keys: list[str] | None = None
        self.host_rows: list[list[float]] = []

    def add(self, stats: dict[str, Any], weight: float, real: bool = True) -> None:
        """Add one micro-batch's statistics; ``weight``: its share of the minibatch's samples.
        A call that is not ``real`` (a filler of a rank without samples) adds zeros."""
        if self.keys is None:
            self.keys = list(stats)
        elif list(stats) != self.keys:
            raise ValueError(f"statistics changed between steps: {self.keys} -> {list(stats)}")
        with torch.no_grad():
            if real and weight == 1.0:  # the whole minibatch in one call (the usual case): one op
                row = torch.stack(list(stats.values())).float()
            else:
                share = 1.0 if real else 0.0
                row = torch.stack([v.float() * (share if k in self.summed else weight * share) for k, v in stats.items()])
        self.current = row if self.current is None else self.current + row

    def combine(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace the current step's statistics by ``reduce`` of them (their sum over ranks)."""
        assert self.current is not None, "combine() without add()"
        self.current = reduce(self.current)

    def step(self, host: dict[str, float]) -> None:
        """Close the current optimizer step, with its ``host`` statistics (Python numbers, e.g.
        the gradient norm)."""
        assert self.current is not None and self.keys is not None, "step() without add()"
        if self.host_keys is None:
            self.host_keys = list(host)
        self.rows.append(self.current)
        self.host_rows.append([float(v) for v in host.values()])
        self.current = None

    def last(self, key: str) -> torch.Tensor:
        """The last closed step's statistic ``key`` (a 0-d tensor)."""
        assert self.keys is not None and self.rows, "last() before step()"
        return self.rows[-1][self.keys.index(key)]

    def means(self) -> dict[str, float]:
        if not self.rows or self.keys is None:
            return {}
        values = torch.stack(self.rows).mean(0).tolist()
        host = [sum(column) / len(column) for column in zip(*self.host_rows)]
        return {**dict(zip(self.keys, values)), **dict(zip(self.host_keys or [], host))}


def build_optimizer(parameters: Any, cfg: AlgoConfig) -> torch.optim.Optimizer:
    """The trainer's optimizer: Adam (eps 1e-5, as PPO implementations use) over the trainable
    parameters, fused into one kernel per step where torch supports it (CPU and CUDA): one
    optimizer step of a small policy costs as much as its backward pass otherwise."""
    trainable = [p for p in parameters if p.requires_grad]
    fused = bool(trainable) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in trainable)
    return torch.optim.Adam(trainable, lr=cfg.lr, eps=1e-5, fused=fused)


AlgorithmFactory = Callable[[AlgoConfig], Algorithm]
ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def build_algorithm(cfg: AlgoConfig) -> Algorithm:
    """The registered algorithm ``cfg.name`` for this config."""
    import embodied.algorithms.grpo  # noqa: F401  (registers)
    import embodied.algorithms.ppo  # noqa: F401

    return ALGORITHMS.get(cfg.name)(cfg)
