"""From a plan to what each rank gets: node, CPU cores, GPUs and the Ray resources to reserve.

    machine = Machine.local(num_cpus=2)                    # or Machine.of_nodes(...) on a Ray cluster
    layout = Layout.of(plan, machine, ranks={"env": 1, "rollout": 1, "trainer": 2})
    layout.ranks_of("trainer")   # (RankPlacement(node=None, cores=(0,), ...), RankPlacement(cores=(1,), ...))

The planner (``scheduler``) places components on device indices; a :class:`Machine` says which
node each device is on and its index there (a core number, a CUDA ordinal). :meth:`Layout.of` is
a pure function of plan, machine and rank counts, so the device map every rank would get on any
cluster can be checked without that cluster (``tests/pipelines/test_layout.py``).

How a component's ranks take its devices:

* Trainer ranks (data parallel) and ranks on GPUs each own a block of the component's devices
  (``tensor_split`` order, one node per rank); more ranks than devices share them round-robin.
* Env and rollout ranks on CPU cores share the component's cores on a node (their env
  processes and threads spread over them); the ranks are spread over the nodes the component
  spans.
* In a ``streams`` plan a component with one rank per stream (env and rollout) gives rank s the
  cores of stream s (``Plan.stream_devices``): each stream's env and rollout ranks share its cores.

A GPU shared by k ranks (colocated components; the plan's ``offload`` moves the idle phase's
state out of its memory) gives each a Ray reservation of 1/k of it. A rank sees exactly its GPUs
(``CUDA_VISIBLE_DEVICES``, which Ray is told not to overwrite), so ``cuda`` in the rank is its own
first GPU. On a cluster of several nodes every rank is scheduled onto its node by node affinity.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler import STREAMS, Device, Plan, Resources, split_devices

GIB = 2**30

#: Ray sets CUDA_VISIBLE_DEVICES of a worker that reserves GPUs; with this it leaves ours alone.
RAY_NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"

#: Components whose ranks each own devices even on CPU cores (data-parallel trainer ranks).
OWNING_COMPONENTS = frozenset({"trainer"})


@dataclass(frozen=True)
class Machine:
    """The devices the planner sees, where each one is and what it is called there.

    ``resources.devices[i]`` is on node ``nodes[i]`` (a Ray node id; None: the local machine) and
    is CPU core or CUDA ordinal ``local[i]`` of that node."""

    resources: Resources
    nodes: tuple[str | None, ...]
    local: tuple[int, ...]

    def __post_init__(self) -> None:
        if not len(self.nodes) == len(self.local) == len(self.resources):
            raise ValueError("Machine: one node and one local index per device")

    @classmethod
    def local_cpus(cls, num_cpus: int | None = None) -> Machine:
        """This machine's CPU cores (``num_cpus`` of them; default: the cores this process may use)."""
        cores = num_cpus or len(os.sched_getaffinity(0))
        total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        return cls(Resources.cpu_cores(cores, total_gib / cores), (None,) * cores, tuple(range(cores)))

    @classmethod
    def of_nodes(cls, nodes: Sequence[NodeSpec]) -> Machine:
        """Every node's GPUs and CPU cores, node by node (a plan's contiguous blocks of devices
        then tend to stay on one node)."""
        devices: list[Device] = []
        where: list[str | None] = []
        local: list[int] = []
        for node in nodes:
            tag = node.name
            for i in range(node.gpus):
                devices.append(Device(f"{tag}/gpu{i}", "gpu", node.gpu_memory_gib))
                where.append(node.node_id)
                local.append(i)
            for i in range(node.cpus):
                devices.append(Device(f"{tag}/cpu{i}", "cpu", node.cpu_memory_gib))
                where.append(node.node_id)
                local.append(i)
        return cls(Resources(tuple(devices)), tuple(where), tuple(local))

    @classmethod
    def of_resources(cls, resources: Resources) -> Machine:
        """Planner devices all on this machine: the i-th GPU is CUDA ordinal i, the i-th CPU
        device core i."""
        seen: dict[str, int] = {}
        local = []
        for d in resources.devices:
            local.append(seen.get(d.kind, 0))
            seen[d.kind] = local[-1] + 1
        return cls(resources, (None,) * len(resources), tuple(local))

    @property
    def multi_node(self) -> bool:
        return len(set(self.nodes)) > 1

    def kind(self, index: int) -> str:
        return self.resources.devices[index].kind


@dataclass(frozen=True)
class NodeSpec:
    """One node of a cluster as :meth:`Machine.of_nodes` takes it."""

    node_id: str | None
    name: str
    cpus: int
    gpus: int = 0
    cpu_memory_gib: float = 1.0
    """Memory a component may use per core."""
    gpu_memory_gib: float = 80.0


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs.

    node:     Ray node id to schedule the rank on (None: wherever Ray puts it; one machine).
    cores:    CPU cores of that node to pin the rank to (None: not pinned).
    gpus:     CUDA ordinals of that node the rank sees (None: Ray assigns them, or none).
    num_gpus: the share of GPUs the rank reserves from Ray.
    """

    node: str | None = None
    cores: tuple[int, ...] | None = None
    gpus: tuple[int, ...] | None = None
    num_gpus: float = 0.0

    @property
    def cuda_visible_devices(self) -> str | None:
        """The rank's ``CUDA_VISIBLE_DEVICES`` (None: not set by the layout)."""
        return None if self.gpus is None else ",".join(str(g) for g in self.gpus)

    def env_vars(self) -> dict[str, str]:
        """Environment the rank starts with for its devices."""
        if self.gpus is None:
            return {}
        return {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices or "", RAY_NOSET_CUDA: "1"}


