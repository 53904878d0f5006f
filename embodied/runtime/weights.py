"""Weight sync: the trainer's weights into rollout workers, dtype for dtype, only what can change.

:class:`WeightSyncer` packs a module's tensors into one flat byte buffer per dtype
(:class:`WeightPayload`). A payload is plain numpy bytes, so Ray's object store moves it zero-copy to
every reader on a node (one copy per node), and bf16/fp16 tensors arrive bit for bit (numpy has no
bfloat16; the bytes do not care). The receiving side copies each tensor into the module in place
(and onto its device), checking names, shapes and dtypes.

What travels: every tensor of the module's ``state_dict``, or, when some parameters are frozen
(LoRA adapters on a frozen base, a value head on a frozen encoder), only the trainable parameters
and the buffers (running statistics can change too); the frozen rest is already in place on the
rollout side, built from the same checkpoint. Versions travel with the payload and the receiver
keeps the version it loaded, so stale trajectories can be refused.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives in a payload: its dtype's buffer, byte offset and byte length."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass
class WeightPayload:
    """A module's tensors as one uint8 buffer per dtype (``buffers``) plus the index (``slots``)."""

    version: int
    buffers: dict[str, np.ndarray]
    slots: tuple[TensorSlot, ...]
    trainable_only: bool

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.slots]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


class WeightSyncer:
    """Exports a module's weights as a :class:`WeightPayload` and loads one into a module.

    ``trainable_only``: send only the trainable parameters and the buffers when some parameters are
    frozen (the default; with every parameter trainable it is the full state either way).
    """

    def __init__(self, trainable_only: bool = True) -> None:
        self.trainable_only = trainable_only

    def tensors(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The tensors that travel, by ``state_dict`` name."""
        state = module.state_dict(keep_vars=True)
        frozen = any(isinstance(t, nn.Parameter) and not t.requires_grad for t in state.values())
        if not (self.trainable_only and frozen):
            return dict(state)
        return {k: t for k, t in state.items() if not isinstance(t, nn.Parameter) or t.requires_grad}

    def export(self, module: nn.Module, version: int) -> WeightPayload:
        """Pack ``module``'s tensors (see :meth:`tensors`) into per-dtype byte buffers."""
        by_dtype: dict[str, list[tuple[str, torch.Tensor]]] = {}
        tensors = self.tensors(module)
        for name, t in tensors.items():
            by_dtype.setdefault(str(t.dtype).removeprefix("torch."), []).append((name, t))
        buffers: dict[str, np.ndarray] = {}
        slots: list[TensorSlot] = []
        for dtype, items in by_dtype.items():
            flat = [t.detach().reshape(-1).contiguous().view(torch.uint8) for _, t in items]
            packed = torch.cat(flat).cpu() if flat else torch.empty(0, dtype=torch.uint8)
            buffers[dtype] = packed.numpy()
            offset = 0
            for (name, t), f in zip(items, flat):
                slots.append(TensorSlot(name, dtype, tuple(t.shape), offset, f.numel()))
                offset += f.numel()
        frozen = len(tensors) < len(module.state_dict())
        return WeightPayload(int(version), buffers, tuple(slots), trainable_only=frozen)

    def load(self, module: nn.Module, payload: WeightPayload) -> int:
        """Copy ``payload`` into ``module``'s tensors in place; returns the payload's version.

        Raises ValueError naming every tensor that is missing, unexpected, or of another shape or
        dtype (the two sides must build the same model)."""
        state = module.state_dict(keep_vars=True)
        expected = set(self.tensors(module)) if payload.trainable_only else set(state)
        problems = [f"missing {n!r}" for n in sorted(expected - set(payload.names))]
        problems += [f"unexpected {n!r}" for n in sorted(set(payload.names) - set(state))]
        for s in payload.slots:
            t = state.get(s.name)
            if t is not None and (tuple(t.shape) != s.shape or str(t.dtype).removeprefix("torch.") != s.dtype):
                problems.append(f"{s.name!r} is {s.dtype}{list(s.shape)} in the payload, "
                                f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} here")
        if problems:
            raise ValueError("weight payload does not fit the module: " + "; ".join(problems))
        with warnings.catch_warnings():  # buffers read from Ray's object store are read-only; we only read them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            sources = {d: torch.from_numpy(b) for d, b in payload.buffers.items()}
        with torch.no_grad():
            for s in payload.slots:
                src = sources[s.dtype][s.offset : s.offset + s.nbytes].view(_dtype(s.dtype)).reshape(s.shape)
                state[s.name].data.copy_(src, non_blocking=True)
        return payload.version


def state_of(payload: WeightPayload) -> dict[str, torch.Tensor]:
    """The payload's tensors as a ``{name: tensor}`` dict on the CPU (copies; e.g. to build a
    model for evaluation in another process)."""
    out: dict[str, torch.Tensor] = {}
    for s in payload.slots:
        raw = torch.from_numpy(np.array(payload.buffers[s.dtype][s.offset : s.offset + s.nbytes]))
        out[s.name] = raw.view(_dtype(s.dtype)).reshape(s.shape)
    return out


def describe(payload: WeightPayload) -> dict[str, Any]:
    """Bytes and tensor counts of a payload, for metrics."""
    return {"weights/bytes": float(payload.nbytes), "weights/tensors": float(len(payload.slots)),
            "weights/trainable_only": float(payload.trainable_only)}
