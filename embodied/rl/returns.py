"""From a rollout's per-step facts to what an algorithm learns from, each rule in one function.

* :func:`chunk_rewards`: a decision's reward, discounting inside an action chunk;
* :func:`decision_ends`: how each decision's episode ended (termination wins over truncation);
* :func:`bootstrap_rule`: which episode ends bootstrap from the value of their final observation;
* :func:`chunk_bootstrap_discount`: the extra discount of a bootstrap after a chunk cut short;
* :func:`first_episode_mask` / :func:`first_episode_outcome`: the decisions and the outcome of each
  env's first episode in a batch (GRPO's unit: one episode per env, groups from one initial state).

Shapes: T decisions, B envs, C env steps per decision (1 without action chunks).
"""

from __future__ import annotations

from typing import Literal

import torch

from embodied.rl._checks import as_bool, check_range, check_rank, check_shape

OutcomeKind = Literal["success", "return"]


def chunk_rewards(rewards: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """Each decision's discounted reward ``sum_j gamma**j * rewards[..., j]`` over its valid steps.

    A decision of C env steps is one transition of a semi-MDP: with GAE at discount ``gamma**C``
    per decision, a chunk that ran to its end is discounted exactly as its C steps.

    rewards: (T, B, C) float; valid: (T, B, C) bool. Returns (T, B).
    """
    fn = "chunk_rewards"
    rewards = check_rank(fn, "rewards", rewards, 3, "(T, B, C)")
    valid = as_bool(fn, "valid", check_shape(fn, "valid", valid, rewards.shape, "(T, B, C)", "rewards"))
    check_range(fn, "gamma", gamma, 0.0, 1.0)
    discounts = gamma ** torch.arange(rewards.shape[2], dtype=torch.float64, device=rewards.device)
    return (torch.where(valid, rewards.double(), 0.0) * discounts).sum(-1).to(rewards.dtype)


def decision_ends(
    terminated: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How each decision's episode ended: ``(terminated, truncated, steps)``, each (T, B).

    ``terminated`` / ``truncated`` say whether the episode the decision started in ended inside it
    by termination or by a time limit (termination wins when both flags are set); ``steps`` counts
    the env steps the decision took (C unless its episode ended earlier).

    terminated, truncated, valid: (T, B, C) bool.
    """
    fn = "decision_ends"
    terminated = as_bool(fn, "terminated", check_rank(fn, "terminated", terminated, 3, "(T, B, C)"))
    truncated = as_bool(fn, "truncated", check_shape(fn, "truncated", truncated, terminated.shape, "(T, B, C)", "terminated"))
    valid = as_bool(fn, "valid", check_shape(fn, "valid", valid, terminated.shape, "(T, B, C)", "terminated"))
    term = (terminated & valid).any(-1)
    trunc = (truncated & valid).any(-1) & ~term
    return term, trunc, valid.sum(-1)


def bootstrap_rule(
    terminated: torch.Tensor, truncated: torch.Tensor, bootstrap_terminated: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(terminal, bootstrap)`` (T, B): which episode ends have no future (value 0) and which
    continue from ``V(final observation)``.

    A truncation (time limit) always bootstraps: the state had a future the limit cut off. A
    termination is terminal, unless ``bootstrap_terminated``: ManiSkill's convention for tasks that
    terminate on *success*, where reaching the goal should be worth as much as staying there.
    """
    if bootstrap_terminated:
        return torch.zeros_like(terminated), terminated | truncated
    return terminated, truncated


def chunk_bootstrap_discount(steps: torch.Tensor, chunk: int, gamma: float) -> torch.Tensor:
    """``gamma ** (steps - chunk)`` (T, B): GAE discounts a decision's bootstrap by ``gamma**chunk``;
    a chunk cut short after ``steps`` steps should discount its final value by ``gamma**steps``."""
    return torch.pow(torch.as_tensor(gamma, dtype=torch.float64, device=steps.device), steps.double() - chunk).float()


def first_episode_mask(terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """(T, B) bool: the decisions of each env's first episode in the batch, up to and including
    the decision in which it ended (all T decisions when it did not end).

    terminated, truncated: (T, B) bool from :func:`decision_ends`.
    """
    ended = (terminated | truncated).long()
    ended_before = torch.cumsum(ended, dim=0) - ended  # episode ends strictly before decision t
    return ended_before == 0


def first_episode_outcome(
    rewards: torch.Tensor, valid: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
    success: torch.Tensor | None, kind: OutcomeKind,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(outcome, finished)`` (B,) of each env's first episode in the batch.

    ``kind="success"``: 1.0 if the env reported success at any step of the episode, else 0.0 (needs
    ``success``); ``kind="return"``: the undiscounted sum of its rewards. ``finished`` says whether
    the episode ended within the batch (an unfinished one is scored on the steps it took).

    rewards, valid, terminated, truncated, success: (T, B, C).
    """
    fn = "first_episode_outcome"
    term_d, trunc_d, _ = decision_ends(terminated, truncated, valid)
    in_first = first_episode_mask(term_d, trunc_d).unsqueeze(-1) & as_bool(fn, "valid", valid)  # (T, B, C)
    finished = (term_d | trunc_d).any(0)
    if kind == "success":
        if success is None:
            raise ValueError(f"{fn}: outcome 'success' needs the env's success flags; this env reports none "
                             "(use the episode 'return' as the outcome)")
        outcome = (as_bool(fn, "success", success) & in_first).any(-1).any(0).to(rewards.dtype)
    elif kind == "return":
        outcome = torch.where(in_first, rewards, 0.0).sum((0, 2))
    else:
        raise ValueError(f"{fn}: `kind` must be 'success' or 'return', got {kind!r}")
    return outcome, finished


def first_episode_returns_to_go(
    rewards: torch.Tensor, valid: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """(T, B): each decision's discounted reward from it to the end of the env's first episode in
    the batch, ``sum_k gamma**k r_{t+k}`` over env steps (0 for decisions after that episode ended).

    rewards, valid, terminated, truncated: (T, B, C).
    """
    fn = "first_episode_returns_to_go"
    term_d, trunc_d, _ = decision_ends(terminated, truncated, valid)
    in_first = first_episode_mask(term_d, trunc_d).unsqueeze(-1) & as_bool(fn, "valid", valid)  # (T, B, C)
    chunk = rewards.shape[-1]
    per_decision = chunk_rewards(torch.where(in_first, rewards, 0.0), in_first, gamma)  # (T, B)
    to_go = torch.zeros_like(per_decision)
    running = torch.zeros_like(per_decision[0])
    for t in reversed(range(per_decision.shape[0])):  # a decision of C steps discounts what follows by gamma**C
        running = per_decision[t] + gamma**chunk * running
        to_go[t] = running
    return to_go
