"""Progress of a training run: a live bar on a terminal, plain periodic log lines otherwise (the
terminal and the run's log file)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

LOG = logging.getLogger("embodied.progress")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


#: what a progress line shows by default: (label, metric key)
EPISODE_METRICS = (("return", "train/episode_return"), ("success", "train/success_rate"))


class Progress:
    """``update(env_steps, metrics)`` after each iteration; ``close()`` at the end.

    ``unit`` names what the steps count (``steps``, ``prompts``); ``shown`` the (label, metric key)
    pairs a line reports, ``-`` while a metric is missing.

    The rate shown (``steps/s``) is the one ``summary.json`` reports: the mean of the iterations'
    ``rate_key`` metric (``perf/env_steps_per_s``) over the run, ``rates`` holding those of the
    iterations before a resume; without ``rate_key``, or before its first value, the steps since
    the start over the wall-clock time. The ETA is the wall-clock estimate. A run counts whole
    iterations, so its last one may pass the budget: the total shown is then the steps the run
    did (``201,600/201,600``), never more than 100%."""

    def __init__(self, total_env_steps: int, mode: str = "auto", log_every_s: float = 10.0, start_steps: int = 0,
                 unit: str = "steps", shown: tuple[tuple[str, str], ...] = EPISODE_METRICS,
                 rate_key: str | None = None, rates: tuple[float, ...] | list[float] = ()) -> None:
        self.unit = unit
        self.shown = shown
        self.rate_key = rate_key
        self.rates = [float(r) for r in rates if r]
        if mode == "auto":
            mode = "bar" if sys.stdout.isatty() else "lines"
        self.mode = mode
        self.total = total_env_steps
        self.log_every_s = log_every_s
        self.t0 = time.monotonic()
        self.start_steps = start_steps
        self._last_line = -1e9
        self._bar = None
        if mode == "bar":
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("[bold]train"),
                BarColumn(),
                TextColumn(f"{{task.completed:,.0f}}/{{task.total:,.0f}} {unit}"),
                TextColumn(f"{{task.fields[sps]}} {unit}/s"),
                TextColumn("{task.fields[shown]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._bar.add_task("train", total=total_env_steps, completed=start_steps, sps="-",
                                            shown=self._shown({}))
            self._bar.start()

    def rate(self, env_steps: int, elapsed_s: float) -> float:
        """The rate shown: the mean of the iterations' ``rate_key`` values (as summary.json),
        else steps per wall-clock second since the start."""
        if self.rates:
            return sum(self.rates) / len(self.rates)
        return (env_steps - self.start_steps) / max(elapsed_s, 1e-9)

    def update(self, env_steps: int, metrics: dict[str, Any], force: bool = False) -> None:
        elapsed = time.monotonic() - self.t0
        if self.rate_key is not None and metrics.get(self.rate_key):
            self.rates.append(float(metrics[self.rate_key]))
        wall_sps = (env_steps - self.start_steps) / max(elapsed, 1e-9)
        sps = self.rate(env_steps, elapsed)
        shown = self._shown(metrics)
        total = max(self.total, env_steps)  # the last iteration passed the budget: what the run did
        if self._bar is not None:
            self._bar.update(self._task, total=total, completed=env_steps, sps=f"{sps:,.0f}", shown=shown)
        elif self.mode == "lines" and (force or elapsed - self._last_line >= self.log_every_s or env_steps >= self.total):
            self._last_line = elapsed
            remaining = max(0.0, self.total - env_steps) / wall_sps if wall_sps > 0 else float("nan")
            pct = min(100.0, 100.0 * env_steps / max(total, 1))
            LOG.info(
                f"[train] {env_steps:,}/{total:,} {self.unit} ({pct:.0f}%) | {sps:,.0f} {self.unit}/s | "
                f"{shown} | elapsed {elapsed:.0f}s | ETA {remaining:.0f}s"
            )

    def _shown(self, metrics: dict[str, Any]) -> str:
        return " | ".join(f"{label} {_fmt(metrics.get(key))}" for label, key in self.shown)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
