"""What ``embodied eval`` evaluates: a run's (or checkpoint's) weights, or a recipe's initial policy.

    evaluation = Evaluation.of("runs/my-run", ["eval.episodes=100"], build_train_config)
    evaluation.evaluate()                                   # eval/* metrics of cfg.eval episodes
    result, out = evaluation.evaluate_suite("libero_spatial", episodes_per_task=50)

A run dir or checkpoint brings its ``config.yaml`` (with the overrides applied) and its weights; a
recipe (name or YAML path) brings the policy it would start training from: a pretrained
``policy.path``, its behaviour-cloning warm start (``warmstart.*``, from the cache) or
``policy.init``. Papers report an SFT checkpoint's LIBERO table this way, before any RL:
``embodied eval libero_openvlaoft_grpo policy.path=DIR suite=libero_spatial``.

Every evaluation shows its episodes as they finish (:class:`pipelines.evaluate.EpisodeProgress`)
and writes its result to ``<run dir>/eval/<checkpoint>[-suite-<suite>]-<time>.json`` (a recipe:
``runs/eval-<recipe>/eval/``): the metrics, every episode (or the suite's per-task table), what
was evaluated (checkpoint, env steps or recipe), the seed and the env. A checkpoint that does not
fit the config's model is a :class:`~embodied.checkpoint.CheckpointMismatch` (exit 2) before any
episode runs; a corrupt latest checkpoint is refused (exit 4) naming the newest intact one, which
``resume_fallback=true`` evaluates instead.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.config import apply_overrides, load_yaml
from embodied.errors import UserError
from pipelines.config import EmbodiedConfig
from pipelines.collect import resolve_device
from pipelines.evaluate import EpisodeProgress, record_video, run_episodes, summarize
from pipelines.onpolicy.workflow import EVAL_SEED_OFFSET, policy_with_weights
from pipelines.preflight import preflight
from pipelines.suite_eval import SuiteResult, evaluate_suite

LOG = logging.getLogger("embodied.eval")


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
        from embodied.checkpoint import CorruptCheckpointError, find_checkpoint, load_checkpoint
        from pipelines.workflow import WORKFLOWS, schema_of

        corrupt: CorruptCheckpointError | None = None
        try:
            ckpt = find_checkpoint(target)
        except CorruptCheckpointError as err:  # the config says whether to fall back (resume_fallback)
            if err.fallback is None:
                raise
            corrupt, ckpt = err, err.fallback
        run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else Path(target)
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"No config.yaml next to checkpoint {ckpt}: expected {run_dir / 'config.yaml'}.")
        data = load_yaml(run_dir / "config.yaml")
        cfg = apply_overrides(schema_of(data), {**data, "resume": None}, overrides)
        _check_embodied(cfg, target)
        if corrupt is not None:
            _fall_back(corrupt, cfg.resume_fallback, target)
        # the checkpoint holds every tensor that trains, so whatever policy.init set is overwritten
        # (and a warm start's cache entry may be gone by now)
        cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, init=None))
        obs_space, action_space = preflight(cfg)
        _check_fits(WORKFLOWS.get(cfg.workflow).build(cfg), ckpt, obs_space, action_space)
        model, _, state = load_checkpoint(ckpt)
        return cls(cfg, obs_space, action_space, model, ckpt.name, run_dir,
                   {"checkpoint": str(ckpt), "env_steps": state.get("env_steps")})

    @property
    def base_dir(self) -> Path:
        """Where this evaluation's files go: the run dir, or ``runs/eval-<recipe>``."""
        return self.run_dir if self.run_dir is not None else Path("runs") / f"eval-{self.label}"

    def evaluate(self) -> dict[str, Any]:
        """``cfg.eval.episodes`` episodes of ``cfg.env`` (the training's evaluation seeds): ``eval/*``
        metrics, :attr:`info` and ``results`` (the JSON file written, see :meth:`write_results`)."""
        cfg = self.cfg
        seed = cfg.seed + EVAL_SEED_OFFSET
        device = resolve_device(cfg.workers.rollout_device)
        policy = policy_with_weights(cfg, self.obs_space, self.action_space, self.state)
        rows = run_episodes(policy, cfg.env, cfg.eval.episodes, seed, cfg.eval.num_envs or min(cfg.eval.episodes, cfg.env.num_envs),
                            cfg.eval.deterministic, device, EpisodeProgress(cfg.eval.episodes, cfg.env.id))
        metrics = summarize(rows)
        video = None
        if cfg.eval.video:
            LOG.info("[eval] filming one episode for the video")
            video = record_video(policy, cfg.env, self.base_dir / "videos" / f"eval-{self.label}", seed, cfg.eval.deterministic, device)
        path = self.write_results("", {"metrics": metrics, "episodes": rows, "seed": seed,
                                       "video": str(video) if video is not None and video.is_file() else None})
        return {**metrics, **self.info, "results": str(path)}

    def write_results(self, kind: str, result: dict[str, Any]) -> Path:
        """``<base dir>/eval/<label><kind>-<time>.json``: ``result`` with what was evaluated (:attr:`info`),
        the env and the time; says its path on the terminal and returns it."""
        now = datetime.datetime.now()
        path = self.base_dir / "eval" / f"{self.label}{kind}-{now:%Y%m%d-%H%M%S}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {**self.info, "target": self.label, "env_id": self.cfg.env.id, "deterministic": self.cfg.eval.deterministic,
               "time": now.isoformat(timespec="seconds"), **result}
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
        LOG.info(f"[eval] results: {path}")
        return path

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
            progress=True,
        )
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", suite).strip("_") or "suite"
        self.write_results(f"-suite-{name}", {"metrics": {"eval/mean_success_rate": result.mean_success_rate},
                                              "seed": result.seed, "suite": result.to_dict(), "out": str(out_dir)})
        return result, out_dir

    def default_out(self, suite: str) -> Path:
        """``<run dir>/suite-<suite>-<checkpoint>``, or ``runs/<recipe>-suite-<suite>``."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", suite).strip("_") or "suite"
        if self.run_dir is not None:
            return self.run_dir / f"suite-{name}-{self.label}"
        return Path("runs") / f"{self.label}-suite-{name}"


def _fall_back(corrupt: Any, fallback: bool, target: str) -> None:
    """A corrupt latest checkpoint: evaluate the newest intact one (``resume_fallback=true``,
    saying which), else the error, saying what works for ``embodied eval``."""
    from embodied.checkpoint import FALLBACK_OPTION, CorruptCheckpointError, iteration_of

    intact = corrupt.fallback
    problem = str(corrupt).split(" The newest intact one is")[0]
    if fallback:
        LOG.warning(f"[eval] {problem} Evaluating the newest intact one instead: {intact} (iteration {iteration_of(intact)}).")
        return
    raise CorruptCheckpointError(
        f"{problem} The newest intact one is {intact} (iteration {iteration_of(intact)}); to evaluate it, add "
        f"{FALLBACK_OPTION} to the command (`embodied eval {target} {FALLBACK_OPTION}`) or name it: `embodied eval {intact}`.",
        corrupt.path, intact) from None


def _check_fits(workflow: Any, ckpt: Path, obs_space: Any, action_space: Any) -> None:
    """A :class:`~embodied.checkpoint.CheckpointMismatch` (exit 2) when the checkpoint's tensors do
    not fit the model this config builds, worded for evaluation."""
    from embodied.checkpoint import CheckpointMismatch

    try:
        workflow.check_checkpoint(ckpt, obs_space, action_space)
    except CheckpointMismatch as err:
        message = str(err).split(" Resume with the config")[0].rstrip(".")
        raise CheckpointMismatch(
            f"{message}. Evaluate it with the config its run was trained with (its config.yaml, without overrides "
            "of the model's keys such as policy.*), or evaluate a checkpoint of a run with this config.",
            err.differences) from None


def _check_embodied(cfg: Any, target: str) -> None:
    if not isinstance(cfg, EmbodiedConfig):
        raise UserError(f"embodied eval evaluates embodied policies; {target!r} is a {type(cfg).__name__} run "
                        "(the reasoning workflow reports its accuracy in its own metrics).")
