"""A scripted expert of Reach1D (tests/pipelines/reach_env.py): full speed towards the target."""

from __future__ import annotations

import numpy as np


def expert(obs: dict) -> np.ndarray:
    state = np.asarray(obs["state"], dtype=np.float32)  # (N, 2): position, target
    return np.clip((state[:, 1:2] - state[:, 0:1]) / 0.1, -1.0, 1.0)
