"""Weight sync: the trainer's weights into rollout workers, dtype for dtype, only what can change.

:class:`WeightSyncer` exports a module's tensors as raw bytes (:class:`WeightPayload`): one uint8
numpy array per tensor, a view of the tensor's own memory on the CPU (no copy until Ray's object
store takes the payload), and for tensors on a GPU a view of one host buffer that every tensor is
copied into, asynchronously (:class:`HostStaging`: page-locked memory, kept from one export to the
next). Plain numpy bytes move zero-copy to every reader on a node (one copy
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
import weakref
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
        self.staging = HostStaging()

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
        return export_tensors(tensors, version, trainable_only=len(tensors) < len(module.state_dict()),
                              staging=self.staging)

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


def export_tensors(tensors: dict[str, torch.Tensor], version: int, trainable_only: bool,
                   staging: HostStaging | None = None) -> WeightPayload:
    """The bytes of whole ``tensors`` (by state-dict name), e.g. gathered from sharded trainer
    ranks; ``trainable_only``: they are the trainable part of the module (the rest is frozen).
    Tensors on the CPU are viewed in place; the others are copied into one host buffer from
    ``staging`` (a fresh pageable one without it)."""
    slots = tuple(TensorSlot(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors.items())
    raw = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors.values()]
    arrays = [r.numpy() if r.device.type == "cpu" else None for r in raw]
    remote = [i for i, a in enumerate(arrays) if a is None]
    if remote:
        sizes = [raw[i].numel() for i in remote]
        devices = {raw[i].device for i in remote}
        host, array = (staging or HostStaging(pin=False)).take(sum(sizes), devices)
        pinned = host.is_pinned()
        offset = 0
        for i, n in zip(remote, sizes):
            # into page-locked memory the copies queue on the device's stream, and the host goes on
            host[offset:offset + n].copy_(raw[i], non_blocking=pinned)
            arrays[i] = array[offset:offset + n]
            offset += n
        if pinned:
            for device in devices:
                torch.cuda.synchronize(device)
    return WeightPayload(int(version), slots, tuple(arrays), trainable_only=trainable_only)


class HostStaging:
    """The host buffer device tensors are copied into on export, kept from one export to the next.

    Page-locked (pinned) when the tensors are on CUDA: copies from the device then run at the
    link's speed and asynchronously; into fresh pageable memory they go through the driver's
    bounce buffer and fault in every page first (an H200 exported openvla-7b's 14.3 GiB of bf16
    weights at 1.3 GB/s that way). Pinning is itself slow (seconds per 10 GiB): the first export
    pays it, later ones reuse the buffer -- but only once no array of the previous payload is alive
    (Ray's object store has copied it, its holder dropped it); otherwise they take a new one, so a
    payload never changes under its holder."""

    def __init__(self, pin: bool = True) -> None:
        self.pin = pin
        self._buffer: torch.Tensor | None = None
        self._handed_out: weakref.ref[np.ndarray] | None = None  # the array every payload array views
        self.allocations = 0

    def take(self, nbytes: int, devices: set[torch.device]) -> tuple[torch.Tensor, np.ndarray]:
        """``nbytes`` of host memory for copies from ``devices``: the uint8 tensor to copy into and
        the numpy array of the same bytes, which the payload's arrays must view (slices of it)."""
        pin = self.pin and any(d.type == "cuda" for d in devices) and torch.cuda.is_available()
        buffer = self._buffer
        free = self._handed_out is None or self._handed_out() is None
        if buffer is None or not free or buffer.numel() < nbytes or buffer.is_pinned() != pin:
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            self.allocations += 1
        self._buffer = buffer
        out = buffer[:nbytes]
        array = out.numpy()  # every slice of it (the payload's arrays) keeps this array alive
        self._handed_out = weakref.ref(array)
        return out, array


def _tensor(raw: np.ndarray, slot: TensorSlot) -> torch.Tensor:
    """The tensor ``slot`` describes, viewing the bytes ``raw`` (no copy)."""
    return torch.from_numpy(raw).view(_dtype(slot.dtype)).reshape(slot.shape)


def state_of(payload: WeightPayload) -> dict[str, torch.Tensor]:
    """The payload's tensors as a ``{name: tensor}`` dict on the CPU (copies; e.g. to build a
    model for evaluation in another process)."""
    return {s.name: _tensor(np.array(raw), s) for s, raw in zip(payload.slots, payload.arrays)}
