"""Weight sync: the trainer's weights into rollout workers, dtype for dtype, only what can change.

:class:`WeightSyncer` exports a module's tensors as raw bytes (:class:`WeightPayload`): one uint8
numpy array per tensor, a view of the tensor's own memory on the CPU (no copy until Ray's object
store takes the payload), and for tensors on a GPU one device-side concatenation per dtype and a
single device-to-host copy. Plain numpy bytes move zero-copy to every reader on a node (one copy
per node), and bf16/fp16 tensors arrive bit for bit (numpy has no bfloat16; the bytes do not
care). The receiving side copies each tensor into the module in place (and onto its device),
checking names, shapes and dtypes.

What travels: every tensor of the module's ``state_dict``, or, when some parameters are frozen
(LoRA adapters on a frozen base, a value head on a frozen encoder), only the trainable parameters
and the buffers (running statistics can change too); the frozen rest is already in place on the
rollout side, built from the same checkpoint. Versions travel with the payload and the receiver
keeps the version it loaded, so stale trajectories can be refused.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class TensorSlot:
    """One tensor of a payload: its name, dtype and shape (its bytes are the matching array)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass
class WeightPayload:
    """A module's tensors as raw bytes: ``arrays[i]`` (uint8) holds the tensor ``slots[i]``."""

    version: int
    slots: tuple[TensorSlot, ...]
    arrays: tuple[np.ndarray, ...]
    trainable_only: bool

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def dtypes(self) -> set[str]:
        return {s.dtype for s in self.slots}

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
        """The bytes of ``module``'s tensors (see :meth:`tensors`)."""
        tensors = self.tensors(module)
        return export_tensors(tensors, version, trainable_only=len(tensors) < len(module.state_dict()))

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
        with torch.no_grad(), warnings.catch_warnings():
            # arrays read from Ray's object store are read-only; they are only ever read here
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for s, raw in zip(payload.slots, payload.arrays):
                state[s.name].data.copy_(_tensor(raw, s), non_blocking=True)
        return payload.version


def export_tensors(tensors: dict[str, torch.Tensor], version: int, trainable_only: bool) -> WeightPayload:
    """The bytes of whole ``tensors`` (by state-dict name), e.g. gathered from sharded trainer
    ranks; ``trainable_only``: they are the trainable part of the module (the rest is frozen)."""
    slots = tuple(TensorSlot(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors.items())
    raw = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors.values()]
    if any(r.device.type != "cpu" for r in raw):  # one device-side concatenation, one copy to the host
        host = torch.cat([r.reshape(-1) for r in raw]).cpu() if raw else torch.empty(0, dtype=torch.uint8)
        raw = list(torch.split(host, [r.numel() for r in raw]))
    return WeightPayload(int(version), slots, tuple(r.numpy() for r in raw), trainable_only=trainable_only)


def _tensor(raw: np.ndarray, slot: TensorSlot) -> torch.Tensor:
    """The tensor ``slot`` describes, viewing the bytes ``raw`` (no copy)."""
    return torch.from_numpy(raw).view(_dtype(slot.dtype)).reshape(slot.shape)


def state_of(payload: WeightPayload) -> dict[str, torch.Tensor]:
    """The payload's tensors as a ``{name: tensor}`` dict on the CPU (copies; e.g. to build a
    model for evaluation in another process)."""
    return {s.name: _tensor(np.array(raw), s) for s, raw in zip(payload.slots, payload.arrays)}
