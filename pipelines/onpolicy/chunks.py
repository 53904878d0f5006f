"""The env side of a rank: its envs split into chunks, and the one loop that steps them.

:class:`EnvChunks` is a plain object. An :class:`~pipelines.onpolicy.workers.EnvWorker` runs its
loop (:meth:`EnvChunks.run`) against a rollout at the other end of two channels, a
:class:`~pipelines.onpolicy.workers.StreamWorker` against the policy in its own process: both are a
:class:`ChunkPolicy`, which is told each chunk's env output and answers its next actions.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from embodied.errors import EnvError
from envs.base import to_numpy
from envs.nonfinite import NONFINITE_INFO_KEY
from envs.registry import make_vec_env
from pipelines.collect import EnvOutput, env_output, with_instructions
from pipelines.config import EmbodiedConfig
from scheduler import chunk_sizes


@dataclass(frozen=True)
class Pinning:
    """Where a worker runs on this machine: the CPU cores it is pinned to (None: not pinned) and
    its torch threads. Env workers give their env processes one core each."""

    cores: tuple[int, ...] | None = None
    threads: int = 1

    def apply(self) -> None:
        if self.cores is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, self.cores)  # MultiprocessVecEnv gives its env processes this affinity
        torch.set_num_threads(max(1, self.threads))


Pinnings = Pinning | tuple[Pinning, ...]
"""One pinning for every rank of a group, or one per rank (a layout's ranks own different cores)."""


def own(pinning: Pinnings, rank: int) -> Pinning:
    """The pinning of ``rank`` among ``pinning``."""
    return pinning[rank] if isinstance(pinning, tuple) else pinning


def group_seeds(cfg: EmbodiedConfig, first_env: int, count: int, iteration: int) -> tuple[list[int], np.ndarray]:
    """Reset seeds and group ids of envs ``first_env .. first_env + count - 1`` (global indices over
    all env workers) for a grouped iteration: the envs of a group (``algo.group_size`` consecutive
    envs) share one seed, so they start from one initial state; every iteration draws new ones."""
    G = cfg.algo.group_size
    groups_total = cfg.workers.env * cfg.env.num_envs // G
    ids = (first_env + np.arange(count)) // G
    seeds = [cfg.seed + 1_000_003 + iteration * groups_total + int(g) for g in ids]
    return seeds, ids.astype(np.int64)


class ChunkPolicy(Protocol):
    """What acts in a rank's env chunks (:meth:`EnvChunks.run`), by chunk index ``c``."""

    def observe(self, c: int, out: EnvOutput) -> None:
        """Chunk ``c``'s env output: its first observation of the collection, then each step's."""

    def actions(self, c: int) -> np.ndarray | None:
        """Chunk ``c``'s next env actions; None when the chunk needs no more steps."""


class EnvChunks:
    """The env side of a rank: ``env.num_envs`` envs split into ``num_chunks`` independently stepped
    chunks (a ``streams`` plan: ``split`` ranks step one configured worker's ``env.num_envs`` envs
    between them). A plain object: an ``EnvWorker`` runs its loop (:meth:`run`) against a rollout
    over channels, a ``StreamWorker`` against the policy in its own process. An env's failure names
    its index over all env workers."""

    def __init__(self, cfg: EmbodiedConfig, grouped: bool = False) -> None:
        self.cfg = cfg
        self.grouped = grouped
        self.envs: list[Any] = []

    def configure(self, rank: int, num_chunks: int, pinning: Pinning, split: int = 1) -> None:
        """(Re)build the chunks' envs of rank ``rank`` for a plan: ``num_chunks`` chunks, each stepping
        its envs in ``len(pinning.cores)`` processes pinned to those cores. Episodes restart. With
        ``split`` ranks per configured env worker (a ``streams`` plan: one rank per stream) rank r
        steps part ``r % split`` of worker ``r // split``'s envs: an env keeps its index and seed
        whatever the split."""
        self.close()
        pinning.apply()
        cfg = self.cfg
        worker, part = divmod(rank, split)  # the configured env worker this rank stands for, and its part
        parts = chunk_sizes(cfg.env.num_envs, split)
        base = sum(parts[:part])  # this rank's first env within the configured worker's
        self.num_chunks = num_chunks
        self.sizes = chunk_sizes(parts[part], num_chunks)
        offsets = [base + sum(self.sizes[:c]) for c in range(num_chunks)]  # first env of each chunk in the worker
        self.first = [worker * cfg.env.num_envs + o for o in offsets]  # ... over all env workers
        self.seeds = [cfg.seed + 1000 * worker + o for o in offsets]
        procs = len(pinning.cores) if pinning.cores is not None else cfg.env.num_procs
        self.envs = []
        self.instructions: list[np.ndarray | None] = []
        for size, seed in zip(self.sizes, self.seeds):
            env_cfg = dataclasses.replace(cfg.env, num_envs=size, num_procs=min(procs, size) if procs else 0)
            env = make_vec_env(env_cfg, seed=seed)
            self.envs.append(env)
            self.instructions.append(None if env.instructions is None else np.asarray(env.instructions, dtype=str))
        self.obs: list[Any] = [None] * num_chunks

    def spaces(self) -> tuple[Any, Any]:
        return self.envs[0].observation_space, self.envs[0].action_space

    @contextmanager
    def _naming(self, c: int) -> Iterator[None]:
        """A chunk's VecEnv counts its envs from 0: an :class:`EnvError` names the env over all env workers."""
        try:
            yield
        except EnvError as err:
            if "env_index" in err.where:
                err.where["env_index"] += self.first[c]
            raise

    def start(self, c: int, iteration: int) -> EnvOutput:
        """Chunk ``c``'s first observation of an iteration (chunk 0 starts the iteration's tallies).
        Grouped (GRPO): the chunk's envs are reset in groups (see :func:`group_seeds`); else an
        episode goes on from the last iteration."""
        if c == 0:
            self.episodes: list[dict[str, float]] = []
            self.sim_s, self.env_steps, self.nonfinite = 0.0, 0, 0
            self.sim_spans: list[tuple[float, float]] = []  # (start_s, end_s) of every simulator call
            self.decisions = [0] * self.num_chunks
            # grouped: the iteration's rollouts are each env's first episode; the ones that start after
            # it (auto-reset) are cut short by the next iteration's reset and trained on by nobody
            self.first_episode = [np.ones(env.num_envs, bool) if self.grouped else None for env in self.envs]
        env = self.envs[c]
        group_ids = None
        with self._naming(c):
            t0 = time.perf_counter()
            if self.grouped:
                seeds, group_ids = group_seeds(self.cfg, self.first[c], env.num_envs, iteration)
                self.obs[c] = env.reset(seed=seeds)
            elif self.obs[c] is None:
                self.obs[c] = env.reset(seed=self.seeds[c])
            self._simulated(t0)
        return EnvOutput(with_instructions(self.obs[c], self.instructions[c]), group_ids=group_ids)

    def _simulated(self, t0: float) -> None:
        """Count a simulator call that began at ``t0`` (``time.perf_counter``) and ends now."""
        t1 = time.perf_counter()
        self.sim_s += t1 - t0
        self.sim_spans.append((t0, t1))

    def step(self, c: int, actions: np.ndarray) -> EnvOutput:
        """Step chunk ``c`` with one decision's ``actions`` (an action chunk for chunk policies)."""
        env = self.envs[c]
        with self._naming(c):
            t0 = time.perf_counter()
            res = env.chunk_step(actions) if self.cfg.policy.action_chunk > 1 else env.step(actions)
            self._simulated(t0)
        self.decisions[c] += 1
        out = env_output(res, self.instructions[c])
        dropped = res.info.get(NONFINITE_INFO_KEY)
        lost = 0 if dropped is None else int(to_numpy(dropped).sum())
        self.nonfinite += lost
        self.env_steps += int(out.valid.sum()) - lost  # a dropped episode's last step is not a real one
        self.obs[c] = res.obs
        first = self.first_episode[c]
        self.episodes.extend(res.episodes.finished(among=first))
        if first is not None:
            first &= ~to_numpy(res.episodes.done).astype(bool)
        return out

    def run(self, num_steps: int, iteration: int, policy: ChunkPolicy) -> dict[str, Any]:
        """The env step loop of one collection, the same for every worker that steps envs: each
        chunk's first observation goes to ``policy``, then up to ``num_steps`` times, chunk by
        chunk, the chunk steps with the actions ``policy`` answers and its output goes back (None
        instead of actions: the policy needs no more steps of the chunk). While chunk c waits for
        its actions, chunk c+1 is simulated: that is the pipelining. Returns :meth:`tallies`."""
        for c in range(self.num_chunks):
            policy.observe(c, self.start(c, iteration))
        active = list(range(self.num_chunks))
        for _ in range(num_steps):
            for c in list(active):
                actions = policy.actions(c)
                if actions is None:  # the policy needs no more steps of this chunk (GRPO: episodes over)
                    active.remove(c)
                    continue
                policy.observe(c, self.step(c, actions))
        return self.tallies()

    def tallies(self) -> dict[str, Any]:
        """The iteration so far: the episodes that finished (grouped: each env's first, the rollouts
        GRPO compares), the seconds spent simulating and the ``(start_s, end_s)`` spans of those
        calls (:mod:`pipelines.onpolicy.spans`), the env steps taken, the episodes
        ``env.nonfinite=drop`` ended (whose last step is not counted) and the decisions each chunk
        took (fewer than asked where the rollout stopped it)."""
        return {"episodes": self.episodes, "sim_s": self.sim_s, "sim_spans": self.sim_spans, "env_steps": self.env_steps,
                "nonfinite_episodes": self.nonfinite, "decisions": self.decisions}

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
