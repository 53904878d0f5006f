"""Cost of one call of a component as a function of its batch size and device count.

The model is Amdahl-shaped::

    time_s(batch, n_devices) = fixed_s + per_item_s * batch / n_devices ** scaling_exponent

* ``fixed_s``: per-call overhead that does not shrink with the batch (Python and launch overhead,
  synchronisation, a decode loop's per-token latency, rendering a frame).
* ``per_item_s``: throughput-bound work per item (env, sample, token batch row) on one device.
* ``scaling_exponent`` in [0, 1]: how that work divides over devices of one worker group
  (1 = perfect data parallelism, 0 = extra devices do not help).

Chunking a batch into k micro-chunks pays ``fixed_s`` k times, so the planner only pipelines when
the overlap it buys is worth more than that. A GPU that is not saturated at small batches shows up
as a large ``fixed_s`` and a small ``per_item_s``, which is the right direction for that trade-off.

:func:`fit_cost_model` fits the three numbers to probe measurements by least squares on the
*relative* error (probe times span orders of magnitude; the small-batch probes matter most for
chunking and would be drowned by the large ones in plain least squares).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler._json import check_keys

# Exponent search: a grid, then golden-section refinement around the best grid point.
_GRID_STEPS = 100
_GOLDEN_TOLERANCE = 1e-12


@dataclass(frozen=True)
class CostModel:
    """Seconds one call takes: ``fixed_s + per_item_s * batch / n_devices ** scaling_exponent``."""

    fixed_s: float = 0.0
    """Per-call overhead in seconds, independent of batch size and device count."""
    per_item_s: float = 0.0
    """Seconds per batch item on one device."""
    scaling_exponent: float = 1.0
    """Parallel efficiency over devices in [0, 1]; 1 means n devices are n times faster."""

    def __post_init__(self) -> None:
        if not (self.fixed_s >= 0 and self.per_item_s >= 0):
            raise ValueError(f"CostModel needs fixed_s >= 0 and per_item_s >= 0, got {self}")
        if not 0.0 <= self.scaling_exponent <= 1.0:
            raise ValueError(f"CostModel.scaling_exponent must lie in [0, 1], got {self.scaling_exponent}")

    def time_s(self, batch: int, n_devices: int = 1) -> float:
        """Seconds for one call on ``batch`` items spread over ``n_devices`` devices (0 for batch 0)."""
        if batch < 0 or n_devices < 1:
            raise ValueError(f"time_s needs batch >= 0 and n_devices >= 1, got {batch}, {n_devices}")
        if batch == 0:
            return 0.0
        return self.fixed_s + self.per_item_s * batch / n_devices**self.scaling_exponent

    def to_dict(self) -> dict[str, float]:
        return {"fixed_s": self.fixed_s, "per_item_s": self.per_item_s, "scaling_exponent": self.scaling_exponent}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> CostModel:
        check_keys("CostModel", data, {"fixed_s", "per_item_s", "scaling_exponent"})
        return cls(**{k: float(v) for k, v in data.items()})


def fit_cost_model(
    samples: Sequence[tuple[int, int, float]], scaling_exponent: float | None = None
) -> CostModel:
    """Fit a :class:`CostModel` to probes ``(batch, n_devices, seconds)``; pure and deterministic.

    ``scaling_exponent`` given (known from how the component runs, e.g. 0.0 for a simulator that steps
    in one process) fixes the exponent and fits only ``fixed_s`` and ``per_item_s``.

    Minimises the sum of squared relative errors with ``fixed_s, per_item_s >= 0`` and the exponent
    in [0, 1]. Degenerate probe sets get documented defaults instead of an error:

    * all probes on one device count: the exponent cannot be identified and is set to 1.0;
    * all probes at one ``batch / n_devices ** exponent``: fixed and per-item cost cannot be told
      apart and everything is attributed to ``per_item_s`` (the optimistic choice for chunking;
      probe at two batch sizes to avoid it).
    """
    if not samples:
        raise ValueError("fit_cost_model needs at least one (batch, n_devices, seconds) sample")
    for batch, n_devices, seconds in samples:
        if batch < 1 or n_devices < 1 or not seconds >= 0 or math.isinf(seconds):
            raise ValueError(
                f"bad probe (batch={batch}, n_devices={n_devices}, seconds={seconds}): "
                "need batch >= 1, n_devices >= 1 and finite seconds >= 0"
            )
    if scaling_exponent is not None:
        if not 0.0 <= scaling_exponent <= 1.0:
            raise ValueError(f"scaling_exponent must lie in [0, 1], got {scaling_exponent}")
        fixed_s, per_item_s, _ = _fit_linear(samples, scaling_exponent)
        return CostModel(fixed_s, per_item_s, scaling_exponent)
    if len({n for _, n, _ in samples}) == 1:
        fixed_s, per_item_s, _ = _fit_linear(samples, 1.0)
        return CostModel(fixed_s, per_item_s, 1.0)

    def loss(exponent: float) -> float:
        return _fit_linear(samples, exponent)[2]

    grid = [i / _GRID_STEPS for i in range(_GRID_STEPS + 1)]
    best = min(grid, key=lambda a: (loss(a), a))
    lo, hi = max(0.0, best - 1 / _GRID_STEPS), min(1.0, best + 1 / _GRID_STEPS)
    refined = _golden_section_min(loss, lo, hi)
    exponent = refined if loss(refined) <= loss(best) else best
    fixed_s, per_item_s, _ = _fit_linear(samples, exponent)
    return CostModel(fixed_s, per_item_s, exponent)


def _fit_linear(samples: Sequence[tuple[int, int, float]], exponent: float) -> tuple[float, float, float]:
    """Weighted non-negative least squares of ``seconds ~ fixed + per_item * x`` for one exponent.

    ``x = batch / n ** exponent``, weights ``1 / seconds ** 2`` (relative error). Returns
    ``(fixed_s, per_item_s, weighted squared error)``.
    """
    xs = [b / n**exponent for b, n, _ in samples]
    ys = [s for _, _, s in samples]
    # A probe that took 0 s has no relative error scale; weight it like a 1 ms probe.
    ws = [1.0 / max(y, 1e-3) ** 2 for y in ys]
    sw = sum(ws)
    mean_x = sum(w * x for w, x in zip(ws, xs)) / sw
    mean_y = sum(w * y for w, y in zip(ws, ys)) / sw
    var_x = sum(w * (x - mean_x) ** 2 for w, x in zip(ws, xs))
    if var_x <= 1e-12 * max(1.0, mean_x**2) * sw:
        fixed, per_item = (0.0, mean_y / mean_x) if mean_x > 0 else (mean_y, 0.0)
    else:
        per_item = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(ws, xs, ys)) / var_x
        fixed = mean_y - per_item * mean_x
        if fixed < 0:  # clamp to the boundary: a line through the origin
            fixed = 0.0
            per_item = sum(w * x * y for w, x, y in zip(ws, xs, ys)) / sum(w * x * x for w, x in zip(ws, xs))
        elif per_item < 0:  # time does not grow with the batch: a constant
            fixed, per_item = mean_y, 0.0
    error = sum(w * (fixed + per_item * x - y) ** 2 for w, x, y in zip(ws, xs, ys))
    return fixed, per_item, error


def _golden_section_min(f, lo: float, hi: float) -> float:
    """Argmin of a unimodal ``f`` on ``[lo, hi]`` by golden-section search."""
    inv_phi = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
    fc, fd = f(c), f(d)
    while b - a > _GOLDEN_TOLERANCE:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - inv_phi * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + inv_phi * (b - a)
            fd = f(d)
    return (a + b) / 2
