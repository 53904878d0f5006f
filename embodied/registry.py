"""A small typed registry: the one way to plug in envs, policies, algorithms and recipes.

Instead of if/elif chains on type strings, each family of components keeps a :class:`Registry`.
Components register themselves with a decorator; lookups of unknown names raise a
:class:`~embodied.errors.UserError` that lists the closest registered names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from embodied.errors import UserError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to components (classes or factories) of one kind, e.g. ``"policy"``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._docs: dict[str, str] = {}

    def register(self, name: str, doc: str | None = None) -> Callable[[T], T]:
        """Decorator: ``@POLICIES.register("mlp")`` above a class or factory function."""

        def decorator(obj: T) -> T:
            self.add(name, obj, doc)
            return obj

        return decorator

    def add(self, name: str, obj: T, doc: str | None = None) -> None:
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = obj
        text = doc if doc is not None else (getattr(obj, "__doc__", None) or "")
        self._docs[name] = text.strip().splitlines()[0] if text.strip() else ""

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return its component (unknown names raise like :meth:`get`).

        For components registered for a while, e.g. by a test: ``try: ... finally: REG.remove(name)``.
        """
        obj = self.get(name)
        del self._entries[name]
        del self._docs[name]
        return obj

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UserError(
                f"Unknown {self.kind} {name!r}.{did_you_mean(name, self._entries)} "
                f"Registered {self.kind}s: {known}."
            ) from None

    def doc(self, name: str) -> str:
        """The first line of the component's docstring (or the doc given at registration)."""
        self.get(name)
        return self._docs[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)
