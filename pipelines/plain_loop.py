"""The reference loop: collect, then train, in one process (the shape of CleanRL's PPO).

It is the embodied workflow without workers, channels or a plan, built from the same pieces: the
same env seeds, the same :class:`TrajectoryRecorder` and sampling stream as rank 0 of the
:class:`~pipelines.onpolicy.workers.RolloutWorker`, the same algorithm object, optimizer and shuffle
generator as the :class:`~pipelines.onpolicy.workers.TrainerWorker`. With the ``inprocess`` env backend, one
chunk, one trainer and the same seed, an iteration of the pipeline and of this loop produce the same
weights (a test checks it), so the loop is both documentation and an oracle::

    loop = PlainLoop(cfg)
    for i in range(loop.total_iterations):
        metrics = loop.iteration(i, lr=cfg.algo.lr)
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import numpy as np
import torch

from embodied.algorithms import build_algorithm, build_optimizer
from embodied.seeding import RngStream, seed_everything
from envs.registry import make_vec_env
from pipelines.collect import EnvOutput, TrajectoryRecorder, env_output, resolve_device, with_instructions
from pipelines.config import EmbodiedConfig
from pipelines.onpolicy.chunks import group_seeds
from policies.registry import build_policy


class PlainLoop:
    """One env batch, one policy, one optimizer; ``iteration()`` collects T decisions and trains."""

    def __init__(self, cfg: EmbodiedConfig) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.workers.trainer_device)
        self.env = make_vec_env(cfg.env, seed=cfg.seed)  # as env rank 0, chunk 0
        self.instructions = None if self.env.instructions is None else np.asarray(self.env.instructions, dtype=str)
        seed_everything(cfg.seed)  # as the trainer: the policy's initial weights
        self.policy = build_policy(cfg.policy, self.env.observation_space, self.env.action_space).to(self.device)
        self.algorithm = build_algorithm(cfg.algo)
        self.reference = copy.deepcopy(self.policy).eval().requires_grad_(False) if self.algorithm.needs_reference else None
        self.optimizer = build_optimizer(self.policy.parameters(), cfg.algo)
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)  # as the trainer's minibatch shuffles
        rng = RngStream(cfg.seed + 7919, self.device)  # as rollout rank 0's sampling stream
        self.recorder = TrajectoryRecorder(self.policy, self.device, self.algorithm.needs_critic, self.env.action_space, rng)
        self.version = 0
        self.obs: Any = None

    @property
    def total_iterations(self) -> int:
        return math.ceil(self.cfg.algo.total_env_steps / self.cfg.steps_per_iteration)

    def iteration(self, iteration: int, lr: float) -> dict[str, Any]:
        """Collect ``algo.rollout_steps`` decisions of every env, then update; returns the
        update's metrics and ``time/collect_s``, ``time/train_s``, ``time/iteration_s``."""
        cfg, env, instructions = self.cfg, self.env, self.instructions
        t0 = time.perf_counter()
        group_ids = None
        if self.algorithm.grouped:
            seeds, group_ids = group_seeds(cfg, 0, env.num_envs, iteration)
            self.obs = env.reset(seed=seeds)
        elif self.obs is None:
            self.obs = env.reset(seed=cfg.seed)
        self.policy.eval()
        self.recorder.begin(EnvOutput(with_instructions(self.obs, instructions), group_ids=group_ids))
        for _ in range(cfg.algo.rollout_steps):
            if self.algorithm.grouped and self.recorder.first_episodes_done():
                break  # one episode per env is all GRPO needs
            actions = self.recorder.act()
            res = env.chunk_step(actions) if cfg.policy.action_chunk > 1 else env.step(actions)
            self.recorder.observe(env_output(res, instructions))
            self.obs = res.obs
        batch = self.recorder.finish(self.version, cfg.algo.rollout_steps)
        t_collect = time.perf_counter()
        self.policy.train()
        stats = self.algorithm.update(self.policy, self.optimizer, batch, lr, generator=self.generator,
                                      reference=self.reference, device=self.device, update_index=self.version)
        self.version += 1
        t_end = time.perf_counter()
        return {**stats, "time/collect_s": t_collect - t0, "time/train_s": t_end - t_collect, "time/iteration_s": t_end - t0}

    def close(self) -> None:
        self.env.close()
