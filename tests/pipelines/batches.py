"""Test helper: two TrajectoryBatches hold the same data, field by field."""

from __future__ import annotations

import dataclasses

import numpy as np

from embodied.rl import TrajectoryBatch


def assert_same_batch(a: TrajectoryBatch, b: TrajectoryBatch) -> None:
    """Every field of ``a`` equals ``b``'s exactly (dicts of arrays key by key); the message names the field."""
    for f in dataclasses.fields(TrajectoryBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x), f.name
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y), f.name
        else:
            assert x == y, f.name
