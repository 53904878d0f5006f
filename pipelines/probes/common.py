"""What the probes share: the thread-scaling rule of their fits (:func:`fit_threads`) and the
batch sizes they probe."""

from __future__ import annotations

import math

from embodied.profiler import Probe
from scheduler import CostModel, fit_cost_model


MIB = 2**20
MIN_THREAD_SCALING = 0.3
"""Fitted parallel efficiency below which a worker's extra cores get no torch threads (more threads
only spin and contend for small models). The probes' fits follow the same rule
(:func:`fit_threads`), so a component priced as one thread runs as one."""


def _probe_sizes(n: int) -> list[int]:
    return sorted({n, max(1, math.ceil(n / 2)), max(1, math.ceil(n / 4))})


def fit_threads(probe: Probe, one_thread_devices: int = 1) -> CostModel:
    """The cost of a component probed at several thread counts, as the worker will run it: the
    fit over all samples when extra threads pay off (fitted exponent >= MIN_THREAD_SCALING, then
    the worker runs a thread per core), else the fit of the one-thread samples (``n_devices ==
    one_thread_devices``) with exponent 0: the worker runs one thread whatever cores it gets, and
    slower many-thread probes (threads that spin and contend) must not price it."""
    cost = probe.fit()
    single = [s for s in probe.samples if s[1] == one_thread_devices]
    if cost.scaling_exponent >= MIN_THREAD_SCALING or not single:
        return cost
    return fit_cost_model(single, 0.0)
