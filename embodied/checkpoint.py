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
differs between a model and a checkpoint, or that only one of them has.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from embodied.errors import StorageError, UserError, storage_error

LATEST = "latest"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
TMP_PREFIX = ".tmp-"
#: The option that lets a resume fall back to the newest intact checkpoint (named in errors).
FALLBACK_OPTION = "resume_fallback=true"
_ITER_RE = re.compile(r"^iter_(\d+)$")
#: Largest safetensors header the format allows (100 MB); a bigger length means a corrupt file.
_MAX_HEADER_BYTES = 100_000_000

#: Bytes per element of each safetensors dtype.
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}
#: torch dtype -> safetensors dtype name.
_TORCH_DTYPES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
    torch.float64: "F64", torch.complex64: "C64",
}
for _name, _st in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("uint16", "U16"),
                   ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        _TORCH_DTYPES[getattr(torch, _name)] = _st

log = logging.getLogger("embodied.checkpoint")


class CorruptCheckpointError(StorageError):
    """A checkpoint that is truncated or corrupt (exit code 4). ``fallback`` is the newest
    intact earlier checkpoint, if there is one."""

    def __init__(self, message: str, path: str | Path, fallback: Path | None = None) -> None:
        super().__init__(message, path)
        self.fallback = fallback


class CheckpointMismatch(UserError):
    """A checkpoint whose tensors do not fit the model built from the config (exit code 2).
    ``differences`` lists each one."""

    def __init__(self, message: str, differences: list[str]) -> None:
        super().__init__(message)
        self.differences = differences


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's safetensors dtype name (``"F32"``) and shape."""

    dtype: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype} {self.shape}"


# --- the optimizer as tensors + JSON ----------------------------------------------------------------


def flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A torch optimizer ``state_dict`` as (tensors by dotted name, JSON-safe rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in state["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten_optimizer`."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for idx, entry in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(entry)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


# --- validation ----------------------------------------------------------------------------------


def safetensors_specs(path: str | Path) -> dict[str, TensorSpec]:
    """The tensors of a safetensors file by name, read from its header only (no data loaded).

    Raises ValueError naming the problem when the header is unreadable or the tensors do not
    exactly fill the file (a truncated or padded file)."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path.name} is {size} bytes, shorter than a safetensors header")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(size - 8, _MAX_HEADER_BYTES):
            raise ValueError(f"{path.name}: header length {header_len} does not fit the file of {size} bytes")
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path.name}: the header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: the header is not a JSON object")
    data_len = size - 8 - header_len
    specs: dict[str, TensorSpec] = {}
    end_max = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path.name}: tensor {name!r} has a malformed header entry") from None
        if not 0 <= begin <= end:
            raise ValueError(f"{path.name}: tensor {name!r} has offsets {begin}..{end}")
        item = _DTYPE_BYTES.get(dtype)
        if item is not None and end - begin != math.prod(shape) * item:
            raise ValueError(f"{path.name}: tensor {name!r} ({dtype} {shape}) spans {end - begin} bytes, "
                             f"expected {math.prod(shape) * item}")
        end_max = max(end_max, end)
        specs[name] = TensorSpec(dtype, shape)
    if end_max != data_len:
        how = "truncated" if end_max > data_len else "longer than its tensors"
        raise ValueError(f"{path.name} is {how}: its tensors need {end_max} bytes of data, the file holds {data_len}")
    return specs


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


# --- compatibility -------------------------------------------------------------------------------


def tensor_specs(tensors: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """The dtype and shape of each tensor of a state dict."""
    return {k: TensorSpec(_TORCH_DTYPES.get(v.dtype, str(v.dtype)), tuple(v.shape)) for k, v in tensors.items()}


def incompatibilities(model_state: Mapping[str, torch.Tensor], checkpoint: str | Path | Mapping[str, torch.Tensor]) -> list[str]:
    """Every difference between a model's state dict and a checkpoint's tensors (a checkpoint dir,
    or its loaded tensors): a shape or dtype that differs, a tensor the checkpoint lacks, a tensor
    only the checkpoint has. Empty when the checkpoint loads into the model as it is."""
    expected = tensor_specs(model_state)
    if isinstance(checkpoint, Mapping):
        found = tensor_specs(checkpoint)
    else:
        found = safetensors_specs(Path(checkpoint) / MODEL_FILE)
    out = []
    for key in sorted(expected.keys() | found.keys()):
        want, have = expected.get(key), found.get(key)
        if have is None:
            out.append(f"{key!r} ({want}) is missing from the checkpoint")
        elif want is None:
            out.append(f"{key!r} ({have}) is in the checkpoint but not in the model")
        elif want.shape != have.shape:
            out.append(f"{key!r} has shape {have.shape} in the checkpoint, {want.shape} in the model")
        elif want.dtype != have.dtype:
            out.append(f"{key!r} has dtype {have.dtype} in the checkpoint, {want.dtype} in the model")
    return out


def check_compatible(
    model_state: Mapping[str, torch.Tensor], checkpoint: str | Path | Mapping[str, torch.Tensor], where: str = "the checkpoint"
) -> None:
    """Raise :class:`CheckpointMismatch` naming every difference (see :func:`incompatibilities`)
    when the checkpoint does not fit the model built from the current config."""
    diffs = incompatibilities(model_state, checkpoint)
    if diffs:
        shown = "; ".join(diffs[:20]) + (f"; and {len(diffs) - 20} more" if len(diffs) > 20 else "")
        raise CheckpointMismatch(
            f"{where} does not fit the model built from this config ({len(diffs)} difference"
            f"{'s' if len(diffs) != 1 else ''}): {shown}. Resume with the config the run was started with "
            "(its config.yaml), or start a new run.",
            diffs,
        )
