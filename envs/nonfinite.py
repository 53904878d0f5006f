"""NaN and inf in what an env returns: a cheap check on the whole batch, and what went wrong where.

Every backend checks the arrays of each step once (``np.isfinite(array).all()`` per array: a few
microseconds per step, no Python per element); only when that finds something does
:func:`bad_rows` work out which envs and what, to name them in the error or to drop their
episodes (``env.nonfinite``, see :class:`~envs.config.EnvConfig`).

``info["nonfinite"]`` (N,) bool marks the envs whose episode a ``drop`` ended in that step; a
step without any carries no such key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

#: ``env.nonfinite`` values.
NONFINITE_MODES = ("error", "drop")
#: Info key of the (N,) bool mask of envs whose episode was dropped in a step.
NONFINITE_INFO_KEY = "nonfinite"


def check_mode(mode: str) -> str:
    if mode not in NONFINITE_MODES:
        raise ValueError(f"env.nonfinite must be one of {', '.join(NONFINITE_MODES)} (got {mode!r})")
    return mode


def is_float(array: np.ndarray) -> bool:
    return array.dtype.kind == "f"


def all_finite(arrays: Iterable[np.ndarray]) -> bool:
    """Whether every float array holds only finite values (integer and byte arrays always do).
    One ufunc call per array, so its cost barely grows with the batch size."""
    for a in arrays:
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return False
    return True


def bad_rows(named: Mapping[str, np.ndarray], num_envs: int) -> tuple[np.ndarray, dict[int, str]]:
    """Which of ``num_envs`` rows hold a NaN or inf, and for each such row what (the first array
    in ``named`` order): ``(mask (N,) bool, {row: "observation 'state' holds NaN"})``.

    ``named`` maps a description (``"observation 'state'"``, ``"reward"``) to an array whose
    first axis is the env (``(N, ...)``) or, flat, ``N * C`` steps of C per env."""
    mask = np.zeros(num_envs, bool)
    what: dict[int, str] = {}
    for name, array in named.items():
        if not is_float(array):
            continue
        finite = np.isfinite(array.reshape(num_envs, -1))
        rows = ~finite.all(1)
        for i in np.flatnonzero(rows & ~mask):
            values = array.reshape(num_envs, -1)[i][~finite[i]]
            kinds = sorted({"NaN" if np.isnan(v) else ("+inf" if v > 0 else "-inf") for v in values})
            what[int(i)] = f"{name} holds {' and '.join(kinds)}"
        mask |= rows
    return mask, what
