"""What ``embodied eval`` evaluates: a run's (or checkpoint's) weights, or a recipe's initial policy.

    evaluation = Evaluation.of("runs/my-run", ["eval.episodes=100"], build_train_config)
    evaluation.evaluate()                                   # eval/* metrics of cfg.eval episodes
    result, out = evaluation.evaluate_suite("libero_spatial", episodes_per_task=50)

A run dir or checkpoint brings its ``config.yaml`` (with the overrides applied) and its weights; a
recipe (name or YAML path) brings the policy it would start training from: a pretrained
``policy.path``, its behaviour-cloning warm start (``warmstart.*``, from the cache) or
``policy.init``. Papers report an SFT checkpoint's LIBERO table this way, before any RL:
``embodied eval libero_openvlaoft_grpo policy.path=DIR suite=libero_spatial``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.config import apply_overrides, load_yaml
from embodied.errors import UserError
from pipelines.config import EmbodiedConfig
from pipelines.collect import resolve_device
from pipelines.onpolicy.workflow import evaluate_weights, policy_with_weights
from pipelines.preflight import preflight
from pipelines.suite_eval import SuiteResult, evaluate_suite


@dataclass
class Evaluation:
    """A config, its env's spaces and the weights to evaluate (None: the config's own)."""

    cfg: EmbodiedConfig
    obs_space: Any
    action_space: Any
    state: dict[str, Any] | None
    label: str
    """What is evaluated, for output names: the checkpoint's dir name or the recipe's name."""
    run_dir: Path | None
    """The run whose checkpoint is evaluated (None for a recipe)."""
    info: dict[str, Any]
    """What the JSON result names besides the metrics (``checkpoint``, ``env_steps`` or ``recipe``)."""

    @classmethod
    def of(cls, target: str, overrides: list[str], build_config: Callable[[list[str]], Any]) -> Evaluation:
        """``target``: a run dir or checkpoint dir (an existing path), else a recipe for
        ``build_config`` (``embodied train``'s config builder)."""
        looks_like_a_path = "/" in target and not target.endswith((".yaml", ".yml"))
        if Path(target).is_dir() or looks_like_a_path:  # a missing run dir: "No run or checkpoint at ..."
            return cls._of_checkpoint(target, overrides)
        cfg = build_config([target, *overrides])
        _check_embodied(cfg, target)
        obs_space, action_space = preflight(cfg)
        if getattr(cfg.warmstart, "expert", None) is not None:
            from pipelines.warmstart import apply_warm_start

            cfg, _ = apply_warm_start(cfg)
        return cls(cfg, obs_space, action_space, None, cfg.recipe, None, {"recipe": cfg.recipe, "policy_init": cfg.policy.init})

    @classmethod
    def _of_checkpoint(cls, target: str, overrides: list[str]) -> Evaluation:
        from embodied.checkpoint import find_checkpoint, load_checkpoint
        from pipelines.workflow import schema_of

        ckpt = find_checkpoint(target)
        run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else Path(target)
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"No config.yaml next to checkpoint {ckpt}: expected {run_dir / 'config.yaml'}.")
        data = load_yaml(run_dir / "config.yaml")
        cfg = apply_overrides(schema_of(data), {**data, "resume": None}, overrides)
        _check_embodied(cfg, target)
        # the checkpoint holds every tensor that trains, so whatever policy.init set is overwritten
        # (and a warm start's cache entry may be gone by now)
        cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, init=None))
        obs_space, action_space = preflight(cfg)
        model, _, state = load_checkpoint(ckpt)
        return cls(cfg, obs_space, action_space, model, ckpt.name, run_dir,
                   {"checkpoint": str(ckpt), "env_steps": state.get("env_steps")})

    def evaluate(self) -> dict[str, Any]:
        """``cfg.eval.episodes`` episodes of ``cfg.env``: ``eval/*`` metrics and :attr:`info`."""
        video_dir = None
        if self.cfg.eval.video:
            base = self.run_dir if self.run_dir is not None else Path("runs") / f"eval-{self.label}"
            video_dir = base / "videos" / f"eval-{self.label}"
        return {**evaluate_weights(self.cfg, self.obs_space, self.action_space, self.state, video_dir), **self.info}

    def evaluate_suite(self, suite: str, episodes_per_task: int = 50, out: str | Path | None = None,
                       video: bool = True) -> tuple[SuiteResult, Path]:
        """Every task of ``suite`` (see :mod:`pipelines.suite_eval`), ``episodes_per_task``
        episodes each from seed 0 (LIBERO: the official initial states 0..N-1), greedy or not as
        ``eval.deterministic`` says; the table goes to ``out`` (see :func:`default_out`)."""
        if isinstance(episodes_per_task, bool) or not isinstance(episodes_per_task, int):
            raise UserError(f"episodes_per_task={episodes_per_task!r} must be a positive integer.")
        out_dir = Path(out) if out is not None else self.default_out(suite)
        policy = policy_with_weights(self.cfg, self.obs_space, self.action_space, self.state)
        env_cfg = dataclasses.replace(self.cfg.env, id=suite)
        result = evaluate_suite(
            policy, env_cfg, out_dir, episodes_per_task=episodes_per_task, seed=0,
            num_envs=self.cfg.eval.num_envs or min(episodes_per_task, self.cfg.env.num_envs),
            deterministic=self.cfg.eval.deterministic, device=resolve_device(self.cfg.workers.rollout_device), video=video,
        )
        return result, out_dir

    def default_out(self, suite: str) -> Path:
        """``<run dir>/suite-<suite>-<checkpoint>``, or ``runs/<recipe>-suite-<suite>``."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", suite).strip("_") or "suite"
        if self.run_dir is not None:
            return self.run_dir / f"suite-{name}-{self.label}"
        return Path("runs") / f"{self.label}-suite-{name}"


def _check_embodied(cfg: Any, target: str) -> None:
    if not isinstance(cfg, EmbodiedConfig):
        raise UserError(f"embodied eval evaluates embodied policies; {target!r} is a {type(cfg).__name__} run "
                        "(the reasoning workflow reports its accuracy in its own metrics).")
