"""The registry: registration, lookup with a did-you-mean, docs, and removal."""

from __future__ import annotations

import pytest

from embodied.errors import UserError
from embodied.registry import Registry


def make_registry() -> Registry:
    reg: Registry = Registry("widget")

    @reg.register("round")
    def round_widget() -> str:
        """A round widget.

        More text that doc() leaves out."""
        return "round"

    reg.add("square", lambda: "square", doc="A square widget.")
    return reg


def test_register_get_and_doc() -> None:
    reg = make_registry()
    assert reg.names() == list(reg) == ["round", "square"]
    assert reg.get("round")() == "round" and "square" in reg
    assert reg.doc("round") == "A round widget." and reg.doc("square") == "A square widget."
    with pytest.raises(ValueError, match="widget 'round' is registered twice"):
        reg.add("round", lambda: "other")
    with pytest.raises(UserError, match=r"Unknown widget 'rond'\. Did you mean 'round'\?.*Registered widgets: round, square"):
        reg.get("rond")


def test_remove_unregisters_and_frees_the_name() -> None:
    reg = make_registry()
    square = reg.get("square")
    assert reg.remove("square") is square
    assert "square" not in reg and reg.names() == ["round"]
    with pytest.raises(UserError, match="Unknown widget 'square'"):
        reg.doc("square")
    reg.add("square", lambda: "new square")  # the name is free again, doc from nothing is empty
    assert reg.get("square")() == "new square" and reg.doc("square") == ""
    with pytest.raises(UserError, match=r"Unknown widget 'cube'.*Registered widgets: round, square"):
        reg.remove("cube")
