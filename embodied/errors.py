"""Errors that reach the user.

A :class:`UserError` is a mistake in what the user asked for (a wrong config key, an unknown
recipe, a missing checkpoint). The CLI prints its message as one paragraph and exits with code 2,
without a traceback. Everything else is a bug or a crash and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A problem with the user's input; printed without a traceback, exit code 2."""


class ConfigError(UserError):
    """A config key, value or recipe the schema does not accept."""


def closest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The up to ``n`` candidates closest to ``name`` (for "did you mean" hints)."""
    candidates = list(candidates)
    found = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    if not found:
        # Fall back to candidates sharing the last dotted component or a prefix.
        tail = name.rsplit(".", 1)[-1]
        found = [c for c in candidates if c.rsplit(".", 1)[-1] == tail or c.startswith(name)][:n]
    return found


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ' Did you mean ...?' sentence, or '' when nothing is close."""
    found = closest(name, candidates)
    if not found:
        return ""
    return " Did you mean " + " or ".join(repr(f) for f in found) + "?"