@dataclass(frozen=True)
class Layout:
    """A plan as the runtime executes it: each component's ranks with their devices, its chunks
    and offloads."""

    plan: Plan
    ranks: dict[str, tuple[RankPlacement, ...]]

    @property
    def num_chunks(self) -> int:
        return self.plan.num_chunks

    def ranks_of(self, component: str) -> tuple[RankPlacement, ...]:
        return self.ranks[component]

    def cores_of(self, component: str) -> tuple[int, ...]:
        """Every core the component's ranks are pinned to (all of them when not pinned is not
        known here: empty)."""
        return tuple(sorted({c for r in self.ranks[component] for c in (r.cores or ())}))

    def offloads(self, component: str) -> bool:
        return component in self.plan.offload

    def to_dict(self) -> dict[str, Any]:
        return {name: [{"node": r.node, "cores": None if r.cores is None else list(r.cores),
                        "gpus": None if r.gpus is None else list(r.gpus), "num_gpus": r.num_gpus} for r in ranks]
                for name, ranks in self.ranks.items()}

    @classmethod
    def of(cls, plan: Plan, machine: Machine | Resources, ranks: Mapping[str, int] | None = None) -> Layout:
        """The devices of every rank of every component of ``plan`` on ``machine`` (planner
        ``Resources``: all on this machine; ``ranks``: ranks per component, default 1)."""
        if isinstance(machine, Resources):
            machine = Machine.of_resources(machine)
        counts = {name: int((ranks or {}).get(name, 1)) for name in plan.placement}
        for name, devices in plan.placement.items():
            bad = [d for d in devices if not 0 <= d < len(machine.resources)]
            if bad:
                raise ValueError(f"plan places {name!r} on device(s) {bad}, the machine has {len(machine.resources)}")
        blocks = {name: _stream_blocks(plan, name, machine) if _per_stream(plan, name, counts[name])
                  else _blocks(devices, counts[name], machine, owning=name in OWNING_COMPONENTS)
                  for name, devices in plan.placement.items()}
        sharing: dict[int, int] = {}  # GPU device -> ranks placed on it
        for per_rank in blocks.values():
            for block in per_rank:
                for d in block:
                    if machine.kind(d) == "gpu":
                        sharing[d] = sharing.get(d, 0) + 1
        out = {name: tuple(_placement(block, machine, sharing) for block in per_rank) for name, per_rank in blocks.items()}
        return cls(plan, out)

    @classmethod
    def unplanned(cls, components: tuple[str, ...], num_cores: int, chunks: int,
                  ranks: Mapping[str, int] | None = None) -> Layout:
        """No profile: every component on every core (not pinned), ``chunks`` chunks."""
        everything = tuple(range(num_cores))
        placement = {c: everything for c in components}
        plan = Plan("colocated", placement, chunks, None, (), math.nan)
        return cls(plan, {c: (RankPlacement(),) * int((ranks or {}).get(c, 1)) for c in components})


def _per_stream(plan: Plan, name: str, count: int) -> bool:
    """Whether ``name`` runs one rank per stream of a ``streams`` plan (env and rollout)."""
    return plan.mode == STREAMS and name not in OWNING_COMPONENTS and count == plan.lanes


def _stream_blocks(plan: Plan, name: str, machine: Machine) -> list[tuple[int, ...]]:
    """Rank s of a per-stream component: stream s's devices, all on one node."""
    blocks = list(plan.stream_devices(name))
    split = [b for b in blocks if len({machine.nodes[d] for d in b}) > 1]
    if split:
        raise ValueError(f"a {STREAMS} plan's stream spans nodes ({split[0]}): a stream's ranks share one node's cores")
    return blocks


def _blocks(devices: tuple[int, ...], count: int, machine: Machine, owning: bool) -> list[tuple[int, ...]]:
    """The device indices of each of ``count`` ranks on ``devices`` (see the module docstring)."""
    by_node: dict[str | None, list[int]] = {}
    for d in devices:
        by_node.setdefault(machine.nodes[d], []).append(d)
    gpus_only = all(machine.kind(d) == "gpu" for d in devices)
    if owning or gpus_only:
        if count > len(devices):  # more ranks than devices: they share them round-robin
            return [(devices[i % len(devices)],) for i in range(count)]
        ordered = [d for group in by_node.values() for d in group]
        out = []
        for part in split_devices(tuple(ordered), count):
            node = machine.nodes[part[0]]
            out.append(tuple(d for d in part if machine.nodes[d] == node))  # a rank runs on one node
        return out
    groups = list(by_node.values())  # ranks spread over the nodes, sharing their node's devices
    return [tuple(groups[i * len(groups) // count]) for i in range(count)]


def _placement(block: tuple[int, ...], machine: Machine, sharing: Mapping[int, int]) -> RankPlacement:
    node = machine.nodes[block[0]]
    cores = tuple(machine.local[d] for d in block if machine.kind(d) == "cpu")
    gpu_devices = [d for d in block if machine.kind(d) == "gpu"]
    gpus = tuple(machine.local[d] for d in gpu_devices)
    num_gpus = sum(1.0 / sharing[d] for d in gpu_devices)
    if num_gpus > 1:
        num_gpus = float(math.floor(num_gpus + 1e-9))  # Ray takes whole GPUs beyond one
    return RankPlacement(node=node, cores=cores or None, gpus=gpus or None, num_gpus=round(num_gpus, 6))
