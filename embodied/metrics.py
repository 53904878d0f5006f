"""Where a run's numbers go: ``metrics.jsonl`` (one JSON object per iteration), TensorBoard event
files and a wandb run, all in the run dir. ``summary.json`` holds the final numbers."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


class MetricsLogger:
    def __init__(
        self,
        run_dir: str | Path,
        config: dict[str, Any],
        tensorboard: bool = True,
        wandb: bool = True,
        wandb_project: str = "embodied",
        wandb_mode: str | None = None,
        run_name: str | None = None,
        resume: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a")
        self._tb = None
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        if wandb:
            import wandb as wb

            mode = wandb_mode or os.environ.get("WANDB_MODE") or "offline"
            self._wandb = wb.init(
                project=wandb_project,
                name=run_name or self.run_dir.name,
                dir=str(self.run_dir),
                config=config,
                mode=mode,
                resume="allow" if resume else None,
                id=_wandb_id(self.run_dir),
                settings=wb.Settings(console="off", silent=True, x_disable_stats=True),
            )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row = {k: _clean(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        numeric = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        clean = {k: _clean(v) for k, v in values.items()}
        tmp = self.run_dir / ".summary.json.tmp"
        tmp.write_text(json.dumps(clean, indent=2))
        os.replace(tmp, self.run_dir / "summary.json")
        if self._wandb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._wandb.summary[k] = v

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_id(run_dir: Path) -> str:
    """A stable wandb id per run dir, so ``resume=`` continues the same wandb run."""
    id_file = run_dir / ".wandb_id"
    if id_file.is_file():
        return id_file.read_text().strip()
    import uuid

    rid = uuid.uuid4().hex[:12]
    id_file.write_text(rid)
    return rid


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
