"""Where a run's numbers go: ``metrics.jsonl`` (one JSON object per iteration), TensorBoard event
files and a wandb run, all in the run dir. ``summary.json`` holds the final numbers.

The x-axis (``step``) of TensorBoard and wandb is the number of env steps taken so far (the row's
``env_steps``), as RL papers plot it; ``metrics.jsonl`` rows carry both ``iteration`` and
``env_steps``.

Every iteration appears exactly once, also across crashes and ``resume=``:

* ``metrics.jsonl``: opening the logger rewrites the file atomically (temp file + rename) without
  a torn last line (a kill or a full disk in mid-write) and, on a resume from iteration N, without
  the rows after N (they belong to the iterations that are run again). A write that fails (disk
  full) truncates the file back to its last complete row and raises
  :class:`~embodied.errors.StorageError`; :func:`read_metrics` skips unreadable lines and says
  how many (``MetricsRows.skipped``).
* TensorBoard: the writer opens with ``purge_step`` = the resume point's step + 1, so TensorBoard
  hides the events of the abandoned iterations (every step >= purge_step written before the
  resume).
* wandb: the same run id continues with ``resume_from="<id>?_step=<step + 1>"`` (wandb's rewind:
  history from that step on is dropped and logged again). Rewind is a wandb server feature in
  preview: in offline mode the rewind is recorded in the offline run and applied by ``wandb sync``;
  online, when the server refuses it, the logger falls back to ``resume="allow"``, where wandb
  ignores steps it already has: the re-run iterations up to the crash keep the values logged
  before it (the metrics.jsonl and TensorBoard are exact either way).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.errors import storage_error

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
#: The row key that is the x-axis of TensorBoard and wandb.
STEP_KEY = "env_steps"

log = logging.getLogger("embodied.metrics")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the last iteration kept and its step (env steps then);
    everything logged after them is replaced."""

    iteration: int
    step: int


class MetricsRows(list):
    """The rows of a metrics.jsonl; ``skipped`` counts the lines that could not be read."""

    skipped: int = 0


def read_metrics(run_dir: str | Path) -> MetricsRows:
    """The rows of a run's metrics.jsonl. Lines that do not parse (a torn last line after a kill
    or a full disk) are skipped, counted in ``.skipped`` and reported in a warning."""
    path = Path(run_dir) / METRICS_FILE
    rows, bad = _parse(path)
    if bad:
        log.warning("%s: skipped %d unreadable line(s) (line %s): a write cut short by a kill or a full disk",
                    path, len(bad), ", ".join(str(n) for n in bad[:5]))
    out = MetricsRows(rows)
    out.skipped = len(bad)
    return out


