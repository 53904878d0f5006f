"""Supervised fine-tuning (behaviour cloning) of a policy on demonstration files -> a ``policy.init`` dir.

    result = run_sft(cfg, SFTConfig(demos=["demos/PickCube-v1/scripted/trajectory.rgb.pd_ee_delta_pos.physx_cpu.h5"]))
    result.path              # a checkpoint dir: `embodied train RECIPE policy.init=<path>` starts from it
    result.metrics           # sft/val_nll (sft/val_flow_mse for a flow policy) per epoch, ...

The loss (:func:`objective_of`) is the policy's own. A policy with ``sft_loss(obs, actions)`` (π0,
π0.5: flow matching, the MSE of the predicted velocity, metrics ``sft/*_flow_mse*``) trains by it,
and its held-out loss draws the flow times and noise from a generator seeded the same way at every
scoring, so the epochs' values compare. Any other policy trains by the warm start's loss
(:mod:`pipelines.warmstart`): the negative log-likelihood of the demonstrated actions through its
``evaluate(obs, encode_actions(actions))`` (metrics ``sft/*_nll*``), per action token for a VLA
(OpenVLA's 256 bins of the BOUNDS_Q99-normalized actions; OFT's parallel discrete head:
:func:`per_token`), so the RL that follows scores the same distribution. Whole episodes are held out
for validation (``val_fraction``); their loss is reported before training and after every epoch,
and the weights of the epoch with the lowest one are kept. What is written is what the cloning
trained (:func:`pipelines.warmstart.trained_tensors`: LoRA adapters under ``lora_rank > 0``, every
weight of a full fine-tune, never an untrained value head), so the same dir initialises the PPO
(critic) and the GRPO (no critic) policy of the same model.

The policy is built for the spaces the demonstrations have (``rgb`` frames, ``state``, the action
bounds), which are the spaces of the recipe's env when it names the same task, observation mode,
image size and controller; a mismatch is a UserError naming the key to set.

Output dir: ``model.safetensors`` + ``state.json`` (a checkpoint dir, as ``policy.init`` takes
one), ``sft.json`` (config, demo files, per-epoch metrics) and ``recipe.yaml`` (the recipe's
resolved config with ``policy.init`` pointing here: ``embodied train DIR/recipe.yaml`` runs it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from safetensors.torch import save_file

from embodied.config import to_dict
from embodied.errors import UserError
from pipelines.collect import resolve_device
from pipelines.demonstrations import Demonstrations
from pipelines.warmstart import CloneLoss, clone_epoch, mean_nll, nll, split_episodes, trained_tensors
from policies.base import INSTRUCTION_KEY, Policy
from policies.registry import build_policy

LOG = logging.getLogger("embodied")
SUMMARY_FILE = "sft.json"
#: The recipe's resolved config with ``policy.init`` set to the output dir: ``embodied train DIR/recipe.yaml``.
RECIPE_FILE = "recipe.yaml"


@dataclass
class SFTConfig:
    """``embodied sft`` keys (the others are the recipe's config keys)."""

    demos: list[str] = field(default_factory=list)
    """Demonstration files (``.h5`` with ``.json`` beside, ``embodied demos`` writes them); several: comma-separated."""
    out: str | None = None
    """Output dir (default ``runs/sft-<recipe>-<YYYYmmdd-HHMMSS>``); an existing one is an error unless ``overwrite``."""
    epochs: int = 10
    """Passes over the training episodes."""
    lr: float = 1.0e-4
    """Adam learning rate."""
    batch_size: int = 32
    """Frames per gradient step."""
    val_fraction: float = 0.1
    """Share of whole episodes held out for the validation NLL (at least one when there are two)."""
    max_grad_norm: float = 1.0
    """Gradient clipping (global norm)."""
    episodes: int | None = None
    """At most this many episodes of each file, of each task of a suite's file (None: all)."""
    time_budget_s: float = 0.0
    """Stop after the epoch that passes this much training time (0: no limit)."""
    overwrite: bool = False
    """Replace an existing ``out`` dir."""


@dataclass
class SFTResult:
    path: Path
    metrics: dict[str, Any]


def demo_spaces(demos: Demonstrations, action_low: np.ndarray, action_high: np.ndarray) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    """The env contract's spaces of the demonstrations: uint8 frames (H, W, 3), ``state`` (D,)
    float32 unbounded (as the ManiSkill adapter declares them), actions within the recorded bounds."""
    spaces: dict[str, gym.Space] = {}
    for key, value in demos.obs.items():
        if key == INSTRUCTION_KEY:
            continue
        if value.dtype == np.uint8:
            spaces[key] = gym.spaces.Box(0, 255, value.shape[1:], np.uint8)
        else:
            spaces[key] = gym.spaces.Box(-np.inf, np.inf, value.shape[1:], np.float32)
    return gym.spaces.Dict(spaces), gym.spaces.Box(action_low, action_high, dtype=np.float32)


def maniskill_task_list(env_id: str) -> list[str]:
    """The tasks of ``env_id`` when it is a list of several ManiSkill tasks, else []."""
    if "," not in env_id:
        return []
    from envs.config import EnvConfig
    from envs.registry import resolve_adapter

    if resolve_adapter(EnvConfig(id=env_id)) != "maniskill":
        return []
    from envs.adapters.maniskill_adapter import parse_tasks

    return parse_tasks(env_id)


def check_recipe_fits(cfg: Any, metas: list[Any]) -> None:
    """The recipe's env must be the demonstrations' (task, controller, observations, image size)."""
    ids = sorted({m.env_id for m in metas})
    listed = maniskill_task_list(cfg.env.id)
    if listed and set(ids) <= set(listed):
        pass  # a ManiSkill task list: one file per task (task_list_layout names a missing one)
    elif cfg.env.id not in ids or len(ids) > 1:
        raise UserError(f"the demonstrations are of {', '.join(ids)}, the recipe's env.id is {cfg.env.id!r}; give env.id={ids[0]} "
                        f"(one env per run) or demos of that env (a suite's tasks in one file: `embodied demos {cfg.env.id}`).")
    for meta in metas:
        mode = cfg.env.kwargs.get("control_mode")
        if meta.control_mode is not None and mode != meta.control_mode:
            raise UserError(f"{meta.path} was recorded with control_mode {meta.control_mode!r}, the recipe's env.kwargs.control_mode is "
                            f"{mode!r}: the policy's actions would mean something else; set env.kwargs.control_mode={meta.control_mode}.")
        if meta.obs_mode != cfg.env.obs_mode:
            raise UserError(f"{meta.path} holds obs_mode {meta.obs_mode!r} observations, the recipe's env.obs_mode is "
                            f"{cfg.env.obs_mode!r}; record the demos with obs_mode={cfg.env.obs_mode} or set env.obs_mode={meta.obs_mode}.")
        if meta.image_size is not None and meta.image_size != cfg.env.image_size:
            raise UserError(f"{meta.path} holds {meta.image_size} px frames, the recipe's env.image_size is {cfg.env.image_size}; "
                            f"record the demos with image_size={cfg.env.image_size} or set env.image_size={meta.image_size}.")


def run_sft(cfg: Any, sft: SFTConfig, log: Callable[[str], None] = LOG.info) -> SFTResult:
    """Behaviour-clone ``cfg.policy`` on ``sft.demos`` and write the output dir (module docstring)."""
    from pipelines.demos import load_demos, read_meta, task_list_layout

    if not sft.demos:
        raise UserError("embodied sft needs demos=PATH (an .h5 file `embodied demos ENV_ID` wrote; several: comma-separated).")
    metas = [read_meta(p) for p in sft.demos]
    check_recipe_fits(cfg, metas)
    out = Path(sft.out) if sft.out else Path("runs") / f"sft-{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and not sft.overwrite:
        raise UserError(f"{out} already exists; give another out=DIR or overwrite=true.")
    listed = maniskill_task_list(cfg.env.id)
    layout = task_list_layout(listed, [m.path for m in metas]) if listed else None
    demos = load_demos([m.path for m in metas], chunk=cfg.policy.action_chunk, limit=sft.episodes, layout=layout)
    obs_space, action_space = demo_spaces(demos, metas[0].action_low, metas[0].action_high)
    device = resolve_device(cfg.workers.trainer_device)
    torch.manual_seed(cfg.seed)
    policy = build_policy(per_token(cfg.policy), obs_space, action_space).to(device)
    log(f"[sft] {cfg.policy.name} on {len(demos)} frames of {demos.episodes} episodes ({', '.join(str(m.path) for m in metas)})")
    metrics, best = clone(policy, demos, sft, cfg.seed, log)
    work = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _write_checkpoint(work, best, metrics)
        init_cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, init=str(out.resolve())))
        summary = {"sft": dataclasses.asdict(sft), "demos": [str(m.path) for m in metas], "recipe": cfg.recipe,
                   "policy": to_dict(cfg.policy), "env": to_dict(cfg.env), "metrics": metrics}
        (work / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        from embodied.config import save_yaml

        save_yaml(to_dict(init_cfg), work / RECIPE_FILE)
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    name, label = metrics["sft/objective"], metrics["sft/objective_label"]
    log(f"[sft] held-out {label} {metrics[f'sft/val_{name}_first']:.3f} -> {metrics[f'sft/val_{name}_best']:.3f} "
        f"(epoch {metrics['sft/best_epoch']}); "
        f"`embodied train {cfg.recipe} policy.init={out}` starts from it")
    return SFTResult(out, metrics)


def per_token(policy_cfg: Any) -> Any:
    """``policy_cfg`` of a VLA with ``logprob_level: token``: the NLL is then per action token
    (ln 256 = 5.55 for a uniform head), whatever the RL recipe sums. The level only shapes the
    logprobs ``evaluate`` returns, so the trained tensors are the same ones."""
    if "logprob_level" not in policy_cfg.kwargs and policy_cfg.name not in ("openvla", "openvla_oft"):
        return policy_cfg
    return dataclasses.replace(policy_cfg, kwargs={**policy_cfg.kwargs, "logprob_level": "token"})


@dataclass
class Objective:
    """What SFT minimises for a policy (:func:`objective_of`)."""

    name: str
    """The metrics' name for it: ``sft/val_<name>_first``, ``..._best``, ``..._last``."""
    label: str
    """The log lines' name for it."""
    actions: torch.Tensor
    """The demonstrated actions (N, ...) in the form ``loss`` takes."""
    loss: CloneLoss
    """The training loss of a batch (fresh random draws where it has any)."""
    held_out: Callable[[], CloneLoss]
    """A loss for one held-out scoring pass: the same draws at every pass over the same rows."""


def objective_of(policy: Policy, demos: Demonstrations, seed: int) -> Objective:
    """Flow matching for a policy with ``sft_loss`` (the env actions (N, C, A) as they are; the
    held-out draws from a CPU generator seeded with ``seed`` at every pass), else the NLL of the
    actions in the policy's stored form (token ids for a VLA), which draws nothing."""
    if hasattr(policy, "sft_loss"):
        def flow_loss(model: Any, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
            return model.sft_loss(obs, actions)

        def held_out() -> CloneLoss:
            generator = torch.Generator().manual_seed(seed)
            return lambda model, obs, actions: model.sft_loss(obs, actions, generator=generator)

        return Objective("flow_mse", "flow-matching MSE", torch.as_tensor(demos.actions).float(), flow_loss, held_out)
    actions = torch.as_tensor(policy.encode_actions(torch.as_tensor(demos.actions))).cpu()  # token ids (N, C, A)
    return Objective("nll", "NLL", actions, nll, lambda: nll)


def clone(policy: Any, demos: Demonstrations, sft: SFTConfig, seed: int, log: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Adam on the policy's :func:`objective_of` over the training episodes; the held-out loss
    after every epoch. Returns the metrics (``sft/*``) and the trained tensors of the epoch with
    the lowest held-out loss."""
    objective = objective_of(policy, demos, seed)
    name, label, actions = objective.name, objective.label, objective.actions
    train_rows, val_rows = split_episodes(demos, sft.val_fraction, seed)
    score_rows = val_rows if len(val_rows) else train_rows
    named = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    optimizer = torch.optim.Adam([p for _, p in named], lr=sft.lr)
    rng = np.random.default_rng(seed)
    trained: set[str] = set()

    def held_out() -> float:
        policy.eval()
        return mean_nll(policy, demos, actions, score_rows, sft.batch_size, loss=objective.held_out())

    first = held_out()
    log(f"[sft] epoch 0: held-out {label} {first:.4f} ({len(score_rows)} frames of {len(np.unique(demos.episode[score_rows]))} episodes)")
    history: list[dict[str, float]] = []
    best_loss, best_epoch, best = float("inf"), 0, None
    train_s = 0.0
    for epoch in range(1, sft.epochs + 1):
        tick = time.perf_counter()
        losses = clone_epoch(policy, demos, actions, train_rows, sft.batch_size, optimizer, named, sft.max_grad_norm,
                             rng, trained, loss_fn=objective.loss)
        train_s += time.perf_counter() - tick
        val = held_out()
        history.append({"epoch": epoch, f"train_{name}": float(np.mean(losses)), f"val_{name}": val, "train_s": round(train_s, 2)})
        log(f"[sft] epoch {epoch}/{sft.epochs}: train {label} {np.mean(losses):.4f}, held-out {label} {val:.4f} ({train_s:.0f} s)")
        if val < best_loss:
            best_loss, best_epoch = val, epoch
            best = {k: v.clone() for k, v in trained_tensors(policy, [n for n, _ in named if n in trained]).items()}
        if sft.time_budget_s and train_s > sft.time_budget_s:
            break
    if best is None:  # no epoch ran
        best = trained_tensors(policy, [])
    metrics = {"sft/objective": name, "sft/objective_label": label,
               f"sft/val_{name}_first": first, f"sft/val_{name}_best": best_loss, "sft/best_epoch": best_epoch,
               f"sft/val_{name}_last": history[-1][f"val_{name}"] if history else first, "sft/epochs": history,
               "sft/frames": len(demos), "sft/episodes": demos.episodes, "sft/validation_frames": int(len(val_rows)),
               "sft/train_s": round(train_s, 2), "sft/trained_tensors": len(best)}
    return metrics, best


def _write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], metrics: dict[str, Any]) -> None:
    """``model.safetensors`` and a ``state.json`` that makes ``path`` a checkpoint dir (iteration 0)."""
    from embodied.checkpoint import MODEL_FILE, STATE_FILE

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path / MODEL_FILE))
    state = {"iteration": 0, "env_steps": 0, "source": "sft", "files": {MODEL_FILE: (path / MODEL_FILE).stat().st_size},
             "sft": {k: v for k, v in metrics.items() if k != "sft/epochs"}}
    (path / STATE_FILE).write_text(json.dumps(state, indent=2, default=str) + "\n")
