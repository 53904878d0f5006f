"""The rollout's half of the macro flow: turning env outputs into a :class:`TrajectoryBatch`.

One :class:`TrajectoryRecorder` per env chunk. The Ray :class:`~pipelines.onpolicy.workers.RolloutWorker`
and the single-process reference loop (:mod:`pipelines.plain_loop`) drive it the same way::

    recorder.begin(first_output)                 # the chunk's observation (and GRPO group ids)
    for t in range(T):
        env_actions = recorder.act()             # the policy decides in the current observation
        recorder.observe(env.step(env_actions))  # what the env did: rewards, episode ends, ...
    batch = recorder.finish(version)             # facts only: no returns, no advantages

Every env output is in chunk form, (B, C) per step of a decision, so per-step policies (C = 1) and
action-chunk policies (VLAs) share one path.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.rl import TrajectoryBatch, is_text
from embodied.seeding import RngStream
from envs.base import ChunkStepResult, Obs, StepResult, to_numpy
from policies.base import INSTRUCTION_KEY, Policy


@dataclass
class EnvOutput:
    """One message from an env chunk to its rollout (B envs, C env steps per decision).

    obs:        the observation the next decision is made in (after an episode ended: the first of
                the next episode); language goals under ``INSTRUCTION_KEY`` when the env has them.
    rewards, terminated, truncated, valid, success: (B, C) per step of the decision just taken, or
                None for the first observation of an iteration (``success`` None if the env has none).
    final_obs:  the last observation of episodes that ended in the decision, or None.
    group_ids:  (B,) int on the first observation of an iteration whose envs were reset in groups.
    """

    obs: Obs
    rewards: np.ndarray | None = None
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    valid: np.ndarray | None = None
    success: np.ndarray | None = None
    final_obs: Obs | None = None
    group_ids: np.ndarray | None = None


def with_instructions(obs: Obs, instructions: np.ndarray | None) -> Obs:
    """``obs`` with the env's language goals under ``INSTRUCTION_KEY`` (a (B,) string array)."""
    if instructions is None:
        return obs
    return {**obs, INSTRUCTION_KEY: instructions}


def env_output(res: StepResult | ChunkStepResult, instructions: np.ndarray | None) -> EnvOutput:
    """A step's or chunk step's result as a chunk-form :class:`EnvOutput`."""
    if isinstance(res, ChunkStepResult):
        rewards, terminated, truncated, valid = (to_numpy(x) for x in (res.rewards, res.terminated, res.truncated, res.valid))
        success = res.info.get("success")  # (B,) at the chunk's last valid step
        if success is not None:
            flags = np.zeros(valid.shape, bool)
            rows = np.arange(len(valid))
            flags[rows, np.maximum(valid.sum(1) - 1, 0)] = to_numpy(success).astype(bool)
            success = flags
    else:
        column = lambda x: to_numpy(x).reshape(-1, 1)  # noqa: E731  (B,) -> (B, 1)
        rewards, terminated, truncated = column(res.reward), column(res.terminated), column(res.truncated)
        valid = np.ones_like(terminated, dtype=bool)
        success = res.info.get("success")
        success = None if success is None else column(success).astype(bool)
    return EnvOutput(with_instructions(res.obs, instructions), rewards.astype(np.float32), terminated.astype(bool),
                     truncated.astype(bool), valid.astype(bool), success, res.final_obs)


