"""Measured costs of the components of a flow: what the planner plans from.

The runtime's profiler fills a :class:`Profile` by probing each component at a few batch sizes
and device counts (:func:`scheduler.fit_cost_model`) and by timing one offload/onload. Tests and
benchmarks write hand-made profiles. Nothing here is a hand-set tuning knob of the planner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from scheduler._json import check_keys
from scheduler.cost_model import CostModel

DEVICE_KINDS = ("cpu", "gpu")

WEIGHT_SYNC = "weight_sync"
"""Optional profile entry: ``cost.time_s(1, n)`` is the local cost of loading new weights into the
rollout workers on n devices (e.g. resharding into an inference engine). The network part of the
sync is ``transfer_latency_s + weights_mib * transfer_s_per_mib`` of the ``rollout`` entry and is
added by the simulator only when trainer and rollout sit on different devices."""


@dataclass(frozen=True)
class ComponentProfile:
    """Costs of one component (``env``, ``rollout``, ``reward``, ``trainer``, ...)."""

    name: str
    cost: CostModel
    """Seconds per call as a function of batch items and device count."""
    memory_gib: float = 0.0
    """Static memory per device while resident (weights, optimizer state, simulator), GiB."""
    memory_per_item_gib: float = 0.0
    """Extra memory per device per batch item held on that device (activations, KV cache, env state), GiB."""
    offload_s: float = 0.0
    """Seconds to move the static state off one device (0 if unknown)."""
    onload_s: float = 0.0
    """Seconds to bring it back onto one device (0 if unknown)."""
    device_kind: str | None = None
    """``"cpu"`` or ``"gpu"`` if the cost was measured on (and the code needs) that kind; None = any."""
    output_mib_per_item: float = 0.0
    """Size of the message this component sends per item (obs, actions, rewards), MiB."""
    weights_mib: float = 0.0
    """Size of the weights a weight sync sends to this component, MiB (``rollout`` only)."""

    def __post_init__(self) -> None:
        for key in ("memory_gib", "memory_per_item_gib", "offload_s", "onload_s", "output_mib_per_item", "weights_mib"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"component {self.name!r}: {key} must be >= 0, got {getattr(self, key)}")
        if self.device_kind is not None and self.device_kind not in DEVICE_KINDS:
            raise ValueError(f"component {self.name!r}: device_kind must be one of {DEVICE_KINDS} or None")

    def memory_on_device_gib(self, items_on_device: int) -> float:
        """Resident memory on one device holding ``items_on_device`` batch items, GiB."""
        return self.memory_gib + self.memory_per_item_gib * items_on_device

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cost": self.cost.to_dict(),
            "memory_gib": self.memory_gib,
            "memory_per_item_gib": self.memory_per_item_gib,
            "offload_s": self.offload_s,
            "onload_s": self.onload_s,
            "device_kind": self.device_kind,
            "output_mib_per_item": self.output_mib_per_item,
            "weights_mib": self.weights_mib,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComponentProfile:
        check_keys("ComponentProfile", data, [f.name for f in fields(cls)], required=("name", "cost"))
        kwargs = dict(data)
        kwargs["cost"] = CostModel.from_dict(data["cost"])
        return cls(**kwargs)


@dataclass(frozen=True)
class Profile:
    """All components of a flow plus the cost of a message between processes."""

    components: dict[str, ComponentProfile]
    """Component name -> its profile; keys equal the profiles' names."""
    transfer_latency_s: float = 0.0
    """Fixed seconds per message between components on different devices."""
    transfer_s_per_mib: float = 0.0
    """Seconds per MiB of such a message."""
    cross_process_messages: bool = False
    """Every component runs in processes of its own, so a message between two components pays the
    transfer cost even when they share their devices (only messages within a component are free)."""
    gpu_switch_s: float = 0.0
    """Seconds a GPU loses when it turns from one component's task to another's (a ``switch`` plan:
    the CUDA context switch between processes that time-slice the GPU)."""
    gpu_contention: float = 1.5
    """How much slower each of two tasks runs while they overlap on one GPU (an ``overlap`` plan),
    in [1, 2]: 1 = they do not slow each other down, 2 = the GPU runs them at half speed each (no
    gain over running them one after the other)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance (host, probe batch sizes, ...); ignored by the planner."""

    def __post_init__(self) -> None:
        for key, component in self.components.items():
            if key != component.name:
                raise ValueError(f"Profile.components[{key!r}] is named {component.name!r}; keys must equal names")
        if not (self.transfer_latency_s >= 0 and self.transfer_s_per_mib >= 0):
            raise ValueError("Profile transfer costs must be >= 0")
        if not self.gpu_switch_s >= 0:
            raise ValueError(f"Profile.gpu_switch_s must be >= 0, got {self.gpu_switch_s}")
        if not 1.0 <= self.gpu_contention <= 2.0:
            raise ValueError(f"Profile.gpu_contention must lie in [1, 2], got {self.gpu_contention}")

    def __getitem__(self, name: str) -> ComponentProfile:
        try:
            return self.components[name]
        except KeyError:
            raise KeyError(f"profile has no component {name!r}; it has {sorted(self.components)}") from None

    def message_s(self, size_mib: float) -> float:
        """Seconds for one message of ``size_mib`` MiB between different devices."""
        return self.transfer_latency_s + size_mib * self.transfer_s_per_mib

    def to_dict(self) -> dict[str, Any]:
        return {
            "components": {name: c.to_dict() for name, c in sorted(self.components.items())},
            "transfer_latency_s": self.transfer_latency_s,
            "transfer_s_per_mib": self.transfer_s_per_mib,
            "cross_process_messages": self.cross_process_messages,
            "gpu_switch_s": self.gpu_switch_s,
            "gpu_contention": self.gpu_contention,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        check_keys("Profile", data, [f.name for f in fields(cls)], required=("components",))
        components = {name: ComponentProfile.from_dict(c) for name, c in data["components"].items()}
        return cls(
            components=components,
            transfer_latency_s=float(data.get("transfer_latency_s", 0.0)),
            transfer_s_per_mib=float(data.get("transfer_s_per_mib", 0.0)),
            cross_process_messages=bool(data.get("cross_process_messages", False)),
            gpu_switch_s=float(data.get("gpu_switch_s", 0.0)),
            gpu_contention=float(data.get("gpu_contention", 1.5)),
            meta=dict(data.get("meta", {})),
        )

