"""The config reference, generated from the code: ``embodied config`` and ``docs/config.md``.

Every key's type, default and doc come from the config dataclasses (the string under each field),
and every recipe's values from its YAML, so the reference cannot drift from what the code accepts:

    embodied config cartpole_ppo                 # the recipe's resolved config, every key documented
    embodied config cartpole_ppo algo.lr         # one key: type, default, the recipe's value, doc
    embodied config cartpole_ppo algo.lr=1e-2    # with overrides applied, as `embodied train` would
    embodied config --markdown > docs/config.md  # the whole reference (a test checks it is current)
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass
from typing import Any, get_type_hints

from embodied.config import field_docs, to_dict, type_name
from embodied.errors import UserError, did_you_mean

WRAP = 100


@dataclass(frozen=True)
class KeyDoc:
    """One leaf config key: its dotted name, type, default, value in a config, and doc."""

    key: str
    type: str
    default: Any
    value: Any
    doc: str


@dataclass(frozen=True)
class SectionDoc:
    """A config section (``algo``, ``env``, ...; ``""`` for the top level) and its doc."""

    name: str
    doc: str
    keys: tuple[KeyDoc, ...]


def sections(cfg: Any) -> list[SectionDoc]:
    """The sections of config instance ``cfg`` (top-level keys first), each with its leaf keys."""
    cls = type(cfg)
    defaults = cls()
    top: list[KeyDoc] = []
    out: list[SectionDoc] = []
    hints, docs = get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(_section(tp, f.name, getattr(cfg, f.name), getattr(defaults, f.name)))
        else:
            top.append(KeyDoc(f.name, type_name(tp), _plain(getattr(defaults, f.name)), _plain(getattr(cfg, f.name)), docs.get(f.name, "")))
    return [SectionDoc("", "", tuple(top)), *out]


def _section(cls: type, prefix: str, value: Any, default: Any) -> list[SectionDoc]:
    hints, docs = get_type_hints(cls), field_docs(cls)
    keys: list[KeyDoc] = []
    nested: list[SectionDoc] = []
    for f in dataclasses.fields(cls):
        tp, full = hints[f.name], f"{prefix}.{f.name}"
        if dataclasses.is_dataclass(tp):
            nested.extend(_section(tp, full, getattr(value, f.name), getattr(default, f.name)))
        else:
            keys.append(KeyDoc(full, type_name(tp), _plain(getattr(default, f.name)), _plain(getattr(value, f.name)), docs.get(f.name, "")))
    return [SectionDoc(prefix, _first_paragraph(cls.__doc__), tuple(keys)), *nested]


def _plain(value: Any) -> Any:
    return to_dict(value) if dataclasses.is_dataclass(value) else value


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if value == "" or value.strip() != value else value
    return repr(value) if isinstance(value, (list, dict, tuple)) else f"{value:g}" if isinstance(value, float) else str(value)


def all_key_docs(cfg: Any) -> dict[str, KeyDoc]:
    return {k.key: k for s in sections(cfg) for k in s.keys}


def format_config(recipe: str, cfg: Any) -> str:
    """The resolved config of ``recipe`` for a terminal: every key with its value, type, default
    (when the recipe changes it) and doc, section by section."""
    lines = [f"# {recipe}: {getattr(cfg, 'description', '')}".rstrip(": "),
             "# key = value   [type; default when the recipe or an override changed it]"]
    for section in sections(cfg):
        lines.append("")
        lines.append(f"[{section.name or 'top level'}]" + (f"  {section.doc}" if section.doc else ""))
        for k in section.keys:
            changed = "" if k.value == k.default else f"; default {_show(k.default)}"
            lines.append(f"{k.key} = {_show(k.value)}   [{k.type}{changed}]")
            if k.doc:
                lines.extend(textwrap.wrap(k.doc, WRAP, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines)


def format_key(recipe: str, cfg: Any, key: str) -> str:
    """One key's doc: ``algo.lr (float): ... default ..., recipe value ...``."""
    docs = all_key_docs(cfg)
    if key not in docs:
        section_names = {s.name for s in sections(cfg) if s.name}
        if key in section_names:
            return "\n".join(format_key(recipe, cfg, k) for k in docs if k.startswith(key + "."))
        raise UserError(f"Unknown config key {key!r}.{did_you_mean(key, list(docs) + sorted(section_names))} "
                        f"`embodied config {recipe}` lists every key.")
    k = docs[key]
    head = f"{k.key} ({k.type}): {_show(k.value)} in {recipe}" + ("" if k.value == k.default else f", default {_show(k.default)}")
    return "\n".join([head, *textwrap.wrap(k.doc or "(undocumented)", WRAP, initial_indent="    ", subsequent_indent="    ")])


def render_markdown(recipes: dict[str, Any]) -> str:
    """``docs/config.md``: every key of every schema with type, default and doc, then what each
    recipe sets. ``recipes`` maps recipe names to their resolved configs."""
    by_schema: dict[type, list[str]] = {}
    for name, cfg in recipes.items():
        by_schema.setdefault(type(cfg), []).append(name)
    out = [
        "# Config reference",
        "",
        "Generated from the code by `embodied config --markdown > docs/config.md` (a test fails when this",
        "file is stale). Set any key with `key=value` after the recipe: `embodied train cartpole_ppo algo.lr=1e-3`.",
        "`embodied config RECIPE` prints a recipe's resolved config with these docs, `embodied config RECIPE KEY`",
        "one key.",
    ]
    for schema, names in by_schema.items():
        example = recipes[names[0]]
        out += ["", f"## `{schema.__name__}`: recipes {', '.join(f'`{n}`' for n in sorted(names))}", "",
                _first_paragraph(schema.__doc__)]
        for section in sections(example):
            out += ["", f"### `{section.name}`" if section.name else "### top level", ""]
            if section.doc:
                out += [section.doc, ""]
            out += ["| key | type | default | what it does |", "|---|---|---|---|"]
            for k in section.keys:
                out.append(f"| `{k.key}` | {_md(k.type)} | `{_md(_show(k.default))}` | {_md(k.doc)} |")
        out += ["", "### What each recipe sets", ""]
        for name in sorted(names):
            docs = all_key_docs(recipes[name])
            changed = [k for k in docs.values() if k.value != k.default and k.key != "recipe"]
            out += [f"**`{name}`**: {_md(getattr(recipes[name], 'description', ''))}", ""]
            out += [f"- `{k.key}` = `{_md(_show(k.value))}`" for k in changed if k.key != "description"]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
