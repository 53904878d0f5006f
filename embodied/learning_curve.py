"""A run's learning curve: its metrics against wall time, read from the run dir, drawn as a PNG.

The run dir is what a run writes (:mod:`embodied.metrics`): ``metrics.jsonl`` (``train/*`` every
iteration, ``eval/*`` where the run evaluated), ``summary.json`` (the final evaluation) and
``config.yaml`` (the env, observations and algorithm the title names). A metric is a name whose
``train/<name>`` and ``eval/<name>`` the run logged (``success_rate``, ``episode_return``) or one
full key of ``metrics.jsonl`` (``losses/pg``); each gets a panel. Draws with matplotlib's Agg
canvas directly, so it never touches the global pyplot backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from embodied.errors import UserError, did_you_mean
from embodied.metrics import METRICS_FILE, SUMMARY_FILE, read_metrics

#: the metric drawn when none is asked for: the first of these the run logged
DEFAULT_METRICS = ("success_rate", "episode_return")
#: the success rate the default job's issue asks of a run (drawn as a dashed line)
SUCCESS_TARGET = 0.8
#: a point of a curve: (wall seconds, env steps, value)
Point = tuple[float, int, float]


def require_run_dir(run_dir: Path) -> None:
    """Raise a :class:`UserError` unless ``run_dir`` holds a run's ``metrics.jsonl``."""
    if not (run_dir / METRICS_FILE).is_file():
        what = "does not exist" if not run_dir.exists() else f"has no {METRICS_FILE}"
        raise UserError(f"{run_dir} is not a run dir: it {what}. A run dir is where `embodied train` writes a run's "
                        f"{METRICS_FILE}, {SUMMARY_FILE} and config.yaml (run.dir=PATH, runs/<recipe>-<time> by default).")


def logged_metrics(rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """The metrics a run can be plotted by: the names of its ``train/*`` and ``eval/*`` keys, then
    every numeric key of its rows (full keys), in the order first logged."""
    keys = dict.fromkeys(k for r in [*rows, summary] for k, v in r.items() if isinstance(v, (int, float)))
    names = dict.fromkeys(k.split("/", 1)[1] for k in keys if k.startswith(("train/", "eval/")))
    return [*names, *(k for k in keys if "/" in k)]


def default_metric(run_dir: Path) -> str:
    """The first of :data:`DEFAULT_METRICS` the run in ``run_dir`` logged (else the first)."""
    require_run_dir(run_dir)
    logged = set(logged_metrics(read_metrics(run_dir), _read_json(run_dir / SUMMARY_FILE)))
    return next((m for m in DEFAULT_METRICS if m in logged), DEFAULT_METRICS[0])


def curve(run_dir: Path, metric: str = "success_rate", target: float | None = SUCCESS_TARGET) -> dict[str, Any]:
    """The points ``(wall_s, env_steps, value)`` of ``metric`` in the run at ``run_dir``: for a
    name, ``train`` of ``train/<metric>`` and ``eval`` of ``eval/<metric>`` (the final evaluation of
    ``summary.json`` last); for a full key, its points under ``eval`` when it is an ``eval/`` key,
    else under ``train``. With them, when the evaluation first reached ``target`` (None: no
    target), and what the run trained (env, observations, algorithm). A :class:`UserError` when
    ``run_dir`` is no run dir or the run logged no such metric."""
    require_run_dir(run_dir)
    rows = read_metrics(run_dir)
    summary = _read_json(run_dir / SUMMARY_FILE)
    logged = logged_metrics(rows, summary)
    if metric not in logged:
        raise UserError(f"{run_dir} logged no metric {metric!r}.{did_you_mean(metric, logged)} It logged: "
                        f"{', '.join(logged[:40]) or 'none'}.")
    train_key, eval_key = (f"train/{metric}", f"eval/{metric}") if "/" not in metric else (
        (None, metric) if metric.startswith("eval/") else (metric, None))
    train = _points(rows, train_key)
    evals = _points(rows, eval_key)
    if eval_key is not None and summary.get(eval_key) is not None:
        evals.append((summary["wall_s"], summary["env_steps"], summary[eval_key]))
    first = next(((w, s) for w, s, v in evals if v >= target), None) if target is not None else None
    config = _read_yaml(run_dir / "config.yaml")
    env, algo, evaluation = config.get("env", {}), config.get("algo", {}), config.get("eval", {})
    return {"metric": metric, "target": target, "train": train, "eval": evals, "summary": summary,
            "eval_deterministic": evaluation.get("deterministic", True), "eval_episodes": evaluation.get("episodes"),
            "first_eval_at_target": {"wall_s": first[0], "env_steps": first[1]} if first else None,
            "run": {"env": env.get("id"), "obs_mode": env.get("obs_mode"), "algo": algo.get("name", "ppo")}}


def default_title(data: dict[str, Any], cores: int, metrics: Sequence[str] | None = None) -> str:
    """``<env> (<obs mode>), <ALGO>, <n> CPU cores: <metric> vs wall time`` from the run's config
    (``metrics``: the metrics of every panel, named in turn; by default the curve's own)."""
    run = data.get("run", {})
    what = f"{run.get('env') or 'env'} ({run.get('obs_mode') or 'state'}), {str(run.get('algo') or 'ppo').upper()}"
    names = " and ".join(m.replace("_", " ") for m in (metrics or [data["metric"]]))
    return f"{what}, {cores} CPU cores: {names} vs wall time"


def plot(curves: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """One panel per curve of :func:`curve`, its values against wall minutes (train points as a
    line, evaluations as dots, the target dashed), under ``title``; saved at ``path`` (its suffix
    picks the format)."""
    fig = Figure(figsize=(7, 0.4 + 3.2 * len(curves)), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(curves), 1, squeeze=False, sharex=True)[:, 0]
    for ax, data in zip(axes, curves):
        metric = data["metric"]
        if data["train"]:
            w, _, v = zip(*data["train"])
            ax.plot([x / 60 for x in w], v, color="#9ecae1", lw=1.2,
                    label=metric if "/" in metric else "train episodes (last 20)")
        if data["eval"]:
            w, _, v = zip(*data["eval"])
            how = "mean action" if data["eval_deterministic"] else "sampled actions"
            ax.plot([x / 60 for x in w], v, "o-", color="#08519c", lw=2,
                    label=metric if "/" in metric else f"evaluation, {data['eval_episodes']} episodes ({how})")
        if data["target"] is not None:
            ax.axhline(data["target"], color="#cb181d", ls="--", lw=1, label=f"target {data['target']:g}")
        ax.set_ylabel(metric.replace("_", " "))
        if metric == "success_rate":
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("wall time (minutes)")
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _points(rows: Sequence[dict[str, Any]], key: str | None) -> list[Point]:
    if key is None:
        return []
    return [(r["wall_s"], r["env_steps"], r[key]) for r in rows if r.get(key) is not None]


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _read_yaml(path: Path) -> dict[str, Any]:
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
