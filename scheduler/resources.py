"""Devices the planner may place components on.

A device is one schedulable unit: a GPU, or a CPU core (or a group of cores the runtime treats as
one worker slot). Plans refer to devices by their index in :attr:`Resources.devices`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler._json import check_keys
from scheduler.profile import DEVICE_KINDS


@dataclass(frozen=True)
class Device:
    """One device: ``kind`` is ``"cpu"`` or ``"gpu"``; ``memory_gib`` is what components may use."""

    name: str
    kind: str
    memory_gib: float

    def __post_init__(self) -> None:
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"device {self.name!r}: kind must be one of {DEVICE_KINDS}, got {self.kind!r}")
        if not self.memory_gib > 0:
            raise ValueError(f"device {self.name!r}: memory_gib must be > 0, got {self.memory_gib}")


@dataclass(frozen=True)
class DeviceClass:
    """Interchangeable devices (same kind and memory): placements only differ by counts in a class."""

    kind: str
    memory_gib: float
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Resources:
    """The devices of a cluster, indexed from 0 in the order given."""

    devices: tuple[Device, ...]

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("Resources needs at least one device")
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError(f"device names must be unique, got {names}")

    @classmethod
    def cpu_cores(cls, n: int, memory_gib: float) -> Resources:
        """``n`` CPU cores ``cpu0..``, each allowed ``memory_gib`` GiB."""
        return cls(tuple(Device(f"cpu{i}", "cpu", memory_gib) for i in range(n)))

    @classmethod
    def gpus(cls, n: int, memory_gib: float) -> Resources:
        """``n`` GPUs ``gpu0..`` with ``memory_gib`` GiB each."""
        return cls(tuple(Device(f"gpu{i}", "gpu", memory_gib) for i in range(n)))

    def __add__(self, other: Resources) -> Resources:
        """Concatenate: ``Resources.gpus(2, 80) + Resources.cpu_cores(16, 4)``."""
        return Resources(self.devices + other.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def classes(self) -> tuple[DeviceClass, ...]:
        """Groups of interchangeable devices, in order of first appearance."""
        groups: dict[tuple[str, float], list[int]] = {}
        for i, device in enumerate(self.devices):
            groups.setdefault((device.kind, device.memory_gib), []).append(i)
        return tuple(DeviceClass(kind, mem, tuple(idx)) for (kind, mem), idx in groups.items())

    def describe(self, index: int) -> str:
        device = self.devices[index]
        return f"device {index} ({device.name}, {device.kind}, {device.memory_gib:g} GiB)"

    def to_dict(self) -> dict[str, Any]:
        return {"devices": [{"name": d.name, "kind": d.kind, "memory_gib": d.memory_gib} for d in self.devices]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Resources:
        check_keys("Resources", data, ["devices"], required=["devices"])
        devices = []
        for entry in data["devices"]:
            check_keys("Device", entry, ["name", "kind", "memory_gib"], required=["name", "kind", "memory_gib"])
            devices.append(Device(str(entry["name"]), str(entry["kind"]), float(entry["memory_gib"])))
        return cls(tuple(devices))
