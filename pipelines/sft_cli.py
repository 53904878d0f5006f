"""``embodied sft RECIPE|POLICY demos=PATH[,PATH] [out=DIR] [epochs=N lr=X batch_size=N val_fraction=F] [key=value ...]``:
behaviour-clone a policy on demonstration files (:mod:`pipelines.sft`).

RECIPE is any ``embodied train`` recipe (its ``policy.*`` is fine-tuned, its ``env.*`` must be the
demonstrations' task, controller, observation mode and image size); POLICY (``openvla``,
``openvla_oft``, ``pi0``) takes the bundled tiny SFT recipe of that policy with ``env.*`` read from the
demo file. Other ``key=value`` pairs are config overrides (``policy.path=DIR`` for a real
checkpoint, ``policy.kwargs.lora_rank=32``, ``workers.trainer_device=cuda``). The held-out loss (the
NLL; the flow-matching MSE for ``pi0`` / ``pi05``) is printed before training and after every
epoch; the last line is a JSON summary.

    embodied demos PickCube-v1 episodes=100 image_size=32
    embodied sft maniskill_pickcube_openvlaoft_ppo_tiny demos=demos/PickCube-v1/scripted/trajectory.rgb.pd_ee_delta_pos.physx_cpu.h5 out=runs/sft-pick
    embodied train maniskill_pickcube_openvlaoft_ppo_tiny policy.init=runs/sft-pick

Keys of its own: demos, out (runs/sft-<recipe>-<time>), epochs (10), lr (1e-4), batch_size (32),
val_fraction (0.1), max_grad_norm (1.0), episodes (per file, per task of a suite's; all), time_budget_s (0: none), overwrite (false).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from embodied.config import parse_override
from embodied.errors import UserError, did_you_mean
from pipelines.cli import register_command

#: The recipe `embodied sft POLICY` fine-tunes, per policy (tiny models; `policy.path=DIR` for a real one).
POLICY_RECIPES = {"openvla": "maniskill_pickcube_openvla_ppo_tiny", "openvla_oft": "maniskill_pickcube_openvlaoft_ppo_tiny",
                  "pi0": "maniskill_pickcube_pi0_ppo_tiny"}


def parse_sft_args(args: list[str]) -> tuple[str, Any, list[str]]:
    """(recipe or policy, :class:`pipelines.sft.SFTConfig`, the config overrides)."""
    from pipelines.sft import SFTConfig

    if not args or "=" in args[0]:
        raise UserError("embodied sft needs a recipe or a policy: embodied sft RECIPE|openvla|openvla_oft|pi0 demos=PATH [out=DIR] "
                        "[epochs=N] [key=value ...]")
    fields = {f.name: f for f in dataclasses.fields(SFTConfig)}
    own: dict[str, Any] = {}
    overrides = []
    for text in args[1:]:
        key, value = parse_override(text)
        if key not in fields:
            if "." not in key:
                raise UserError(f"embodied sft does not know {key!r}.{did_you_mean(key, fields)} Its keys: {', '.join(fields)}; "
                                "config keys are dotted (policy.path=DIR).")
            overrides.append(text)
            continue
        own[key] = _coerce(key, value)
    return args[0], SFTConfig(**own), overrides


def _coerce(key: str, value: Any) -> Any:
    if key == "demos":
        items = value if isinstance(value, list) else str(value).split(",")
        return [str(v).strip() for v in items if str(v).strip()]
    if key == "out":
        return None if value is None else str(value)
    if key == "overwrite":
        if not isinstance(value, bool):
            raise UserError(f"embodied sft: overwrite={value!r} must be true or false.")
        return value
    if key in ("epochs", "batch_size", "episodes"):
        if value is None and key == "episodes":
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"embodied sft: {key}={value!r} must be a positive integer.")
        return value
    if isinstance(value, str):  # YAML reads 3e-4 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UserError(f"embodied sft: {key}={value!r} must be a non-negative number.")
    if key == "val_fraction" and not value < 1:
        raise UserError(f"embodied sft: val_fraction={value!r} must be below 1.")
    return float(value)


def build_sft_config(target: str, sft: Any, overrides: list[str]) -> Any:
    """The train config SFT fine-tunes: the recipe with ``overrides``, or, for a policy name, its
    tiny SFT recipe with ``env.*`` taken from the first demo file (and ``policy.kwargs.tiny``
    dropped when ``policy.path`` names a checkpoint)."""
    from pipelines.cli import build_train_config

    if target not in POLICY_RECIPES:
        return build_train_config([target, *overrides])
    from pipelines.demos import read_meta

    if not sft.demos:
        raise UserError("embodied sft needs demos=PATH (an .h5 file `embodied demos ENV_ID` wrote).")
    meta = read_meta(sft.demos[0])
    env = [f"env.id={meta.env_id}", f"env.obs_mode={meta.obs_mode}"]
    if meta.control_mode is not None:
        env.append(f"env.kwargs.control_mode={meta.control_mode}")
    if meta.image_size is not None:
        env.append(f"env.image_size={meta.image_size}")
    if any(o.split("=", 1)[0] in ("policy.path", "policy.kwargs.path") for o in overrides):
        env.append("policy.kwargs.tiny=null")
    cfg = build_train_config([POLICY_RECIPES[target], *env, *overrides])
    if meta.control_mode is None:  # demos of an env with one controller (Meta-World): the tiny recipes' ManiSkill one goes
        kwargs = {k: v for k, v in cfg.env.kwargs.items() if k != "control_mode"}
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, kwargs=kwargs))
    return cfg


def cmd_sft(args: list[str]) -> int:
    from pipelines.sft import run_sft

    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    target, sft, overrides = parse_sft_args(args)
    cfg = build_sft_config(target, sft, overrides)
    result = run_sft(cfg, sft, log=print)
    m, name = result.metrics, result.metrics["sft/objective"]
    print(json.dumps({"path": str(result.path), f"val_{name}_first": round(m[f"sft/val_{name}_first"], 4),
                      f"val_{name}_best": round(m[f"sft/val_{name}_best"], 4), "best_epoch": m["sft/best_epoch"],
                      "frames": m["sft/frames"], "episodes": m["sft/episodes"]}))
    return 0


register_command("sft", cmd_sft, "behaviour-clone a policy on demos: embodied sft RECIPE|POLICY demos=PATH [out=DIR] [epochs=N]")
