"""Small helpers for strict ``from_dict`` parsing: a wrong key is an error that names it."""

from __future__ import annotations

from collections.abc import Iterable


def check_keys(what: str, data: object, allowed: Iterable[str], required: Iterable[str] = ()) -> None:
    """Raise ValueError if ``data`` is not a dict, has keys outside ``allowed`` or lacks ``required``."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(data).__name__}")
    allowed = set(allowed)
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(set(required) - set(data))
    if missing:
        raise ValueError(f"{what}: missing key(s) {missing}")
