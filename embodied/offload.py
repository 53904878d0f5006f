"""Context switching: offload a component's tensors to host memory and onload them back.

When the M2Flow planner colocates the trainer and the rollout on one device, they take turns:
before a phase, the components that are not running call :meth:`Offloader.offload` to move their
weights, gradients, buffers and optimizer state to host memory, and :meth:`Offloader.onload`
before they run again.

One code path for every device. Each tensor is copied into a host buffer (pinned when CUDA is
available, so device-to-host copies are asynchronous DMA), the copies are synchronized, and then
the tensor's ``.data`` is swapped to the host buffer, as ``nn.Module.to`` does. Swapping ``.data``
keeps every Python object (``nn.Parameter``, its ``.grad``, buffers, optimizer state tensors), so
an optimizer's references stay valid. On a CPU-only machine the "device" is the CPU and the
tensors still move to separate host buffers (new storage) and back; on CUDA the freed blocks are
returned to the driver (``torch.cuda.empty_cache``). Host buffers are allocated once and reused
by every later cycle; onload allocates fresh device tensors.

Device memory is only freed when nothing else holds the old storage: finish (or drop) pending
autograd graphs before offloading. Distinct tensors that share one storage (views of each other)
are refused, and flat-buffer wrappers (DDP bucket views, FSDP flat params) are not supported.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

#: Categories of moved tensors, the keys of :attr:`OffloadStats.what`.
CATEGORIES = ("weights", "grads", "buffers", "optimizer")

SlotKey = tuple[object, ...]  # stable across cycles: ("grads", 3), ("buffers", "norm.mean"), ...


@dataclass(frozen=True)
class OffloadStats:
    """What one ``offload``/``onload`` call moved.

    bytes_moved:         total bytes copied (the sum of ``what``); 0 for a no-op call.
    seconds:             wall time of the call, copies and synchronization included.
    device_bytes_before: device memory in use before the call: ``torch.cuda.memory_allocated`` on
                         CUDA (everything on the device, not only this module); on CPU, the bytes
                         of this component's tensors that live outside the host buffers.
    device_bytes_after:  the same after the call.
    what:                bytes per category: ``weights``, ``grads``, ``buffers``, ``optimizer``.
    """

    bytes_moved: int
    seconds: float
    device_bytes_before: int
    device_bytes_after: int
    what: dict[str, int]


@dataclass
class _Slot:
    key: SlotKey
    category: str
    tensor: torch.Tensor  # the object whose ``.data`` is swapped


class Offloader:
    """Moves a module's (and optionally its optimizer's) tensors between the device and host memory.

    >>> offloader = Offloader(model, optimizer)
    >>> offloader.offload()   # before the other component's phase
    >>> offloader.onload()    # before this component runs again
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.module = module
        self.optimizer = optimizer
        #: host buffers are pinned when CUDA is available (asynchronous, faster copies).
        self.pin_memory = torch.cuda.is_available()
        self._host: dict[SlotKey, torch.Tensor] = {}
        self._origin: dict[SlotKey, torch.device] = {}
        self._device = torch.device("cpu")
        self._offloaded = False

    @property
    def is_offloaded(self) -> bool:
        """True between ``offload()`` and the next ``onload()``."""
        return self._offloaded

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory held by the reusable buffers (kept between cycles)."""
        return sum(buf.nbytes for buf in self._host.values())

    def offload(self) -> OffloadStats:
        """Move every weight, gradient, buffer and optimizer state tensor into host buffers."""
        if self._offloaded:
            return self._nothing_moved()
        start = time.perf_counter()
        slots = list(self._slots())
        _check_no_shared_storage(slots)
        self._device = _main_device(slots)
        before = self._device_bytes(slots)
        what = self._move(slots, to_host=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._offloaded = True
        return OffloadStats(sum(what.values()), time.perf_counter() - start, before, self._device_bytes(slots), what)

    def onload(self) -> OffloadStats:
        """Move the offloaded tensors back to the devices they came from (new device storage)."""
        if not self._offloaded:
            return self._nothing_moved()
        start = time.perf_counter()
        slots = [slot for slot in self._slots() if self._on_host(slot)]
        before = self._device_bytes(slots)
        what = self._move(slots, to_host=False)
        self._offloaded = False
        return OffloadStats(sum(what.values()), time.perf_counter() - start, before, self._device_bytes(slots), what)

    def free_host_buffers(self) -> None:
        """Release the host buffers (the next offload allocates them again); only while onloaded."""
        if self._offloaded:
            raise RuntimeError("free_host_buffers() while offloaded would drop the only copy; onload() first")
        self._host.clear()
        self._origin.clear()

    # -- internals -------------------------------------------------------------------------------

    @torch.no_grad()
    def _move(self, slots: list[_Slot], to_host: bool) -> dict[str, int]:
        """Copy every slot, synchronize, then swap ``.data``; the old storage is dropped on return."""
        what = dict.fromkeys(CATEGORIES, 0)
        targets: list[torch.Tensor] = []
        devices: set[torch.device] = set()
        for slot in slots:
            source = slot.tensor.data
            if to_host:
                self._origin[slot.key] = source.device
                target = self._host_buffer(slot.key, source)
            else:
                target = torch.empty_like(source, device=self._origin[slot.key])
            target.copy_(source, non_blocking=True)
            targets.append(target)
            devices.update((source.device, target.device))
            what[slot.category] += source.nbytes
        _synchronize(devices)
        for slot, target in zip(slots, targets):
            slot.tensor.data = target
        return what

    def _host_buffer(self, key: SlotKey, like: torch.Tensor) -> torch.Tensor:
        buf = self._host.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype or buf.stride() != like.stride():
            buf = torch.empty_like(like, device="cpu", pin_memory=self.pin_memory)
            self._host[key] = buf
        return buf

    def _on_host(self, slot: _Slot) -> bool:
        buf = self._host.get(slot.key)
        return buf is not None and slot.tensor.data_ptr() == buf.data_ptr() and slot.tensor.device == buf.device

    def _slots(self) -> Iterator[_Slot]:
        """Every managed tensor with a key that stays the same across cycles."""
        params = list(self.module.parameters())
        seen = {id(p) for p in params}
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                extra = [p for p in group["params"] if id(p) not in seen]
                params += extra
                seen.update(id(p) for p in extra)
        index = {id(p): i for i, p in enumerate(params)}
        for i, param in enumerate(params):
            yield _Slot(("weights", i), "weights", param)
        for i, param in enumerate(params):
            if param.grad is not None:
                yield _Slot(("grads", i), "grads", param.grad)
        for name, buffer in self.module.named_buffers():
            yield _Slot(("buffers", name), "buffers", buffer)
        if self.optimizer is not None:
            for param, state in self.optimizer.state.items():
                for name, value in state.items():
                    if isinstance(value, torch.Tensor):
                        yield _Slot(("optimizer", index.get(id(param), id(param)), name), "optimizer", value)

    def _device_bytes(self, slots: list[_Slot]) -> int:
        if self._device.type == "cuda":
            return torch.cuda.memory_allocated(self._device)
        return sum(slot.tensor.nbytes for slot in slots if not self._on_host(slot))

    def _nothing_moved(self) -> OffloadStats:
        resident = self._device_bytes(list(self._slots()))
        return OffloadStats(0, 0.0, resident, resident, dict.fromkeys(CATEGORIES, 0))


def _main_device(slots: list[_Slot]) -> torch.device:
    """The device of the first weight (else of any tensor); CPU for an empty module."""
    weights = [slot for slot in slots if slot.category == "weights"]
    first = weights or slots
    return first[0].tensor.device if first else torch.device("cpu")


def _synchronize(devices: set[torch.device]) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _check_no_shared_storage(slots: list[_Slot]) -> None:
    owners: dict[tuple[torch.device, int], SlotKey] = {}
    for slot in slots:
        if slot.tensor.numel() == 0:
            continue
        where = (slot.tensor.device, slot.tensor.untyped_storage().data_ptr())
        if where in owners:
            raise ValueError(
                f"cannot offload: {owners[where]} and {slot.key} share one storage (views of one tensor); "
                "moving them separately would break the aliasing"
            )
        owners[where] = slot.key
