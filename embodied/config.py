"""Typed config: dataclasses are the schema; YAML recipes and dotted ``key=value`` overrides on top.

* :func:`build_config` turns nested dicts (a YAML recipe) into dataclass instances, checking every
  key and type. A wrong key names the closest valid ones; a wrong type names the key, the value and
  the expected type. Both raise :class:`~embodied.errors.ConfigError` (exit code 2 in the CLI).
* :func:`apply_overrides` applies ``a.b.c=value`` strings (values parsed as YAML).
* :func:`to_dict` / :func:`save_yaml` write the fully resolved config that every run keeps.
* :func:`field_docs` reads the docstring under each dataclass field (``embodied config`` and
  docs/config.md are generated from them, see ``pipelines.config_reference``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from pathlib import Path
from collections.abc import Callable
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from embodied.errors import ConfigError, did_you_mean, did_you_mean_key

C = TypeVar("C")


def type_name(tp: Any) -> str:
    """A readable name of a config field's type (``float | null``, ``'auto' | 'bar'``, ``list[int]``)."""
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(type_name(a) for a in get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently convert) ``value`` against type ``tp``; ConfigError when it does not fit."""

    def fail() -> ConfigError:
        return ConfigError(
            f"Config key {key!r} expects {type_name(tp)}, got {value!r} ({type(value).__name__})."
        )

    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise fail()
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise fail()
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(
            f"Config key {key!r} must be one of {', '.join(repr(a) for a in get_args(tp))}; got {value!r}."
            + did_you_mean(str(value), [str(a) for a in get_args(tp)])
        )
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise fail()
        return build_config(tp, value, prefix=key)
    if origin in (list, tuple, typing.Sequence):
        if not isinstance(value, (list, tuple)):
            raise fail()
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise fail()
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise fail()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return float(value)
            except ValueError:
                raise fail() from None
        raise fail()
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise fail()
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise fail()


def all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a config dataclass (nested dataclasses expanded)."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        full = f"{prefix}{f.name}"
        keys.append(full)
        if dataclasses.is_dataclass(tp):
            keys.extend(all_keys(tp, full + "."))
    return keys


def _unknown_key(cls: type, name: str, prefix: str, root: type | None) -> ConfigError:
    full = f"{prefix}.{name}" if prefix else name
    valid_here = [f.name for f in dataclasses.fields(cls)]
    candidates = all_keys(root) if root is not None else valid_here
    hint = did_you_mean_key(full, candidates) or did_you_mean_key(name, valid_here)
    where = f" under {prefix!r}" if prefix else ""
    return ConfigError(f"Unknown config key {full!r}.{hint} Valid keys{where}: {', '.join(valid_here)}.")


Alias = tuple[str, Callable[[Any], Any] | None]
"""An alternative key of a config field: ``(canonical field name, value transform or None)``."""


def aliases_of(cls: type) -> dict[str, Alias]:
    """The ``ALIASES`` a config dataclass declares (a class attribute ``{alias: (field, transform)}``):
    other frameworks' names for its keys, rewritten to the canonical ones before validation."""
    return dict(getattr(cls, "ALIASES", {}) or {})


def _resolve_aliases(cls: type, data: dict[str, Any], prefix: str) -> dict[str, Any]:
    aliases = aliases_of(cls)
    if not aliases:
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in aliases:
            out.setdefault(key, value)
            continue
        canonical, transform = aliases[key]
        full_alias = f"{prefix}.{key}" if prefix else key
        full = f"{prefix}.{canonical}" if prefix else canonical
        if canonical in data:
            raise ConfigError(f"Config keys {full_alias!r} and {full!r} are the same setting; give only {full!r}.")
        try:
            out[canonical] = transform(value) if transform is not None else value
        except (KeyError, ValueError, TypeError) as err:
            raise ConfigError(f"Config key {full_alias!r} (an alias of {full!r}): {err}") from None
    return out


def build_config(cls: type[C], data: dict[str, Any] | None = None, prefix: str = "", root: type | None = None) -> C:
    """Instantiate dataclass ``cls`` from a nested dict, validating keys and types (aliases the class
    declares in ``ALIASES`` are accepted and rewritten to their canonical keys)."""
    data = _resolve_aliases(cls, dict(data or {}), prefix)
    root = root or cls
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise _unknown_key(cls, key, prefix, root)
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            full = f"{prefix}.{f.name}" if prefix else f.name
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp) and isinstance(data[f.name], dict):
                kwargs[f.name] = build_config(tp, data[f.name], prefix=full, root=root)
            else:
                kwargs[f.name] = _coerce(data[f.name], tp, full)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"Invalid config{' for ' + prefix if prefix else ''}: {err}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict of a config dataclass (tuples become lists)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(cfg)


def parse_override(text: str) -> tuple[str, Any]:
    """``"algo.lr=3e-4"`` -> ``("algo.lr", 3e-4)`` (the value is parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"Override {text!r} is not of the form key=value (for example algo.lr=3e-4).")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"Override {text!r} has an empty key.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for key ``a.b.c``, creating nested dicts."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[parts[-1]] = value


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of ``top`` into a copy of ``base`` (dicts merge, everything else replaces)."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def apply_overrides(cls: type[C], data: dict[str, Any], overrides: list[str]) -> C:
    """Build ``cls`` from ``data`` with dotted overrides applied on top."""
    data = dict(data)
    for text in overrides:
        key, value = parse_override(text)
        data = merge(data, _nest(key, value))
    return build_config(cls, data)


def _nest(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    set_dotted(out, key, value)
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file {str(path)!r} does not exist.")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys, not {type(data).__name__}.")
    return data


def save_yaml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def field_docs(cls: type) -> dict[str, str]:
    """The string literal under each field of a dataclass (attribute docstrings), by field name,
    including fields inherited from dataclass bases (a subclass's doc wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
