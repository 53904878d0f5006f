"""Behaviour-cloning warm start: demonstrations -> the policy's NLL of them -> ``policy.init``.

RL from a randomly initialised VLA never sees a success (GRPO's groups are then all-zero and carry
no gradient; PPO's critic has nothing to explain). So a run can start from a policy cloned from an
expert's demonstrations, recorded as the policy sees them (images, instruction, state)::

    cfg, result = apply_warm_start(cfg)      # no-op without warmstart.expert
    result.path                              # policy.safetensors, now cfg.policy.init
    result.metrics                           # bc/val_nll_first, bc/val_nll_last, bc/success, ...

The loss is generic over the policy contract: the negative log-likelihood of the demonstrated
actions through ``policy.evaluate(obs, policy.encode_actions(actions))``, per scored entry (the
action tokens of a VLA: OpenVLA's bins of the BOUNDS_Q99-normalized actions; the whole action of
a Gaussian MLP). The result is cached under ``$EMBODIED_CACHE/warmstart/bc-<hash>`` of what decides
it (env, policy, ``warmstart.*``, seed, the expert, library versions); a second run with the same
config loads it. ``python -m pipelines.warmstart RECIPE [key=value ...]`` runs it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from embodied.config import to_dict
from embodied.profiler import cache_dir as profile_cache_dir
from envs.registry import make_vec_env
from pipelines.collect import resolve_device, to_torch
from pipelines.config import EmbodiedConfig, WarmStartConfig
from pipelines.demonstrations import Demonstrations, collect_demonstrations, load_expert
from pipelines.evaluate import evaluate_policy
from policies.base import Policy
from policies.registry import build_policy

LOG = logging.getLogger("embodied")
#: Bump when the training code changes what a cached result would be.
CACHE_VERSION = 2
POLICY_FILE = "policy.safetensors"
SUMMARY_FILE = "warmstart.json"
#: Env settings that change how fast demonstrations are collected, not what they are.
_SPEED_ONLY = ("num_envs", "backend", "num_procs", "worker_spin_us")
#: Seed offsets of the demonstrations and of the stopping rule's evaluations (apart from RL's).
DEMO_SEED, EVAL_SEED = 20_000_000, 30_000_000


@dataclass
class WarmStartResult:
    """Where the cloned weights are and how the cloning went."""

    path: Path
    metrics: dict[str, Any]
    cached: bool

    def write_summary(self, run_dir: str | Path) -> Path:
        """``<run_dir>/warmstart.json``: where the run's initial weights came from and how the
        cloning went (a run's record of its warm start; the cache entry may be deleted later)."""
        path = Path(run_dir) / SUMMARY_FILE
        path.write_text(json.dumps({"path": str(self.path), "cached": self.cached, "metrics": self.metrics}, indent=2, default=str) + "\n")
        return path


def cache_root() -> Path:
    """``$EMBODIED_CACHE/warmstart`` (default ``~/.cache/embodied/warmstart``)."""
    return profile_cache_dir().parent / "warmstart"


def expert_identity(spec: str) -> dict[str, Any]:
    """What identifies the expert: its name, or a run's latest checkpoint (path, size, mtime)."""
    path = Path(spec).expanduser()
    if not path.exists():
        return {"expert": spec}
    from embodied.checkpoint import MODEL_FILE, find_checkpoint

    model = find_checkpoint(path) / MODEL_FILE
    stat = model.stat()
    return {"expert": str(model.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_key(cfg: EmbodiedConfig) -> str:
    """Hash of everything that decides the warm start's weights."""
    versions = {"torch": torch.__version__, "cache": CACHE_VERSION}
    try:
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:
        pass
    env = {k: v for k, v in to_dict(cfg.env).items() if k not in _SPEED_ONLY}
    identity = {
        "env": env, "policy": {k: v for k, v in to_dict(cfg.policy).items() if k != "init"},
        "warmstart": to_dict(cfg.warmstart), "seed": cfg.seed, "expert": expert_identity(str(cfg.warmstart.expert)),
        "versions": versions,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def apply_warm_start(cfg: EmbodiedConfig, log: Callable[[str], None] = LOG.info) -> tuple[EmbodiedConfig, WarmStartResult | None]:
    """``cfg`` with ``policy.init`` set to the (cached) warm start, or unchanged without
    ``warmstart.expert``."""
    if cfg.warmstart.expert is None:
        return cfg, None
    result = run_warm_start(cfg, log=log)
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, init=str(result.path))), result


def run_warm_start(cfg: EmbodiedConfig, root: str | Path | None = None, log: Callable[[str], None] = LOG.info) -> WarmStartResult:
    """Clone ``warmstart.expert`` into ``cfg.policy`` (or load the cached result)."""
    ws = cfg.warmstart
    if ws.expert is None:
        raise ValueError("run_warm_start needs warmstart.expert")
    root = Path(root) if root is not None else cache_root()
    final = root / f"bc-{cache_key(cfg)}"
    if (final / SUMMARY_FILE).is_file():
        log(f"[warmstart] behaviour cloning from cache ({final})")
        return WarmStartResult(final / POLICY_FILE, json.loads((final / SUMMARY_FILE).read_text())["metrics"], cached=True)
    work = root / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        device = resolve_device(cfg.workers.trainer_device)
        env_cfg = dataclasses.replace(cfg.env, num_envs=ws.num_envs)
        log(f"[warmstart] recording {ws.episodes} episodes of {ws.expert} on {cfg.env.id} ...")
        t0 = time.perf_counter()
        env = make_vec_env(env_cfg, seed=cfg.seed + DEMO_SEED)
        try:
            expert = load_expert(ws.expert, env.observation_space, env.action_space, cfg.env.id)
            demos = collect_demonstrations(env, expert, ws.episodes, cfg.policy.action_chunk, seed=cfg.seed + DEMO_SEED,
                                           noise=ws.expert_noise, successful_only=ws.successful_only)
            policy_cfg = dataclasses.replace(cfg.policy, init=None)
            torch.manual_seed(cfg.seed)
            policy = build_policy(policy_cfg, env.observation_space, env.action_space).to(device)
        finally:
            env.close()
        collect_s = time.perf_counter() - t0
        log(f"[warmstart] {len(demos)} frames of {demos.episodes} episodes in {collect_s:.0f} s "
            f"(expert success {demos.succeeded}/{demos.attempted}); cloning ...")

        def success_rate() -> float | None:
            stats = evaluate_policy(policy, env_cfg, ws.eval_episodes, seed=cfg.seed + EVAL_SEED,
                                    num_envs=min(ws.eval_episodes, ws.num_envs), deterministic=ws.eval_deterministic, device=device)
            return stats["eval/success_rate"]

        metrics = behaviour_clone(policy, demos, ws, success_rate if ws.stop_at_success else None, seed=cfg.seed, log=log)
        metrics.update({"bc/collect_s": round(collect_s, 2), "bc/frames": len(demos), "bc/episodes": demos.episodes,
                        "bc/expert_attempts": demos.attempted, "bc/expert_successes": demos.succeeded})
        tensors = trained_tensors(policy, metrics.pop("bc/trained"))
        metrics["bc/trained_tensors"] = len(tensors)
        save_file(tensors, str(work / POLICY_FILE))
        summary = {"config": to_dict(cfg.warmstart), "env": to_dict(cfg.env), "policy": to_dict(policy_cfg), "metrics": metrics}
        (work / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        if not final.exists():
            work.rename(final)  # atomic: a cache entry is complete or absent
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"[warmstart] validation NLL {metrics['bc/val_nll_first']:.3f} -> {metrics['bc/val_nll_last']:.3f} "
        f"after {metrics['bc/epochs']} epochs ({metrics['bc/stop_reason']}); weights in {final}")
    return WarmStartResult(final / POLICY_FILE, metrics, cached=False)


def trained_tensors(policy: Policy, names: list[str]) -> dict[str, torch.Tensor]:
    """The parameters behaviour cloning changed (``names``: those that received gradients), for
    ``policy.safetensors``. A critic it never trained is left out, so the file also initialises a
    policy of the same model without one (GRPO) and a PPO run keeps its critic's own
    initialisation."""
    params = dict(policy.named_parameters())
    return {name: params[name].detach().cpu().contiguous() for name in names}


def split_episodes(demos: Demonstrations, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows): whole episodes held out, at least one when there are two."""
    episodes = np.unique(demos.episode)
    held = int(round(val_fraction * len(episodes)))
    if val_fraction > 0 and len(episodes) >= 2:
        held = min(max(held, 1), len(episodes) - 1)
    else:
        held = 0
    chosen = np.random.default_rng(seed).permutation(episodes)[:held]
    val = np.isin(demos.episode, chosen)
    return np.flatnonzero(~val), np.flatnonzero(val)


def nll(policy: Policy, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of ``actions`` (stored form) per scored entry: per action
    token for token-level policies ((B, K) logprobs), per action otherwise ((B,))."""
    return -policy.evaluate(obs, actions).logprobs.float().mean()


#: A cloning loss: (policy, a batch of observations, their actions in the loss's form) -> a scalar.
CloneLoss = Callable[[Policy, dict[str, Any], torch.Tensor], torch.Tensor]


@torch.no_grad()
def mean_nll(policy: Policy, demos: Demonstrations, actions: torch.Tensor, rows: np.ndarray, batch_size: int,
             loss: CloneLoss = nll) -> float:
    """``loss`` (default :func:`nll`) over ``rows``, in batches, weighted by batch size."""
    device = _device(policy)
    total, count = 0.0, 0
    for begin in range(0, len(rows), batch_size):
        idx = rows[begin: begin + batch_size]
        total += float(loss(policy, to_torch(demos.select(idx), device), actions[idx].to(device))) * len(idx)
        count += len(idx)
    return total / max(count, 1)


def clone_epoch(policy: Policy, demos: Demonstrations, actions: torch.Tensor, rows: np.ndarray, batch_size: int,
                optimizer: torch.optim.Optimizer, named: list[tuple[str, torch.nn.Parameter]], max_grad_norm: float,
                rng: np.random.Generator, trained: set[str], loss_fn: CloneLoss = nll) -> list[float]:
    """One epoch of behaviour cloning: ``loss_fn`` (default :func:`nll`) of ``rows`` of ``demos``
    (their ``actions`` in the form the loss takes: the policy's stored form for the NLL) in
    shuffled batches, one clipped optimizer step each; adds the names of the parameters that
    received gradients to ``trained``. Returns each batch's loss."""
    device = _device(policy)
    params = [p for _, p in named]
    losses = []
    policy.train()
    order = rng.permutation(rows)
    for begin in range(0, len(order), batch_size):
        idx = order[begin: begin + batch_size]
        loss = loss_fn(policy, to_torch(demos.select(idx), device), actions[idx].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        trained.update(n for n, p in named if p.grad is not None)
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses


def behaviour_clone(
    policy: Policy, demos: Demonstrations, cfg: WarmStartConfig, success_rate: Callable[[], float | None] | None = None,
    seed: int = 0, log: Callable[[str], None] = LOG.info,
) -> dict[str, Any]:
    """Minimize :func:`nll` of ``demos`` with Adam for up to ``cfg.epochs`` epochs of shuffled
    batches; stop early once ``success_rate()`` (checked every ``cfg.eval_every`` epochs) reaches
    ``cfg.stop_at_success``, or at ``cfg.time_budget_s``. Returns the metrics (``bc/*``), with
    ``bc/trained`` the names of the parameters that received gradients."""
    actions = torch.as_tensor(policy.encode_actions(torch.as_tensor(demos.actions))).cpu()  # stored form
    train_rows, val_rows = split_episodes(demos, cfg.val_fraction, seed)
    score_rows = val_rows if len(val_rows) else train_rows
    named = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    trained: set[str] = set()
    optimizer = torch.optim.Adam([p for _, p in named], lr=cfg.lr)
    generator = np.random.default_rng(seed)
    policy.eval()
    first = mean_nll(policy, demos, actions, score_rows, cfg.batch_size)
    metrics: dict[str, Any] = {"bc/val_nll_first": first}
    stop_reason, success, steps, train_s, epoch = "epochs", None, 0, 0.0, 0
    losses: list[float] = []
    for epoch in range(1, cfg.epochs + 1):
        tick = time.perf_counter()
        epoch_losses = clone_epoch(policy, demos, actions, train_rows, cfg.batch_size, optimizer, named,
                                   cfg.max_grad_norm, generator, trained)
        losses.extend(epoch_losses)
        steps += len(epoch_losses)
        train_s += time.perf_counter() - tick
        if success_rate is not None and epoch % cfg.eval_every == 0:
            policy.eval()
            success = success_rate()
            log(f"[warmstart] epoch {epoch}: train NLL {np.mean(losses[-10:]):.3f}, success {success}")
            if success is not None and success >= cfg.stop_at_success:
                stop_reason = "success"
                break
        if cfg.time_budget_s and train_s > cfg.time_budget_s:
            stop_reason = "time"
            break
    policy.eval()
    metrics.update({
        "bc/val_nll_last": mean_nll(policy, demos, actions, score_rows, cfg.batch_size),
        "bc/train_nll_last": float(np.mean(losses[-10:])) if losses else None,
        "bc/epochs": epoch, "bc/steps": steps, "bc/train_s": round(train_s, 2), "bc/stop_reason": stop_reason,
        "bc/success": success, "bc/validation_frames": int(len(val_rows)),
        "bc/trained": [n for n, _ in named if n in trained],
    })
    return metrics


def _device(policy: Policy) -> torch.device:
    return next(policy.parameters()).device


def main(argv: list[str] | None = None) -> None:
    from pipelines.cli import build_train_config

    parser = argparse.ArgumentParser(description="Behaviour-clone a recipe's warmstart.expert into its policy (cached).")
    parser.add_argument("args", nargs="*", help="RECIPE [key=value ...], as for `embodied train`")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = build_train_config(ns.args)
    result = run_warm_start(cfg, log=print)
    print(json.dumps({"path": str(result.path), "cached": result.cached, **result.metrics}, indent=2, default=str))


if __name__ == "__main__":
    main()
