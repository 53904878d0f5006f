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


def compute_advantages(data: dict[str, Any], algo: PPOConfig, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns (T, B) of a batch; ``algo.bootstrap_terminated`` bootstraps
    terminations from ``final_values`` like truncations."""
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
        gamma=algo.gamma,
        lam=algo.gae_lambda,
    )


def ppo_update(policy: Policy, optimizer: torch.optim.Optimizer, data: dict[str, Any], algo: PPOConfig, lr: float, dev: torch.device) -> dict[str, float]:
    """GAE + ``algo.epochs`` epochs of minibatch PPO on ``data``.

    data: ``obs`` dict of (T, B, ...), ``actions`` (T, B, ...), ``logprobs``/``values``/``rewards``/
    ``final_values`` (T, B), ``terminated``/``truncated`` (T, B) bool, ``last_values`` (B,).
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
