from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from embodied.config import apply_overrides, build_config, field_docs, parse_override, to_dict
from embodied.errors import ConfigError


@dataclass
class Inner:
    lr: float = 1e-3
    """Learning rate."""
    sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden sizes."""
    mode: Literal["a", "b"] = "a"
    """A choice."""


@dataclass
class Outer:
    name: str = "x"
    seed: int = 0
    flag: bool = False
    maybe: int | None = None
    kwargs: dict = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


def test_overrides_parse_yaml_values_and_nest():
    cfg = apply_overrides(Outer, {"name": "r"}, ["inner.lr=3e-4", "seed=7", "flag=true", "inner.sizes=[8, 16]", "maybe=null", "kwargs.control_mode=pd_joint_delta_pos"])
    assert cfg.inner.lr == pytest.approx(3e-4) and isinstance(cfg.inner.lr, float)
    assert cfg.seed == 7 and cfg.flag is True and cfg.inner.sizes == [8, 16] and cfg.maybe is None
    assert cfg.kwargs == {"control_mode": "pd_joint_delta_pos"}
    assert cfg.name == "r"


def test_unknown_key_names_closest():
    with pytest.raises(ConfigError) as err:
        apply_overrides(Outer, {}, ["inner.lrr=1"])
    msg = str(err.value)
    assert "'inner.lrr'" in msg and "'inner.lr'" in msg


def test_unknown_top_level_key_in_recipe():
    with pytest.raises(ConfigError, match="Unknown config key 'sed'.*'seed'"):
        build_config(Outer, {"sed": 1})


@pytest.mark.parametrize(
    "override, needle",
    [
        ("seed=abc", "Config key 'seed' expects int, got 'abc'"),
        ("flag=3", "Config key 'flag' expects bool, got 3"),
        ("inner.sizes=5", "Config key 'inner.sizes' expects list[int], got 5"),
        ("inner.mode=c", "must be one of 'a', 'b'; got 'c'"),
        ("inner=3", "Config key 'inner' expects Inner"),
    ],
)
def test_wrong_type_names_key_value_and_type(override, needle):
    with pytest.raises(ConfigError) as err:
        apply_overrides(Outer, {}, [override])
    assert needle in str(err.value)


def test_int_accepted_for_float_and_float_for_str():
    cfg = apply_overrides(Outer, {}, ["inner.lr=1", "name=2024"])
    assert cfg.inner.lr == 1.0 and cfg.name == "2024"


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("seed")


def test_to_dict_round_trip():
    cfg = apply_overrides(Outer, {}, ["inner.lr=0.5"])
    assert build_config(Outer, to_dict(cfg)) == cfg


def test_field_docs_are_read_from_the_source():
    assert field_docs(Inner)["lr"] == "Learning rate."
