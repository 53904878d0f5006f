"""What a rollout produces (:class:`TrajectoryBatch`) and what a trainer iterates over (:class:`Samples`).

A :class:`TrajectoryBatch` holds *facts only*, time-major: T decisions of B envs (or samples). A
decision is one policy call: one env step, or an action chunk of C env steps applied with
``chunk_step``, or one LLM response (T = 1). Per-step env facts keep the chunk axis C, so an
algorithm can discount inside a chunk; nothing in the batch is derived from hyperparameters
(rewards are unscaled, no returns, no advantages, no bootstrap decisions). Algorithms turn a batch
into :class:`Samples` (flat, with advantages) and iterate minibatches and micro-batches over them.

Arrays are numpy on their way through channels and torch tensors inside an algorithm
(:meth:`TrajectoryBatch.to_torch`); language instructions stay numpy string arrays throughout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

Array = Any  # np.ndarray | torch.Tensor


def is_text(x: Array) -> bool:
    """Whether ``x`` is an array of strings (instructions), which never becomes a tensor."""
    return isinstance(x, np.ndarray) and x.dtype.kind in "USO"


@dataclass
class TrajectoryBatch:
    """T decisions of B envs, as the rollout recorded them. Shapes:

    obs:           dict of (T, B, ...) per key: the observation each decision was made in;
                   language goals as a (T, B) string array under the policy contract's
                   ``INSTRUCTION_KEY``; token prompts for LLMs (``prompt_ids``, ``prompt_mask``).
    actions:       (T, B, ...) what the policy's ``evaluate`` scores (continuous actions, discrete
                   actions, or token ids).
    logprobs:      (T, B) behaviour log-probabilities (action-level) or (T, B, K) (token-level).
    rewards:       (T, B, C) float, the env's reward at each of a decision's C env steps (0 at
                   steps after the episode ended inside the chunk), unscaled.
    terminated:    (T, B, C) bool, the episode reached a terminal state at that step.
    truncated:     (T, B, C) bool, a time limit cut the episode at that step.
    valid:         (T, B, C) bool, the step was taken in the episode the decision started in
                   (False after an episode ended inside a chunk).
    values:        (T, B) critic values V(obs_t), or None for critic-free policies.
    final_values:  (T, B) V(final observation) where an episode ended during decision t (any end:
                   termination or truncation; 0 elsewhere), or None without a critic.
    last_values:   (B,) V(obs_T) after the last decision, or None without a critic.
    action_mask:   (T, B, K) bool for token-level logprobs: which tokens are real, else None.
    success:       (T, B, C) bool, the env's success flag at each step, or None if it has none.
    group_ids:     (B,) int, envs that started this batch from the same initial state (GRPO
                   groups), or None.
    version:       the weight version of the policy that acted.
    """

    obs: dict[str, Array]
    actions: Array
    logprobs: Array
    rewards: Array
    terminated: Array
    truncated: Array
    valid: Array
    values: Array | None = None
    final_values: Array | None = None
    last_values: Array | None = None
    action_mask: Array | None = None
    success: Array | None = None
    group_ids: Array | None = None
    version: int = 0

    # --- shape -------------------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """T: decisions per env."""
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        """B: envs (or samples)."""
        return int(self.rewards.shape[1])

    @property
    def chunk(self) -> int:
        """C: env steps per decision."""
        return int(self.rewards.shape[2])

    @property
    def token_level(self) -> bool:
        return self.logprobs.ndim == 3

    def check(self) -> TrajectoryBatch:
        """Raise ValueError naming the field whose shape disagrees with the others; returns self."""
        T, B, C = self.rewards.shape if self.rewards.ndim == 3 else (None, None, None)
        if T is None:
            raise ValueError(f"TrajectoryBatch.rewards must be (T, B, C), got shape {tuple(self.rewards.shape)}")
        want = {"terminated": (T, B, C), "truncated": (T, B, C), "valid": (T, B, C), "success": (T, B, C),
                "values": (T, B), "final_values": (T, B), "last_values": (B,), "group_ids": (B,)}
        for name, shape in want.items():
            x = getattr(self, name)
            if x is not None and tuple(x.shape) != shape:
                raise ValueError(f"TrajectoryBatch.{name} must have shape {shape}, got {tuple(x.shape)}")
        for name, x in (("actions", self.actions), ("logprobs", self.logprobs), *((f"obs[{k!r}]", v) for k, v in self.obs.items())):
            if tuple(x.shape[:2]) != (T, B):
                raise ValueError(f"TrajectoryBatch.{name} must start with (T, B) = {(T, B)}, got {tuple(x.shape)}")
        if self.logprobs.ndim == 3:
            if self.action_mask is None or tuple(self.action_mask.shape) != tuple(self.logprobs.shape):
                raise ValueError("TrajectoryBatch: token-level logprobs (T, B, K) need an action_mask of the same shape")
        elif self.logprobs.ndim != 2:
            raise ValueError(f"TrajectoryBatch.logprobs must be (T, B) or (T, B, K), got {tuple(self.logprobs.shape)}")
        if (self.values is None) != (self.last_values is None):
            raise ValueError("TrajectoryBatch: values and last_values come together (a critic gives both)")
        return self

    # --- along the env axis ------------------------------------------------------------------------
    @classmethod
    def concat(cls, batches: Sequence[TrajectoryBatch]) -> TrajectoryBatch:
        """The batches side by side along the env axis B (same T, C, version and fields)."""
        if not batches:
            raise ValueError("TrajectoryBatch.concat needs at least one batch")
        versions = {b.version for b in batches}
        if len(versions) > 1:
            raise ValueError(f"TrajectoryBatch.concat: batches of different weight versions {sorted(versions)}")
        first = batches[0]
        out: dict[str, Any] = {"version": first.version}
        for f in dataclasses.fields(cls):
            if f.name == "version":
                continue
            values = [getattr(b, f.name) for b in batches]
            if f.name == "obs":
                out["obs"] = {k: _cat([v[k] for v in values], 1) for k in first.obs}
            elif all(v is None for v in values):
                out[f.name] = None
            elif any(v is None for v in values):
                raise ValueError(f"TrajectoryBatch.concat: {f.name} is missing in some batches")
            else:
                out[f.name] = _cat(values, 0 if f.name in ("last_values", "group_ids") else 1)
        return cls(**out)

    def select(self, envs: Array) -> TrajectoryBatch:
        """The batch of the envs ``envs`` (indices or a bool mask over B)."""
        idx = np.asarray(envs)
        out: dict[str, Any] = {"version": self.version}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "version":
                continue
            if f.name == "obs":
                out["obs"] = {k: x[:, _index(x, idx)] for k, x in v.items()}
            elif v is None:
                out[f.name] = None
            elif f.name in ("last_values", "group_ids"):
                out[f.name] = v[_index(v, idx)]
            else:
                out[f.name] = v[:, _index(v, idx)]
        return TrajectoryBatch(**out)

    def split(self, parts: int) -> list[TrajectoryBatch]:
        """``parts`` batches of consecutive envs (sizes differ by at most one)."""
        bounds = np.linspace(0, self.num_envs, parts + 1).round().astype(int)
        return [self.select(np.arange(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]

    def to_torch(self, device: torch.device | str = "cpu") -> TrajectoryBatch:
        """The same batch with every numeric array a tensor on ``device`` (strings stay numpy)."""
        def conv(x: Any) -> Any:
            if x is None or is_text(x):
                return x
            return torch.as_tensor(x, device=device)

        out = {f.name: conv(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in ("obs", "version")}
        return TrajectoryBatch(obs={k: conv(v) for k, v in self.obs.items()}, version=self.version, **out)

    def nbytes(self) -> int:
        """Bytes of every array in the batch (what a channel moves)."""
        total = 0
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            for x in (v.values() if isinstance(v, dict) else [v]):
                if isinstance(x, np.ndarray):
                    total += x.nbytes
                elif isinstance(x, torch.Tensor):
                    total += x.numel() * x.element_size()
        return total


def _cat(xs: list[Array], axis: int) -> Array:
    if isinstance(xs[0], torch.Tensor):
        return torch.cat(xs, dim=axis)
    return np.concatenate(xs, axis=axis)


def _index(x: Array, idx: np.ndarray) -> Any:
    return torch.as_tensor(idx, device=x.device) if isinstance(x, torch.Tensor) else idx


@dataclass
class Samples:
    """Flat training samples an algorithm derived from a batch: every field is (N, ...) on one
    device (instructions: an (N,) string array). ``fields`` holds the algorithm's own columns
    (advantages, returns, old values, reference logprobs, importance weights, ...)."""

    obs: dict[str, Array]
    actions: torch.Tensor
    logprobs: torch.Tensor
    """(N,) or (N, K): the log-probabilities PPO's ratio is taken against."""
    mask: torch.Tensor | None = None
    """(N, K) bool for token-level samples: which tokens count; None for action-level."""
    fields: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def __getitem__(self, idx: torch.Tensor) -> Samples:
        """The samples at ``idx`` (a 1-D index tensor)."""
        text = [k for k, v in self.obs.items() if is_text(v)]
        host = idx.cpu().numpy() if text else None
        return Samples(
            obs={k: (v[host] if k in text else v[idx]) for k, v in self.obs.items()},
            actions=self.actions[idx],
            logprobs=self.logprobs[idx],
            mask=None if self.mask is None else self.mask[idx],
            fields={k: v[idx] for k, v in self.fields.items()},
        )

    def minibatches(self, num: int, generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        """Index tensors of ``num`` shuffled minibatches covering every sample once (the last may
        be smaller). ``generator`` makes the shuffle reproducible without touching the global RNG."""
        n = len(self)
        perm = torch.randperm(n, generator=generator).to(self.actions.device)
        size = max(1, -(-n // max(1, num)))
        for start in range(0, n, size):
            yield perm[start : start + size]


def micro_batches(idx: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """``idx`` cut into consecutive pieces of at most ``size`` (None or >= len: one piece)."""
    if size is None or size >= len(idx):
        return [idx]
    return list(torch.split(idx, size))
