"""Checkpoints: safetensors for tensors, JSON for everything else; nothing is ever unpickled.

Layout: ``<run>/checkpoints/iter_000010/{model.safetensors, optimizer.safetensors, state.json}``
and ``<run>/checkpoints/latest`` (a text file naming the newest checkpoint dir). A checkpoint is
written to a temporary dir and renamed into place, and ``latest`` is replaced atomically after it,
so a kill mid-write never leaves a broken latest checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from embodied.errors import UserError

LATEST = "latest"


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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    root: str | Path,
    iteration: int,
    model: dict[str, torch.Tensor],
    optimizer: dict[str, Any] | None,
    state: dict[str, Any],
    keep: int = 3,
) -> Path:
    """Write checkpoint ``iter_<iteration>`` under ``root`` atomically and point ``latest`` at it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"iter_{iteration:06d}"
    final = root / name
    tmp = root / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.detach().cpu().contiguous() for k, v in model.items()}, tmp / "model.safetensors")
    meta: dict[str, Any] = {"iteration": iteration, **state}
    if optimizer is not None:
        opt_tensors, opt_meta = flatten_optimizer(optimizer)
        save_file(opt_tensors, tmp / "optimizer.safetensors")
        meta["optimizer"] = opt_meta
    _write_text_atomic(tmp / "state.json", json.dumps(meta, indent=2))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    _write_text_atomic(root / LATEST, name + "\n")
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    ckpts = sorted(p for p in root.glob("iter_*") if p.is_dir())
    for old in ckpts[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(path: str | Path) -> Path:
    """Resolve a run dir, a ``checkpoints/`` dir or a checkpoint dir to a checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"No run or checkpoint at {str(path)!r}: the path does not exist.")
    if (path / "model.safetensors").is_file():
        return path
    for root in (path / "checkpoints", path):
        latest = root / LATEST
        if latest.is_file():
            ckpt = root / latest.read_text().strip()
            if (ckpt / "model.safetensors").is_file():
                return ckpt
        ckpts = sorted(p for p in root.glob("iter_*") if (p / "model.safetensors").is_file())
        if ckpts:
            return ckpts[-1]
    raise UserError(
        f"No checkpoint in {str(path)!r}: expected a run dir with checkpoints/latest, or a checkpoint "
        "dir holding model.safetensors. Runs save checkpoints every run.checkpoint_every iterations "
        "and at the end."
    )


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, Any]]:
    """(model tensors, optimizer state_dict or None, state) of a checkpoint (see find_checkpoint)."""
    ckpt = find_checkpoint(path)
    model = load_file(ckpt / "model.safetensors")
    state = json.loads((ckpt / "state.json").read_text())
    optimizer = None
    if (ckpt / "optimizer.safetensors").is_file() and "optimizer" in state:
        optimizer = unflatten_optimizer(load_file(ckpt / "optimizer.safetensors"), state.pop("optimizer"))
    state["path"] = str(ckpt)
    return model, optimizer, state
