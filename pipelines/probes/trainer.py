"""The trainer probe: the configured algorithm's update per minibatch on a synthetic batch, one
rank's share of it plus an all-reduce with ``workers.trainer=N`` (:func:`_probe_trainer`), one
offload/onload; and the local half of a weight sync (:func:`probe_weight_sync`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from embodied.offload import Offloader
from embodied.profiler import Probe, time_call
from envs.base import to_numpy
from embodied.algorithms import build_algorithm, build_optimizer
from embodied.rl import TrajectoryBatch, is_text
from embodied.runtime.distributed import SINGLE, DataParallel
from pipelines.collect import resolve_device, to_torch
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.planning import macro_flow_of
from embodied.runtime.weights import WeightSyncer
from pipelines.probes.common import MIB


def _tile(obs: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """A batch of ``size`` observations made of the rows of ``obs`` (instructions included)."""
    idx = np.arange(size) % next(iter(obs.values())).shape[0]
    return {k: np.ascontiguousarray(v[idx] if is_text(v) else to_numpy(v)[idx]) for k, v in obs.items()}


#: Minibatches of the trainer probe's one epoch: its per-update costs (advantages, the normalizer,
#: the shuffle) spread over them as over an iteration's minibatches.
TRAINER_PROBE_MINIBATCHES = 4
#: An episodic (grouped: GRPO) iteration ends once its episodes are over and trains on the
#: decisions they took: while the policy is young its minibatches are a small share of the
#: configured size, where an optimizer step's fixed cost outweighs its per-sample one (CartPole's
#: MLP on one core: 1.56 ms per minibatch of 32 samples, 1.96 ms of 250, 11.1 ms of 4,000). Sizes
#: of the configured minibatch and half of it alone cannot tell the fixed part (the fit put it at
#: 0 and priced such iterations' trainer at a sixth of what it took); the probe of an episodic
#: algorithm also times minibatches of this share of the configured size.
EPISODIC_PROBE_SHARE = 1 / 16


def trainer_probe_sizes(cfg: EmbodiedConfig) -> list[int]:
    """The minibatch sizes the trainer probe times: the configured one and half of it, and for an
    episodic algorithm :data:`EPISODIC_PROBE_SHARE` of it (at least one sample per rank each)."""
    mb, ranks = macro_flow_of(cfg).train_minibatch, cfg.workers.trainer
    sizes = {mb, max(ranks, mb // 2)}
    if build_algorithm(cfg.algo).grouped:
        sizes.add(max(ranks, int(mb * EPISODIC_PROBE_SHARE)))
    return sorted(sizes)


class ShardProbe(DataParallel):
    """Rank 0 of ``world_size`` data-parallel ranks, alone: its share of every minibatch and of
    the scoring, no communication (what one rank computes, for profiling)."""

    strategy = "probe"

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def gather(self, local: torch.Tensor, n: int) -> torch.Tensor:
        return torch.cat([local] * self.world_size)[:n] if len(local) else local.new_zeros((n, *local.shape[1:]))


def allreduce_s(grad_mib: float, ranks: int, latency_s: float, s_per_mib: float) -> float:
    """Seconds of one ring all-reduce of ``grad_mib`` MiB over ``ranks`` ranks: ``2 (N - 1)``
    messages of ``grad_mib / N`` MiB each, at the measured cost of one message."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * (latency_s + grad_mib / ranks * s_per_mib)