def _parse(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(rows, 1-based numbers of the lines that do not parse) of a metrics file."""
    if not path.is_file():
        return [], []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                bad.append(number)
                continue
            if isinstance(row, dict) and line.endswith(b"\n"):
                rows.append(row)
            else:  # valid JSON but cut before its newline, or not a row: not a complete write
                bad.append(number)
    return rows, bad


def repair_metrics(run_dir: str | Path, keep_through: int | None = None) -> int:
    """Rewrite ``metrics.jsonl`` atomically with only its complete rows and, when
    ``keep_through`` is given, only the rows of iterations <= ``keep_through`` (rows without an
    ``iteration`` are kept). Returns the number of lines dropped. Raises StorageError when the
    rewrite cannot be written (the old file then stays as it was)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    rows, bad = _parse(path)
    kept = [r for r in rows if keep_through is None or not isinstance(r.get("iteration"), int) or r["iteration"] <= keep_through]
    dropped = len(bad) + len(rows) - len(kept)
    if dropped == 0:
        return 0
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            for row in kept:
                f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise storage_error("Rewriting metrics.jsonl", path, err) from err
    log.info("%s: dropped %d line(s) (%d unreadable, %d after iteration %s)", path, dropped, len(bad),
             dropped - len(bad), keep_through)
    return dropped


class MetricsLogger:
    """Writes each iteration's metrics to metrics.jsonl, TensorBoard and wandb (see the module
    docstring for the step unit and how a resume keeps every iteration exactly once).

    ``resume_from``: continue a run from this point (its rows after it are dropped, TensorBoard
    and wandb rewound). ``resume=True`` without a point only continues the wandb run (kept for
    callers that do not know the point; no rewind)."""

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
        resume_from: ResumePoint | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.resume_from = resume_from
        repair_metrics(self.run_dir, resume_from.iteration if resume_from is not None else None)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise storage_error("Opening metrics.jsonl", self.path, err) from err
        self._tb = None
        self._tb_failed = False
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_from.step + 1 if resume_from is not None else None
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge)
        if wandb:
            self._wandb = _init_wandb(self.run_dir, config, wandb_project, wandb_mode, run_name, resume, resume_from)

    @property
    def wandb_run(self) -> Any:
        """The wandb run (None without wandb)."""
        return self._wandb

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Append one iteration's row; ``step`` defaults to its ``env_steps``. Raises
        StorageError when the row cannot be written (the file keeps only complete rows)."""
        row = {k: _clean(v) for k, v in metrics.items()}
        if step is None:
            step = int(row[STEP_KEY])
        self._append(json.dumps(row) + "\n")
        numeric = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            try:  # TensorBoard's writer thread re-raises its OSError (a full disk) here
                for k, v in numeric.items():
                    self._tb.add_scalar(k, v, step)
                self._tb.flush()
            except OSError as err:
                self._tb_failed = True
                raise storage_error("Writing TensorBoard events", self.run_dir / "tensorboard", err) from err
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def _append(self, line: str) -> None:
        data = line.encode()
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as err:
            try:
                os.ftruncate(self._fd, start)  # no torn row: back to the last complete one
            except OSError:
                pass
            raise storage_error("Writing metrics.jsonl", self.path, err) from err

    def summary(self, values: dict[str, Any]) -> None:
        """Write summary.json atomically (and the wandb summary)."""
        clean = {k: _clean(v) for k, v in values.items()}
        path = self.run_dir / SUMMARY_FILE
        tmp = self.run_dir / f".{SUMMARY_FILE}.tmp"
        try:
            tmp.write_text(json.dumps(clean, indent=2))
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise storage_error("Writing summary.json", path, err) from err
        if self._wandb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._wandb.summary[k] = v

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._tb is not None:
            tb, self._tb = self._tb, None
            try:
                tb.close()
            except OSError as err:
                if not self._tb_failed:  # not reported yet: events of the last rows are lost
                    raise storage_error("Writing TensorBoard events", self.run_dir / "tensorboard", err) from err
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _init_wandb(
    run_dir: Path,
    config: dict[str, Any],
    project: str,
    mode: str | None,
    run_name: str | None,
    resume: bool,
    resume_from: ResumePoint | None,
) -> Any:
    mode = mode or os.environ.get("WANDB_MODE") or "offline"
    if mode in OFFLINE_WANDB_MODES:
        _wandb_stays_offline()
    import wandb as wb

    run_id = _wandb_id(run_dir)
    common = dict(
        project=project,
        name=run_name or run_dir.name,
        dir=str(run_dir),
        config=config,
        mode=mode,
        settings=wb.Settings(console="off", silent=True, x_disable_stats=True),
    )
    if resume_from is not None:
        try:
            return wb.init(resume_from=f"{run_id}?_step={resume_from.step + 1}", **common)
        except Exception as err:  # the server does not offer rewind to this account/instance
            log.warning("wandb could not rewind run %s to step %d (%s); continuing it instead: wandb keeps the "
                        "values it has for the steps logged before the crash", run_id, resume_from.step + 1, err)
    return wb.init(id=run_id, resume="allow" if resume or resume_from is not None else None, **common)


#: wandb modes that must not touch the network.
OFFLINE_WANDB_MODES = ("offline", "dryrun", "disabled")


def _wandb_stays_offline() -> None:
    """Switch off what wandb sends on its own in an offline run of this process: its error reports
    and usage telemetry. Without this, ``wandb.init(mode="offline")`` still asks the default server
    (``api.forge.coreweave.com:443``) whether it accepts telemetry (the process-wide telemetry
    recorder is made from the global settings, online unless ``WANDB_MODE`` says otherwise), and
    its ``wandb-core`` service starts with error reporting (Sentry) on.
    ``WANDB_ERROR_REPORTING=false`` turns both off (``wandb-core --no-observability``); it stays
    set for the rest of the process."""
    os.environ["WANDB_ERROR_REPORTING"] = "false"
    try:
        from wandb.analytics.opentelemetry import opentelemetry_proxy
    except ImportError:  # another wandb version: the variable is its documented switch
        return
    disable = getattr(opentelemetry_proxy, "disable", None)
    if callable(disable):
        disable()


def _wandb_id(run_dir: Path) -> str:
    """A stable wandb id per run dir, so ``resume=`` continues the same wandb run."""
    id_file = run_dir / ".wandb_id"
    if id_file.is_file():
        return id_file.read_text().strip()
    import uuid

    rid = uuid.uuid4().hex[:12]
    try:
        id_file.write_text(rid)
    except OSError as err:
        raise storage_error("Writing .wandb_id", id_file, err) from err
    return rid

