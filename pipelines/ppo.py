"""One PPO update on a batch of trajectories: the same code for the Ray trainer and the plain loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from embodied.rl import gae, normalize_advantages, ppo_loss, should_stop_early
from pipelines.config import PPOConfig
from policies.base import Policy


def bootstraps(terminated: Any, truncated: Any, algo: PPOConfig) -> Any:
    """Which episode ends bootstrap from ``V(final obs)``: truncations, and terminations too with
    ``algo.bootstrap_terminated`` (numpy arrays or torch tensors of bools)."""
    return truncated | terminated if algo.bootstrap_terminated else truncated


def chunk_transition(
    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, valid: np.ndarray, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One decision's transition from a chunk of C env steps (``VecEnv.chunk_step``), as a
    semi-MDP step: ``(reward, terminated, truncated, steps)``, each (N,).

    ``reward`` is the chunk's discounted return ``sum_j gamma**j * rewards[:, j]`` over its valid
    steps; ``terminated``/``truncated`` say how the episode ended inside the chunk (termination
    wins); ``steps`` counts the env steps taken. With GAE at discount ``gamma**C`` per decision
    (:func:`compute_advantages` with ``action_chunk=C``) a chunk that ran to its end is discounted
    exactly as its C steps; a truncated one is bootstrapped from its final observation after
    ``steps`` steps, so its final value is scaled by ``gamma ** (steps - C)`` (see
    :func:`bootstrap_scale`).

    rewards: (N, C) float; terminated, truncated, valid: (N, C) bool.
    """
    valid = np.asarray(valid, bool)
    chunk = rewards.shape[1]
    discounts = gamma ** np.arange(chunk, dtype=np.float64)
    reward = (np.where(valid, rewards, 0.0) * discounts).sum(1).astype(np.float32)
    term = (np.asarray(terminated, bool) & valid).any(1)
    trunc = (np.asarray(truncated, bool) & valid).any(1) & ~term
    return reward, term, trunc, valid.sum(1)


def bootstrap_scale(steps: np.ndarray, chunk: int, gamma: float) -> np.ndarray:
    """``gamma ** (steps - chunk)`` (N,): turns GAE's per-decision ``gamma**chunk`` into the
    ``gamma**steps`` that a chunk cut short after ``steps`` steps should discount its bootstrap by."""
    return (gamma ** (np.asarray(steps, np.float64) - chunk)).astype(np.float32)


def compute_advantages(data: dict[str, Any], algo: PPOConfig, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns (T, B) of a batch; ``algo.bootstrap_terminated`` bootstraps
    terminations from ``final_values`` like truncations. A batch of action chunks
    (``data["action_chunk"]`` = C > 1, one decision per chunk) discounts by ``gamma**C`` per decision."""
    tens = lambda x: torch.as_tensor(np.asarray(x), device=dev)  # noqa: E731
    terminated, truncated = tens(data["terminated"]).bool(), tens(data["truncated"]).bool()
    if algo.bootstrap_terminated:  # every episode end bootstraps from V(final obs), like a time limit
        terminated, truncated = torch.zeros_like(terminated), bootstraps(terminated, truncated, algo)
    return gae(
        tens(data["rewards"]).float(),
        tens(data["values"]).float(),
        terminated,
        truncated,
        tens(data["final_values"]).float(),
        tens(data["last_values"]).float(),
        gamma=algo.gamma ** int(data.get("action_chunk", 1)),
        lam=algo.gae_lambda,
    )


def ppo_update(policy: Policy, optimizer: torch.optim.Optimizer, data: dict[str, Any], algo: PPOConfig, lr: float, dev: torch.device) -> dict[str, float]:
    """GAE + ``algo.epochs`` epochs of minibatch PPO on ``data``.

    data: ``obs`` dict of (T, B, ...), ``actions`` (T, B, ...), ``logprobs``/``values``/``rewards``/
    ``final_values`` (T, B), ``terminated``/``truncated`` (T, B) bool, ``last_values`` (B,), and
    optionally ``action_chunk`` (C: each of the T steps is a decision of C env steps).
    Returns mean losses and stats over the minibatches (namespaced keys).
    """
    tens = lambda x: torch.as_tensor(np.asarray(x), device=dev)  # noqa: E731
    obs = {k: tens(v) for k, v in data["obs"].items()}  # (T, B, ...)
    T, B = data["rewards"].shape
    advantages, returns = compute_advantages(data, algo, dev)
    flat = lambda x: x.reshape(T * B, *x.shape[2:])  # noqa: E731
    obs = {k: flat(v) for k, v in obs.items()}
    policy.update_normalizer(obs)
    actions, old_logprobs, old_values = flat(tens(data["actions"])), flat(tens(data["logprobs"])), flat(tens(data["values"]))
    advantages, returns = flat(advantages), flat(returns)
    for group in optimizer.param_groups:
        group["lr"] = lr
    n = T * B
    mb = max(1, n // algo.num_minibatches)
    sums: dict[str, float] = {}
    count = 0
    stop = False
    epochs_run = 0
    for _ in range(algo.epochs):
        perm = torch.randperm(n, device=dev)
        for start in range(0, n, mb):
            idx = perm[start : start + mb]
            ev = policy.evaluate({k: v[idx] for k, v in obs.items()}, actions[idx])
            adv = advantages[idx]
            if algo.norm_adv and len(idx) > 1:
                adv = normalize_advantages(adv)
            loss, stats = ppo_loss(
                ev.logprobs,
                old_logprobs[idx],
                adv,
                new_values=ev.values,
                old_values=old_values[idx],
                returns=returns[idx],
                entropy=ev.entropy,
                clip_ratio=algo.clip_ratio,
                dual_clip=algo.dual_clip,
                value_clip=algo.value_clip,
                vf_coef=algo.vf_coef,
                ent_coef=algo.ent_coef,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), algo.max_grad_norm)
            optimizer.step()
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            sums["losses/grad_norm"] = sums.get("losses/grad_norm", 0.0) + float(grad_norm)
            count += 1
            if should_stop_early(stats["losses/approx_kl"], algo.target_kl):
                stop = True
                break
        epochs_run += 1
        if stop:
            break
    out = {k: v / max(count, 1) for k, v in sums.items()}
    y, yhat = returns, old_values
    var_y = torch.var(y)
    out["losses/explained_variance"] = float(1 - torch.var(y - yhat) / var_y) if var_y > 0 else float("nan")
    out["losses/epochs"] = float(epochs_run)
    out["charts/lr"] = lr
    return out
