"""The replay buffer of off-policy RL: per-env ring buffers on the trainer's device.

    buffer = ReplayBuffer(capacity=1_000_000, num_envs=32, obs_shapes={"state": (25,)}, action_shape=(8,))
    buffer.extend(Transitions(obs, actions, rewards, next_obs, terminated, truncated))   # (T, B, ...)
    batch = buffer.sample(1024, generator, gamma=0.8, n_step=1)                          # a ReplaySample

Storage is time-major, ``(L, B, ...)`` with ``L = capacity // num_envs`` rows per env column, so
the steps of one env's stream are consecutive rows of its column and n-step returns are read at
sampling time. ``next_obs`` is stored per step: after an episode ended it is that episode's final
observation (the env contract's ``final_obs``), never the first one of the next episode.

An n-step sample from step t of env b sums ``gamma**k * r[t + k]`` over the steps k < n that belong
to t's episode and are already stored, and bootstraps from ``next_obs`` of the last of them:

* the episode **terminated** at that step: no bootstrap (``discount`` 0), unless
  ``bootstrap_terminated`` (tasks that terminate on success, ManiSkill's ``bootstrap_at_done``);
* it was **truncated** (time limit): bootstrap from the final observation, ``discount = gamma**m``;
* neither, the n steps were all taken, or the stream's newest stored step came first:
  ``discount = gamma**m`` with m the steps summed.

:func:`mixed_sample` draws a fixed share of a batch from a second buffer of demonstrations (RLPD's
symmetric sampling: half and half).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

Obs = dict[str, torch.Tensor]


@dataclass
class Transitions:
    """Env steps to store, time-major ``(T, B, ...)`` (T steps of B env streams), any device.

    obs, next_obs: per key (T, B, *shape); ``next_obs`` is the final observation where an episode ended.
    actions:       (T, B, *action_shape) what the env executed.
    rewards:       (T, B) float.
    terminated:    (T, B) bool, the episode reached a terminal state at this step.
    truncated:     (T, B) bool, a time limit cut the episode at this step.
    """

    obs: Obs
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: Obs
    terminated: torch.Tensor
    truncated: torch.Tensor

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @staticmethod
    def concat_envs(parts: list[Transitions]) -> Transitions:
        """The env columns of ``parts`` side by side (each part: the same T)."""
        cat = lambda xs: torch.cat([torch.as_tensor(x) for x in xs], dim=1)  # noqa: E731
        return Transitions(
            obs={k: cat([p.obs[k] for p in parts]) for k in parts[0].obs},
            actions=cat([p.actions for p in parts]), rewards=cat([p.rewards for p in parts]),
            next_obs={k: cat([p.next_obs[k] for p in parts]) for k in parts[0].next_obs},
            terminated=cat([p.terminated for p in parts]), truncated=cat([p.truncated for p in parts]),
        )


@dataclass
class ReplaySample:
    """A sampled batch (M samples): the target of each is ``rewards + discounts * V(next_obs)``.

    obs, next_obs: per key (M, *shape).
    actions:       (M, *action_shape).
    rewards:       (M,) the discounted n-step reward sum.
    discounts:     (M,) ``gamma**m`` of the bootstrap (m steps summed), 0 after a termination.
    """

    obs: Obs
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: Obs
    discounts: torch.Tensor

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    @staticmethod
    def concat(parts: list[ReplaySample]) -> ReplaySample:
        return ReplaySample(
            obs={k: torch.cat([p.obs[k] for p in parts]) for k in parts[0].obs},
            actions=torch.cat([p.actions for p in parts]), rewards=torch.cat([p.rewards for p in parts]),
            next_obs={k: torch.cat([p.next_obs[k] for p in parts]) for k in parts[0].next_obs},
            discounts=torch.cat([p.discounts for p in parts]),
        )


class ReplayBuffer:
    """``capacity`` transitions of ``num_envs`` env streams, the oldest overwritten first."""

    def __init__(self, capacity: int, num_envs: int, obs_shapes: dict[str, tuple[int, ...]], action_shape: tuple[int, ...],
                 device: torch.device | str = "cpu", obs_dtypes: dict[str, torch.dtype] | None = None) -> None:
        if num_envs < 1 or capacity < num_envs:
            raise ValueError(f"ReplayBuffer: capacity ({capacity}) must hold at least one step of num_envs ({num_envs}) envs")
        self.num_envs, self.device = num_envs, torch.device(device)
        self.rows = capacity // num_envs  # L: steps per env stream
        dtypes = obs_dtypes or {}
        L, B = self.rows, num_envs
        self.obs = {k: torch.zeros((L, B, *s), dtype=dtypes.get(k, torch.float32), device=self.device) for k, s in obs_shapes.items()}
        self.next_obs = {k: torch.zeros_like(v) for k, v in self.obs.items()}
        self.actions = torch.zeros((L, B, *action_shape), dtype=torch.float32, device=self.device)
        self.rewards = torch.zeros((L, B), dtype=torch.float32, device=self.device)
        self.terminated = torch.zeros((L, B), dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros((L, B), dtype=torch.bool, device=self.device)
        self.pos = 0  # the row the next step goes to
        self.full = False  # every row holds a step (the ring has wrapped)

    @property
    def capacity(self) -> int:
        return self.rows * self.num_envs

    @property
    def filled_rows(self) -> int:
        return self.rows if self.full else self.pos

    def __len__(self) -> int:
        """Transitions stored."""
        return self.filled_rows * self.num_envs

    # --- writing -----------------------------------------------------------------------------------
    def extend(self, steps: Transitions) -> None:
        """Store ``steps`` (T, B): T new rows of every env stream (B must be ``num_envs``)."""
        if steps.num_envs != self.num_envs:
            raise ValueError(f"ReplayBuffer.extend: got {steps.num_envs} env columns, the buffer has {self.num_envs}")
        T = steps.num_steps
        if T > self.rows:  # only the newest rows fit
            steps = _rows_of(steps, slice(T - self.rows, T))
            T = self.rows
        rows = (self.pos + torch.arange(T, device=self.device)) % self.rows
        put = lambda dst, src: dst.index_copy_(0, rows, torch.as_tensor(src).to(self.device, dst.dtype))  # noqa: E731
        for k in self.obs:
            put(self.obs[k], steps.obs[k])
            put(self.next_obs[k], steps.next_obs[k])
        put(self.actions, steps.actions)
        put(self.rewards, steps.rewards)
        put(self.terminated, steps.terminated)
        put(self.truncated, steps.truncated)
        self.full = self.full or self.pos + T >= self.rows
        self.pos = (self.pos + T) % self.rows

    # --- sampling ----------------------------------------------------------------------------------
    def sample(self, batch_size: int, generator: torch.Generator | None, gamma: float, n_step: int = 1,
               bootstrap_terminated: bool = False) -> ReplaySample:
        """``batch_size`` transitions drawn uniformly (with replacement), with n-step returns (see
        the module docstring). ``generator``: on the buffer's device."""
        if len(self) == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty")
        if n_step < 1:
            raise ValueError(f"ReplayBuffer.sample: n_step must be >= 1 (got {n_step})")
        flat = torch.randint(0, len(self), (batch_size,), generator=generator, device=self.device)
        return self.gather(flat // self.num_envs, flat % self.num_envs, gamma, n_step, bootstrap_terminated)

    def gather(self, rows: torch.Tensor, envs: torch.Tensor, gamma: float, n_step: int = 1,
               bootstrap_terminated: bool = False) -> ReplaySample:
        """The n-step samples starting at physical ``rows`` (M,) of env columns ``envs`` (M,)."""
        newest = (self.pos - 1) % self.rows
        ahead = (newest - rows) % self.rows  # steps stored after each start in its stream
        reward = torch.zeros(rows.shape, dtype=torch.float32, device=self.device)
        discount = torch.ones_like(reward)
        last = rows.clone()  # the row whose next_obs the sample bootstraps from
        live = torch.ones(rows.shape, dtype=torch.bool, device=self.device)
        for k in range(n_step):
            row = (rows + k) % self.rows
            take = live & (k <= ahead)
            reward = reward + torch.where(take, discount * self.rewards[row, envs], 0.0)
            discount = torch.where(take, discount * gamma, discount)
            last = torch.where(take, row, last)
            terminated = self.terminated[row, envs] & take
            if not bootstrap_terminated:
                discount = torch.where(terminated, 0.0, discount)
            live = take & ~(terminated | self.truncated[row, envs])
        return ReplaySample(
            obs={k: v[rows, envs] for k, v in self.obs.items()},
            actions=self.actions[rows, envs], rewards=reward,
            next_obs={k: v[last, envs] for k, v in self.next_obs.items()},
            discounts=discount,
        )

    # --- state -------------------------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        """The stored rows and the write position, as tensors (a checkpoint's ``replay.*``)."""
        n = self.filled_rows
        out = {f"obs.{k}": v[:n] for k, v in self.obs.items()}
        out.update({f"next_obs.{k}": v[:n] for k, v in self.next_obs.items()})
        out.update(actions=self.actions[:n], rewards=self.rewards[:n], terminated=self.terminated[:n],
                   truncated=self.truncated[:n], position=torch.tensor([self.pos, int(self.full)], dtype=torch.int64))
        return {k: v.detach().cpu() for k, v in out.items()}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from :meth:`state` of a buffer of the same shape."""
        pos, full = (int(x) for x in state["position"])
        n = self.rows if full else pos
        rows = state["rewards"].shape[0]
        if rows != n or n > self.rows or state["rewards"].shape[1] != self.num_envs:
            raise ValueError(f"replay state of {tuple(state['rewards'].shape)} steps x envs does not fit this buffer "
                             f"of {self.rows} x {self.num_envs}")
        for k in self.obs:
            self.obs[k][:n] = state[f"obs.{k}"].to(self.device)
            self.next_obs[k][:n] = state[f"next_obs.{k}"].to(self.device)
        for name in ("actions", "rewards", "terminated", "truncated"):
            getattr(self, name)[:n] = state[name].to(self.device)
        self.pos, self.full = pos, bool(full)


def mixed_sample(online: ReplayBuffer, demos: ReplayBuffer | None, batch_size: int, demo_ratio: float,
                 generator: torch.Generator | None, gamma: float, n_step: int = 1,
                 bootstrap_terminated: bool = False) -> ReplaySample:
    """A batch of ``round(batch_size * demo_ratio)`` demonstration samples followed by online ones
    (RLPD's symmetric sampling at ``demo_ratio`` 0.5); all online without demonstrations."""
    k = 0 if demos is None or len(demos) == 0 else int(round(batch_size * demo_ratio))
    args = dict(generator=generator, gamma=gamma, n_step=n_step, bootstrap_terminated=bootstrap_terminated)
    if k == 0:
        return online.sample(batch_size, **args)
    assert demos is not None
    if k == batch_size:
        return demos.sample(batch_size, **args)
    return ReplaySample.concat([demos.sample(k, **args), online.sample(batch_size - k, **args)])


def _rows_of(steps: Transitions, rows: slice) -> Transitions:
    out: dict[str, Any] = {}
    for f in fields(steps):
        v = getattr(steps, f.name)
        out[f.name] = {k: x[rows] for k, x in v.items()} if isinstance(v, dict) else v[rows]
    return Transitions(**out)
