"""Candidate placements per mode (a registry, :data:`PLACEMENT_MODES`).

Devices of one :class:`~scheduler.resources.DeviceClass` (same kind and memory) are
interchangeable, so a placement is enumerated by how many devices of a class each component gets;
the devices are handed out as contiguous index blocks in flow order. All devices of a class that
some component uses are used: in this model more devices never make a component slower (the
scaling exponent is >= 0) nor need more memory per device, so leaving one idle never helps.

* ``colocated``: every component on all devices of its class; components take turns.
* ``disaggregated``: the trainer components (the workflow's ``hybrid_shared``) on devices of their own;
  the others on pairwise disjoint device sets, or together on one set where they take turns (the
  generation side on its devices, training on others: what lets training overlap the next collection).
* ``hybrid``: the workflow's ``hybrid_shared`` components (the trainer) on all devices of their
  class; the others on pairwise disjoint sets that the shared ones overlap.
* ``shared``: the workflow's ``pool`` components (env and rollout) together on all CPU cores of a
  class, not pinned: their workers (one thread each, the rollout in ``Plan.lanes`` workers) share
  the pool's cores (processor sharing, :mod:`scheduler.simulate`); the other components on all
  devices of their class. Its placement looks like ``colocated``; the search keeps it apart.
* ``streams``: the placement of ``shared``, run another way: the pool's cores cut into
  ``Plan.lanes`` streams, each holding one pinned rank of every pool component (env and rollout
  taking turns on the stream's chunk). Per-core collection pipelines with no idle core while the
  other side works, at the price of more, smaller calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import product

from scheduler.profile import Profile
from scheduler.resources import DeviceClass, Resources
from scheduler.flows import FlowKind

Placement = dict[str, tuple[int, ...]]


def eligible_classes(component: str, profile: Profile, resources: Resources) -> list[DeviceClass]:
    """Device classes of the kind the component's profile asks for (all classes if it asks none)."""
    kind = profile[component].device_kind
    return [c for c in resources.classes() if kind is None or c.kind == kind]


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """All ways to write ``total`` as an ordered sum of ``parts`` positive ints, lexicographic."""
    if parts == 1:
        if total >= 1:
            yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in compositions(total - first, parts - 1):
            yield (first, *rest)


def _disjoint(components: tuple[str, ...], profile: Profile, resources: Resources) -> Iterator[Placement]:
    """Placements of ``components`` on pairwise disjoint devices, using every device of a used class."""
    yield from _disjoint_groups(tuple((c,) for c in components), profile, resources)


def _disjoint_groups(
    groups: tuple[tuple[str, ...], ...], profile: Profile, resources: Resources
) -> Iterator[Placement]:
    """Placements where each group of components gets its own devices (pairwise disjoint between
    groups, shared within a group), using every device of a used class."""

    def eligible(group: tuple[str, ...]) -> list[DeviceClass]:
        return [c for c in eligible_classes(group[0], profile, resources)
                if all(c in eligible_classes(m, profile, resources) for m in group[1:])]

    for classes in product(*(eligible(g) for g in groups)):
        by_class: dict[DeviceClass, list[tuple[str, ...]]] = {}
        for group, cls in zip(groups, classes):
            by_class.setdefault(cls, []).append(group)
        per_class = [
            [(cls, members, counts) for counts in compositions(len(cls.indices), len(members))]
            for cls, members in by_class.items()
        ]
        for choice in product(*per_class):
            placement: Placement = {}
            for cls, members, counts in choice:
                start = 0
                for group, count in zip(members, counts):
                    for component in group:
                        placement[component] = cls.indices[start : start + count]
                    start += count
            yield {c: placement[c] for g in groups for c in g}


def colocated(spec: FlowKind, profile: Profile, resources: Resources) -> Iterator[Placement]:
    for classes in product(*(eligible_classes(c, profile, resources) for c in spec.components)):
        yield {c: cls.indices for c, cls in zip(spec.components, classes)}


def disaggregated(spec: FlowKind, profile: Profile, resources: Resources) -> Iterator[Placement]:
    yield from _disjoint(spec.components, profile, resources)
    trainers = tuple(c for c in spec.components if c in spec.hybrid_shared)
    others = tuple(c for c in spec.components if c not in spec.hybrid_shared)
    if trainers and len(others) > 1:  # the generation side together, each trainer on its own devices
        for placement in _disjoint_groups((others, *((t,) for t in trainers)), profile, resources):
            yield {c: placement[c] for c in spec.components}


def hybrid(spec: FlowKind, profile: Profile, resources: Resources) -> Iterator[Placement]:
    shared = tuple(c for c in spec.components if c in spec.hybrid_shared)
    others = tuple(c for c in spec.components if c not in spec.hybrid_shared)
    for shared_classes in product(*(eligible_classes(c, profile, resources) for c in shared)):
        for partial in _disjoint(others, profile, resources):
            placement = {**partial, **{c: cls.indices for c, cls in zip(shared, shared_classes)}}
            yield {c: placement[c] for c in spec.components}


def shared(spec: FlowKind, profile: Profile, resources: Resources) -> Iterator[Placement]:
    pool = spec.pool
    if not pool:
        return
    rest = tuple(c for c in spec.components if c not in pool)
    pools = [c for c in eligible_classes(pool[0], profile, resources)
             if c.kind == "cpu" and len(c.indices) > 1 and all(c in eligible_classes(m, profile, resources) for m in pool[1:])]
    for pool_class in pools:
        for rest_classes in product(*(eligible_classes(c, profile, resources) for c in rest)):
            placement = {**{c: pool_class.indices for c in pool}, **{c: k.indices for c, k in zip(rest, rest_classes)}}
            yield {c: placement[c] for c in spec.components}


PLACEMENT_MODES: dict[str, Callable[[FlowKind, Profile, Resources], Iterator[Placement]]] = {
    "colocated": colocated,
    "disaggregated": disaggregated,
    "hybrid": hybrid,
    "shared": shared,
    "streams": shared,  # the same pool placement; the plan's lanes cut it into streams
}
"""Mode -> enumerator of its placements; keys in the order of :data:`scheduler.plans.MODES`."""