def to_torch(obs: Obs, device: torch.device) -> dict[str, Any]:
    """Observations as tensors on ``device`` (sharing memory with the arrays where possible); string
    arrays (instructions) stay numpy. Arrays that arrive through Ray's object store are read-only;
    they are only ever read here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {k: v if is_text(v) else torch.as_tensor(v, device=device) for k, v in obs.items()}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class TrajectoryRecorder:
    """Records one env chunk's decisions (see the module docstring).

    ``record_values``: record V(obs) of every decision, V(final obs) of every episode end and V of
    the last observation (what a critic-based algorithm needs); off for critic-free training.
    ``rng``: the stream the policy samples from (None: torch's global generator).
    """

    def __init__(self, policy: Policy, device: torch.device, record_values: bool, action_space: Any,
                 rng: RngStream | None = None) -> None:
        self.policy, self.device, self.record_values, self.rng = policy, device, record_values, rng
        low = getattr(action_space, "low", None)
        self.bounds = None if low is None else (np.asarray(action_space.low, np.float32), np.asarray(action_space.high, np.float32))
        self.reset()

    def begin(self, out: EnvOutput) -> None:
        """The chunk's first observation of the iteration."""
        self.current = out.obs
        self.group_ids = out.group_ids

    @torch.no_grad()
    def act(self) -> np.ndarray:
        """Decide in the current observation; returns the actions the env executes (clipped to
        the action space's bounds)."""
        assert self.current is not None, "act() before begin()"
        obs = self.current
        if self.rng is not None:
            with self.rng:
                out = self.policy.act(to_torch(obs, self.device))
        else:
            out = self.policy.act(to_torch(obs, self.device))
        self.obs.append({k: np.asarray(v) if is_text(v) else to_numpy(v) for k, v in obs.items()})
        self.actions.append(out.actions.cpu().numpy())
        self.logprobs.append(out.logprobs.float().cpu().numpy())
        if out.mask is not None:
            self.masks.append(out.mask.cpu().numpy())
        if self.record_values:
            if out.values is None:
                raise ValueError(f"{type(self.policy).__name__} returned no values, but the algorithm needs a critic")
            self.values.append(out.values.float().cpu().numpy())
        env_actions = (out.env_actions if out.env_actions is not None else out.actions).cpu().numpy()
        if self.bounds is not None:
            env_actions = np.clip(env_actions, *self.bounds)
        return env_actions

    @torch.no_grad()
    def observe(self, out: EnvOutput) -> None:
        """What the env did after the last decision; ``out.obs`` is the next one's observation."""
        assert out.rewards is not None, "observe() needs the result of a step"
        self.steps.append(out)
        ended = ((out.terminated | out.truncated) & out.valid).any(1)  # (B,) an episode ended in the decision
        self.ended = ended if self.ended is None else self.ended | ended
        if self.record_values:
            final = np.zeros(len(out.rewards), np.float32)
            if ended.any() and out.final_obs is not None:
                rows = np.flatnonzero(ended)
                final[rows] = self._value({k: v[rows] for k, v in out.final_obs.items()})
            self.final_values.append(final)
        self.current = out.obs

    def first_episodes_done(self) -> bool:
        """Whether every env's first episode of the batch has ended (GRPO needs no more steps)."""
        return self.ended is not None and bool(self.ended.all())

    def _value(self, obs: Obs) -> np.ndarray:
        return self.policy.value(to_torch(obs, self.device)).float().cpu().numpy()

    @torch.no_grad()
    def finish(self, version: int, num_steps: int | None = None) -> TrajectoryBatch:
        """The recorded decisions as a batch of ``num_steps`` decisions (default: as recorded); a
        recording stopped early is padded with decisions that are not valid (``valid`` False, no
        reward, no episode end). The recorder is empty afterwards."""
        assert self.current is not None and len(self.steps) == len(self.actions), "finish() needs one observe() per act()"
        for _ in range(len(self.actions), num_steps or len(self.actions)):
            self._pad()
        stack = lambda xs: np.stack(xs)  # noqa: E731  T x (B, ...) -> (T, B, ...)
        steps = self.steps
        has_success = all(s.success is not None for s in steps)
        batch = TrajectoryBatch(
            obs={k: stack([o[k] for o in self.obs]) for k in self.obs[0]},
            actions=stack(self.actions),
            logprobs=stack(self.logprobs),
            rewards=stack([s.rewards for s in steps]),
            terminated=stack([s.terminated for s in steps]),
            truncated=stack([s.truncated for s in steps]),
            valid=stack([s.valid for s in steps]),
            values=stack(self.values) if self.record_values else None,
            final_values=stack(self.final_values) if self.record_values else None,
            last_values=self._value(self.current) if self.record_values else None,
            action_mask=stack(self.masks) if self.masks else None,
            success=stack([s.success for s in steps]) if has_success and steps else None,
            group_ids=self.group_ids,
            version=version,
        )
        self.reset()
        return batch.check()

    def _pad(self) -> None:
        """One decision that did not happen: the last observation again, zero actions and
        logprobs, nothing valid."""
        last = self.steps[-1]
        self.obs.append(self.obs[-1])
        for xs in (self.actions, self.logprobs, self.masks, self.values, self.final_values):
            if xs:
                xs.append(np.zeros_like(xs[-1]))
        none = np.zeros_like(last.valid)
        self.steps.append(EnvOutput(last.obs, np.zeros_like(last.rewards), none, none, none,
                                    None if last.success is None else none))

    def reset(self) -> None:
        """Forget recorded decisions (keep the policy, device, bounds and stream)."""
        self.obs: list[Obs] = []
        self.actions: list[np.ndarray] = []
        self.logprobs: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.steps: list[EnvOutput] = []
        self.final_values: list[np.ndarray] = []
        self.current: Obs | None = None
        self.group_ids: np.ndarray | None = None
        self.ended: np.ndarray | None = None  # (B,) the env's first episode of the batch has ended
