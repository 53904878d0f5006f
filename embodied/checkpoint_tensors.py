"""A checkpoint's tensors, apart from the dirs that hold them (:mod:`embodied.checkpoint`).

A checkpoint keeps tensors in safetensors files and nothing else there: the model's state dict as
it is, the optimizer's ``state_dict`` as tensors by dotted name plus a JSON-safe rest
(:func:`flatten_optimizer`). A file's tensors are read from its header alone, without loading any
data (:func:`safetensors_specs`), which is how an intact file is told from a truncated one and how a
resume learns, before it loads anything, whether a checkpoint fits the model the config builds
(:func:`check_compatible`).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from embodied.errors import UserError

#: The model's tensors file in a checkpoint dir.
MODEL_FILE = "model.safetensors"
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
