"""What the planner outputs: a :class:`Plan` (the micro flow) and its predicted :class:`Timeline`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler._json import check_keys

MODES = ("colocated", "disaggregated", "hybrid", "shared", "streams")
"""Placement modes, simplest first (the planner's tie-break order)."""

SHARED = "shared"
"""The mode whose pool components float, unpinned, over one shared pool of CPU cores (see ``Plan.lanes``)."""

STREAMS = "streams"
"""The mode that cuts the pool of CPU cores into ``Plan.lanes`` streams: each stream's cores hold
one rank of every pool component (env and rollout), pinned there, taking turns on one chunk."""

LANE_MODES = (SHARED, STREAMS)
"""Modes whose ``Plan.lanes`` is at least 2."""

GPU_SWITCH = "switch"
"""GPU sharing: the components on one GPU run one task at a time (colocated with context
switching); a task that follows another component's on a GPU pays ``Profile.gpu_switch_s``. The
runtime's env and rollout take turns (the rollout decides for no chunk while the env steps one)."""

GPU_OVERLAP = "overlap"
"""GPU sharing: the pool components (env and rollout) on one GPU run at the same time (streamed),
each slowed down by ``Profile.gpu_contention`` while the other runs. The runtime keeps both
resident and pipelines the chunks (the env steps chunk c+1 while chunk c is decided for)."""

GPU_SHARING = (GPU_SWITCH, GPU_OVERLAP)
"""How a GPU simulator shares its GPU with the other components, simplest first (tie-break order)."""


@dataclass(frozen=True)
class Plan:
    """A micro flow the runtime executes.

    The runtime acts on ``placement``, ``num_chunks``, ``train_microbatch``, ``offload``, on
    ``gpu_sharing`` (``switch``: env and rollout on a shared device take turns; ``overlap``: they
    pipeline the chunks side by side) and, in ``shared`` and ``streams`` modes, on ``lanes``;
    ``mode`` names the shape of the placement for humans and logs, except ``shared``, which also
    tells the runtime to leave the pool components unpinned, and ``streams``, which tells it to
    run one pool rank per stream.
    """

    mode: str
    """One of :data:`MODES`."""
    placement: dict[str, tuple[int, ...]]
    """Component -> indices (into ``Resources.devices``) of the devices its worker group uses."""
    num_chunks: int
    """Micro-chunks each batch is split into (env batch or prompt batch); see ``chunk_sizes``."""
    train_microbatch: int | None
    """Samples per trainer forward/backward call (over all trainer devices); None = runtime default."""
    offload: tuple[str, ...]
    """Components that leave their devices' memory outside their own phase (sorted)."""
    predicted_iteration_s: float
    """Simulated seconds of one iteration (NaN when planned without a profile)."""
    lanes: int = 1
    """``shared`` mode: worker processes of the workflow's lane component (embodied: the rollout),
    one thread each, floating over the shared pool with the other pool components (the env);
    chunk c runs on lane ``c % lanes``. At least 2 in ``shared`` mode (one lane would be the
    hybrid flow unpinned).
    ``streams`` mode: the number of streams, one chunk each (``num_chunks == lanes``): stream s is
    block s of the pool's cores (:func:`split_devices`), where one env rank steps chunk s and one
    rollout rank infers for it, taking turns. At least 2 (one stream is the colocated flow).
    1 in every other mode."""
    gpu_sharing: str | None = None
    """Where the env (a GPU simulator) shares its GPUs with another component: one of
    :data:`GPU_SHARING` (``"switch"``: one task at a time per GPU, a switch cost between
    components; ``"overlap"``: env and rollout run concurrently, slowed by contention). None
    where no GPU is shared with the env (every CPU plan)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Plan.mode must be one of {MODES}, got {self.mode!r}")
        if self.num_chunks < 1:
            raise ValueError(f"Plan.num_chunks must be >= 1, got {self.num_chunks}")
        if self.train_microbatch is not None and self.train_microbatch < 1:
            raise ValueError(f"Plan.train_microbatch must be >= 1 or None, got {self.train_microbatch}")
        for name, devices in self.placement.items():
            if not isinstance(devices, tuple) or not devices or len(set(devices)) != len(devices):
                raise ValueError(f"Plan.placement[{name!r}] must be a non-empty tuple of distinct ints, got {devices!r}")
        if (self.lanes >= 2) != (self.mode in LANE_MODES) or self.lanes < 1:
            raise ValueError(f"Plan.lanes must be >= 2 in modes {LANE_MODES} and 1 in the others; got {self.lanes} in mode {self.mode!r}")
        if self.lanes > self.num_chunks:
            raise ValueError(f"Plan.lanes={self.lanes} exceeds num_chunks={self.num_chunks}: a lane would have no chunk")
        if self.mode == STREAMS and self.num_chunks != self.lanes:
            raise ValueError(f"a {STREAMS} plan runs one chunk per stream: num_chunks={self.num_chunks} != lanes={self.lanes}")
        if self.gpu_sharing is not None and self.gpu_sharing not in GPU_SHARING:
            raise ValueError(f"Plan.gpu_sharing must be None or one of {GPU_SHARING}, got {self.gpu_sharing!r}")
        if self.gpu_sharing == GPU_OVERLAP and self.mode in LANE_MODES:
            raise ValueError(f"Plan.gpu_sharing={GPU_OVERLAP!r} runs env and rollout side by side on a GPU; a {self.mode} plan's pool is CPU cores")
        unknown = sorted(set(self.offload) - set(self.placement))
        if unknown:
            raise ValueError(f"Plan.offload names components that are not placed: {unknown}")

    def key(self) -> tuple:
        """What makes two plans the same micro flow (everything but the prediction)."""
        return (self.mode, tuple(sorted(self.placement.items())), self.num_chunks, self.train_microbatch,
                tuple(self.offload), self.lanes, self.gpu_sharing)

    def to_dict(self) -> dict[str, Any]:
        predicted = self.predicted_iteration_s
        return {
            "mode": self.mode,
            "placement": {name: list(devices) for name, devices in self.placement.items()},
            "num_chunks": self.num_chunks,
            "train_microbatch": self.train_microbatch,
            "offload": list(self.offload),
            "predicted_iteration_s": None if math.isnan(predicted) else predicted,
            "lanes": self.lanes,
            "gpu_sharing": self.gpu_sharing,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        keys = ("mode", "placement", "num_chunks", "train_microbatch", "offload", "predicted_iteration_s", "lanes", "gpu_sharing")
        check_keys("Plan", data, keys, required=("mode", "placement", "num_chunks"))
        predicted = data.get("predicted_iteration_s")
        microbatch = data.get("train_microbatch")
        return cls(
            mode=data["mode"],
            placement={name: tuple(int(i) for i in devices) for name, devices in data["placement"].items()},
            num_chunks=int(data["num_chunks"]),
            train_microbatch=None if microbatch is None else int(microbatch),
            offload=tuple(data.get("offload", ())),
            predicted_iteration_s=math.nan if predicted is None else float(predicted),
            lanes=int(data.get("lanes", 1)),
            gpu_sharing=data.get("gpu_sharing"),
        )

    def placement_str(self) -> str:
        """E.g. ``"env:0-1 rollout:2 trainer:0-3"``; offloaded components end in ``*``; a shared
        plan ends in ``lanes=N``, a streams plan in ``streams=N``, a plan whose GPU simulator shares
        its GPUs in ``gpu=switch`` or ``gpu=overlap``."""
        parts = []
        for name, devices in self.placement.items():
            star = "*" if name in self.offload else ""
            parts.append(f"{name}:{_ranges(devices)}{star}")
        if self.lanes_label:
            parts.append(self.lanes_label)
        if self.gpu_sharing is not None:
            parts.append(f"gpu={self.gpu_sharing}")
        return " ".join(parts)

    @property
    def lanes_label(self) -> str:
        """``"lanes=N"`` (shared), ``"streams=N"`` (streams), else empty."""
        return {SHARED: f"lanes={self.lanes}", STREAMS: f"streams={self.lanes}"}.get(self.mode, "")

    def stream_devices(self, component: str) -> tuple[tuple[int, ...], ...]:
        """A ``streams`` plan: the devices of each stream among ``component``'s (stream s: block s)."""
        if self.mode != STREAMS:
            raise ValueError(f"stream_devices() of a {self.mode} plan: only a {STREAMS} plan has streams")
        return split_devices(self.placement[component], self.lanes)


def split_devices(devices: tuple[int, ...], parts: int) -> tuple[tuple[int, ...], ...]:
    """``devices`` in ``parts`` contiguous blocks whose sizes differ by at most one (larger first)."""
    if not 1 <= parts <= len(devices):
        raise ValueError(f"cannot split {len(devices)} device(s) into {parts} non-empty blocks")
    size, extra = divmod(len(devices), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(devices[start:end]))
        start = end
    return tuple(out)


@dataclass(frozen=True)
class Span:
    """One task's occupation of one device (a task on d devices gives d spans)."""

    component: str
    device: int
    start_s: float
    end_s: float
    step: int | None
    """Env/rollout step t (embodied); None otherwise."""
    chunk: int | None
    """Micro-chunk index; None for whole-batch tasks."""
    label: str
    """Unique name of the task, e.g. ``"env t3 c1"``, ``"trainer epoch 0"``, ``"offload rollout @2"``."""
    kind: str = "work"
    """``"work"``, ``"sync"`` (weight sync), ``"onload"`` or ``"offload"``."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Timeline:
    """A simulated iteration: spans, makespan and per-device utilization."""

    spans: tuple[Span, ...]
    makespan_s: float
    utilization: dict[int, float]
    """Device index -> fraction of the makespan it runs work or sync spans (context switches excluded)."""

    @property
    def mean_utilization(self) -> float:
        return sum(self.utilization.values()) / len(self.utilization) if self.utilization else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "spans": [s.to_dict() for s in self.spans],
            "makespan_s": self.makespan_s,
            "utilization": {str(d): u for d, u in self.utilization.items()},
        }


def _ranges(indices: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    out: list[str] = []
    ordered = sorted(indices)
    start = prev = ordered[0]
    for i in ordered[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)
