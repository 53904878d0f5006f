"""Checkpoints: safetensors for tensors, JSON for everything else; nothing is ever unpickled.

Layout: ``<run>/checkpoints/iter_000010/{model.safetensors, optimizer.safetensors, state.json}``
and ``<run>/checkpoints/latest`` (a text file naming the newest checkpoint dir).

Writing (:func:`save_checkpoint`): the files go to ``.tmp-iter_000010/`` (each fsynced), with
``state.json`` last, which lists every file's size; the dir is renamed into place, then ``latest``
is replaced atomically. A kill or a full disk mid-write therefore never touches the previous
checkpoint or ``latest``: a failed write removes its temporary dir and raises
:class:`~embodied.errors.StorageError` (exit code 4) naming the path and the free space; a
killed one leaves a ``.tmp-iter_*`` dir that the next save removes. The last ``keep`` checkpoints
are kept; checkpoints numbered after the one being saved (left by a run resumed from an earlier
checkpoint) are removed.

Reading (:func:`find_checkpoint`, :func:`load_checkpoint`): a checkpoint is *intact* when
``state.json`` parses, every file it lists has its size, and each safetensors file's header
parses and its tensors exactly fill the file (:func:`checkpoint_problems`). When the latest
checkpoint is not intact, :func:`find_checkpoint` raises :class:`CorruptCheckpointError` naming
the problem and the newest intact earlier checkpoint, or, with ``fallback=True``, returns that one
(logging what it skipped). :func:`check_compatible` names every tensor whose shape or dtype
differs between a model and a checkpoint, or that only one of them has
(:mod:`embodied.checkpoint_tensors`: what a checkpoint's tensors are, apart from its dirs).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from embodied.checkpoint_tensors import (
    MODEL_FILE,
    CheckpointMismatch,
    TensorSpec,
    check_compatible,
    flatten_optimizer,
    incompatibilities,
    safetensors_specs,
    tensor_specs,
    unflatten_optimizer,
)
from embodied.errors import StorageError, UserError, storage_error

__all__ = [
    "FALLBACK_OPTION", "LATEST", "MODEL_FILE", "OPTIMIZER_FILE", "STATE_FILE", "CheckpointMismatch", "CorruptCheckpointError",
    "TensorSpec", "check_compatible", "checkpoint_problems", "find_checkpoint", "flatten_optimizer", "incompatibilities",
    "is_intact", "iteration_of", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "safetensors_specs",
    "save_checkpoint", "tensor_specs", "unflatten_optimizer",
]

LATEST = "latest"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
TMP_PREFIX = ".tmp-"
#: The option that lets a resume fall back to the newest intact checkpoint (named in errors).
FALLBACK_OPTION = "resume_fallback=true"
_ITER_RE = re.compile(r"^iter_(\d+)$")

log = logging.getLogger("embodied.checkpoint")


class CorruptCheckpointError(StorageError):
    """A checkpoint that is truncated or corrupt (exit code 4). ``fallback`` is the newest
    intact earlier checkpoint, if there is one."""

    def __init__(self, message: str, path: str | Path, fallback: Path | None = None) -> None:
        super().__init__(message, path)
        self.fallback = fallback


# --- intact or not -------------------------------------------------------------------------------


def checkpoint_problems(path: str | Path) -> list[str]:
    """Why the checkpoint dir ``path`` is not intact (an empty list when it is)."""
    path = Path(path)
    if not path.is_dir():
        return [f"{path} is not a directory"]
    state_path = path / STATE_FILE
    if not state_path.is_file():
        return [f"{STATE_FILE} is missing (the write did not finish)"]
    try:
        state = json.loads(state_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return [f"{STATE_FILE} does not parse ({err})"]
    if not isinstance(state, dict) or not isinstance(state.get("iteration"), int):
        return [f"{STATE_FILE} has no iteration"]
    problems = []
    match = _ITER_RE.match(path.name)
    if match and int(match.group(1)) != state["iteration"]:
        problems.append(f"{STATE_FILE} says iteration {state['iteration']}, the dir name {path.name}")
    files: dict[str, int] = dict(state.get("files") or {})
    files.setdefault(MODEL_FILE, -1)
    if "optimizer" in state:
        files.setdefault(OPTIMIZER_FILE, -1)
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
            continue
        actual = file.stat().st_size
        if size >= 0 and actual != size:
            problems.append(f"{name} is {actual} bytes, {STATE_FILE} says {size}")
            continue
        if name.endswith(".safetensors"):
            try:
                safetensors_specs(file)
            except (OSError, ValueError) as err:
                problems.append(str(err))
    return problems


def is_intact(path: str | Path) -> bool:
    """Whether the checkpoint dir ``path`` is complete and readable (see :func:`checkpoint_problems`)."""
    return not checkpoint_problems(path)


def iteration_of(path: str | Path) -> int | None:
    """The iteration in a checkpoint dir's name (``iter_000010`` -> 10), or None."""
    match = _ITER_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(root: str | Path) -> list[Path]:
    """The checkpoint dirs under ``root`` (a ``checkpoints/`` dir), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(iteration_of(p), p) for p in root.iterdir() if p.is_dir()]
    return [p for it, p in sorted((it, p) for it, p in found if it is not None)]


# --- finding -------------------------------------------------------------------------------------


def _root_of(path: Path) -> Path | None:
    """The checkpoints dir of a run dir or of a checkpoints dir (None: no checkpoints there)."""
    for root in (path / "checkpoints", path):
        if (root / LATEST).is_file() or list_checkpoints(root):
            return root
    return None


def _latest_of(root: Path) -> Path | None:
    """The checkpoint ``latest`` names (even when missing or corrupt), else the newest by name."""
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text().strip()
        if name:
            return root / name
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def _newest_intact_before(root: Path, latest: Path) -> Path | None:
    limit = iteration_of(latest)
    for ckpt in reversed(list_checkpoints(root)):
        if ckpt != latest and (limit is None or (iteration_of(ckpt) or 0) < limit) and is_intact(ckpt):
            return ckpt
    return None


def find_checkpoint(path: str | Path, fallback: bool = False) -> Path:
    """Resolve a run dir, a ``checkpoints/`` dir or a checkpoint dir to an intact checkpoint dir.

    When the latest checkpoint is truncated or corrupt, raises :class:`CorruptCheckpointError`
    naming the problem and the newest intact earlier checkpoint; with ``fallback=True`` returns
    that one instead (and logs a warning naming what it skipped). A checkpoint dir named
    explicitly is never replaced by another."""
    return _find(Path(path), fallback, warn=True)


def _find(path: Path, fallback: bool, warn: bool) -> Path:
    if not path.exists():
        raise UserError(f"No run or checkpoint at {str(path)!r}: the path does not exist.")
    if not path.is_dir():
        raise UserError(f"{str(path)!r} is a file; expected a run dir or a checkpoint dir.")
    if (path / MODEL_FILE).is_file() or (path / STATE_FILE).is_file():
        problems = checkpoint_problems(path)
        if problems:
            raise CorruptCheckpointError(f"Checkpoint {path} is corrupt: {'; '.join(problems)}.", path)
        return path
    root = _root_of(path)
    latest = _latest_of(root) if root is not None else None
    if root is None or latest is None:
        raise UserError(
            f"No checkpoint in {str(path)!r}: expected a run dir with checkpoints/latest, or a checkpoint "
            "dir holding model.safetensors. Runs save checkpoints every checkpoint.every iterations "
            "and at the end."
        )
    problems = checkpoint_problems(latest) if latest.exists() else [f"it does not exist ({LATEST} names it)"]
    if not problems:
        return latest
    previous = _newest_intact_before(root, latest)
    what = f"The latest checkpoint {latest} is corrupt: {'; '.join(problems)}."
    if previous is None:
        raise CorruptCheckpointError(f"{what} No earlier checkpoint is intact, so the run cannot be resumed; "
                                     "start it again.", latest)
    if fallback:
        if warn:
            log.warning("%s Using the newest intact one, %s.", what, previous)
        return previous
    raise CorruptCheckpointError(
        f"{what} The newest intact one is {previous} (iteration {iteration_of(previous)}); to continue from "
        f"it, add {FALLBACK_OPTION} to the command (iterations after it are then dropped from the metrics "
        "and later checkpoints are replaced).",
        latest, previous,
    )


def latest_checkpoint(path: str | Path) -> Path | None:
    """The newest intact checkpoint of a run dir (or ``checkpoints/`` dir), or None; never raises
    (for failure messages)."""
    try:
        return _find(Path(path), fallback=True, warn=False)
    except (UserError, StorageError, OSError):
        return None


# --- writing -------------------------------------------------------------------------------------


def save_checkpoint(
    root: str | Path,
    iteration: int,
    model: Mapping[str, torch.Tensor],
    optimizer: dict[str, Any] | None,
    state: dict[str, Any],
    keep: int = 3,
) -> Path:
    """Write checkpoint ``iter_<iteration>`` under ``root`` atomically, point ``latest`` at it, and
    keep the ``keep`` (>= 1) newest checkpoints. Raises :class:`StorageError` when a file cannot
    be written (disk full, no permission); the previous checkpoint and ``latest`` stay intact."""
    if keep < 1:
        raise UserError(f"keep_checkpoints must be >= 1 (the checkpoint a resume needs), got {keep}.")
    root = Path(root)
    name = f"iter_{iteration:06d}"
    final = root / name
    tmp = root / f"{TMP_PREFIX}{name}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale(root)
        tmp.mkdir()
        files = {MODEL_FILE: _write_tensors({k: v.detach().cpu().contiguous() for k, v in model.items()}, tmp / MODEL_FILE)}
        meta: dict[str, Any] = {"iteration": iteration, **state}
        if optimizer is not None:
            opt_tensors, opt_meta = flatten_optimizer(optimizer)
            files[OPTIMIZER_FILE] = _write_tensors(opt_tensors, tmp / OPTIMIZER_FILE)
            meta["optimizer"] = opt_meta
        meta["files"] = files
        _write_text_atomic(tmp / STATE_FILE, json.dumps(meta, indent=2))
        _fsync_dir(tmp)
        _replace_dir(tmp, final)
        _fsync_dir(root)
        _write_text_atomic(root / LATEST, name + "\n")
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(f"Saving checkpoint {name}", final, err) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep, iteration)
    return final


def _write_tensors(tensors: dict[str, torch.Tensor], path: Path) -> int:
    """Save ``tensors`` to ``path`` (fsynced); its size in bytes. An I/O error is an OSError."""
    try:
        save_file(tensors, str(path))
    except Exception as err:  # safetensors reports I/O errors as SafetensorError("... (os error N)")
        match = re.search(r"os error (\d+)", str(err))
        if match is None:
            raise
        code = int(match.group(1))
        raise OSError(code, os.strerror(code), str(path)) from err
    _fsync_file(path)
    return path.stat().st_size


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move ``tmp`` to ``final``; an existing ``final`` (the same iteration saved again) is moved
    aside first and removed after, so ``final`` is never half-deleted."""
    old = None
    if final.exists():
        old = final.with_name(f"{TMP_PREFIX}old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale(root: Path) -> None:
    """Temporary dirs and files of writes that were killed (a run holds the run dir's lock, so no
    other write is in flight)."""
    for p in root.iterdir():
        if p.name.startswith(TMP_PREFIX) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.name == f".{LATEST}.tmp":
            p.unlink(missing_ok=True)


def _prune(root: Path, keep: int, current: int) -> None:
    """Keep the ``keep`` newest checkpoints up to ``current``; remove those after it (left by a run
    that was resumed from an earlier checkpoint: that history was abandoned)."""
    ckpts = list_checkpoints(root)
    later = [p for p in ckpts if (iteration_of(p) or 0) > current]
    upto = [p for p in ckpts if (iteration_of(p) or 0) <= current]
    for old in later + upto[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a dir
        pass
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --- reading -------------------------------------------------------------------------------------


def load_checkpoint(
    path: str | Path, fallback: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, Any]]:
    """(model tensors, optimizer state_dict or None, state) of a checkpoint (see
    :func:`find_checkpoint`; ``state["path"]`` is the checkpoint dir used)."""
    ckpt = find_checkpoint(path, fallback=fallback)
    try:
        model = load_file(ckpt / MODEL_FILE)
        state = json.loads((ckpt / STATE_FILE).read_text())
        optimizer = None
        if (ckpt / OPTIMIZER_FILE).is_file() and "optimizer" in state:
            optimizer = unflatten_optimizer(load_file(ckpt / OPTIMIZER_FILE), state.pop("optimizer"))
    except Exception as err:  # validated a moment ago: a file changed or the disk fails
        raise CorruptCheckpointError(f"Checkpoint {ckpt} cannot be read: {err}", ckpt) from err
    state.pop("files", None)
    state["path"] = str(ckpt)
    return model, optimizer, state