def _probe_trainer(cfg: EmbodiedConfig, policy, obs, action_space, cores: int, log,
                   message: tuple[float, float] = (0.0, 0.0)) -> tuple[Probe, float, float]:
    """Time the trainer's own update (the algorithm's ``update``: advantages, minibatch gathers,
    loss, backward, gradient clipping, optimizer step, stats) on a synthetic batch of
    TRAINER_PROBE_MINIBATCHES minibatches of each of :func:`trainer_probe_sizes` (the configured
    size, half of it, and for an episodic algorithm a small share), per minibatch, on the
    trainer's device; one offload/onload.

    With ``workers.trainer=N`` ranks the probe is one rank's share of that work (its block of each
    minibatch, on 1 and ``cores / N`` threads) plus one all-reduce of the gradients per minibatch
    at the measured cost of a ``message`` ``(latency_s, s_per_mib)``; a sample ``(batch, devices,
    seconds)`` then counts the devices of all ranks."""
    probe = Probe("trainer")
    device = resolve_device(cfg.workers.trainer_device)
    policy = policy.to(device)
    optimizer = build_optimizer(policy.parameters(), cfg.algo)
    ranks = cfg.workers.trainer
    m = TRAINER_PROBE_MINIBATCHES
    algorithm = build_algorithm(dataclasses.replace(cfg.algo, epochs=1, num_minibatches=m, target_kl=None))
    reference = policy if algorithm.needs_reference else None
    parallel = ShardProbe(ranks) if ranks > 1 else SINGLE
    grad_mib = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad) / MIB
    combine_s = allreduce_s(grad_mib, ranks, *message)
    before = torch.get_num_threads()
    try:
        for b in trainer_probe_sizes(cfg):
            batch = synthetic_batch(policy, obs, b, m, cfg.algo.group_size, algorithm.needs_critic)
            for threads in sorted({1, max(1, cores // ranks)}):
                torch.set_num_threads(threads)

                def update() -> None:
                    algorithm.update(policy, optimizer, batch, cfg.algo.lr, reference=reference, device=device,
                                     parallel=parallel)

                seconds = time_call(update, warmup=1, repeats=3) / m + combine_s
                probe.add(b, threads * ranks, seconds)
                log(f"  trainer batch {b:>4} on {threads * ranks} core(s) ({ranks} rank(s)): {seconds * 1e3:8.2f} ms/minibatch")
    finally:
        torch.set_num_threads(before)
    offloader = Offloader(policy, optimizer)
    offload_s = offloader.offload().seconds
    onload_s = offloader.onload().seconds
    return probe, offload_s, onload_s


def synthetic_batch(policy, obs: dict[str, np.ndarray], envs: int, steps: int, group_size: int, values: bool) -> TrajectoryBatch:
    """A (steps, envs) batch as a rollout would record it: observations tiled from ``obs``;
    actions, logprobs (and values) from the policy, so PPO's ratios start at 1; random rewards and
    success; every env's episode ends at the last step (so GRPO's groups of ``group_size`` envs
    have outcomes and every decision enters its loss)."""
    tiled = _tile(obs, envs)
    with torch.no_grad():
        out = policy.act(to_torch(tiled, next(policy.parameters()).device))
    rng = np.random.default_rng(0)

    def repeat(x: Any) -> np.ndarray:
        return np.repeat(np.asarray(to_numpy(x))[None], steps, axis=0)  # (steps, envs, ...)

    shape = (steps, envs, policy.action_chunk)
    ends = np.zeros(shape, bool)
    ends[-1, :, -1] = True
    return TrajectoryBatch(
        obs={k: repeat(v) for k, v in tiled.items()},
        actions=repeat(out.actions),
        logprobs=repeat(out.logprobs.float()),
        rewards=rng.normal(size=shape).astype(np.float32),
        terminated=np.zeros(shape, bool),
        truncated=ends,
        valid=np.ones(shape, bool),
        values=repeat(out.values.float()) if values else None,
        final_values=np.zeros(shape[:2], np.float32) if values else None,
        last_values=to_numpy(out.values.float()).copy() if values else None,
        action_mask=None if out.mask is None else repeat(out.mask),
        success=rng.random(shape) < 0.5,
        group_ids=np.arange(envs) // max(1, min(group_size, envs)),
    ).check()


def probe_weight_sync(trainer_policy, rollout_policy) -> float:
    """Seconds of the local half of a weight sync: the trainer's :class:`WeightSyncer` export and
    the rollout's load (the message between them is priced by the transfer probe)."""
    syncer = WeightSyncer()
    return time_call(lambda: syncer.load(rollout_policy, syncer.export(trainer_policy, 0)), warmup=1, repeats=3)
