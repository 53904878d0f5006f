"""Prompt datasets for reasoning RL: local JSONL, JSON or parquet files in veRL's or TRL's schema.

veRL (one row of ``examples/data_preprocess/gsm8k.py``'s parquet)::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "Natalia sold clips ... after \\"####\\"."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...}}

TRL prompt-only: ``{"prompt": "The sky is"}`` or ``{"prompt": [{"role": "user", "content": ...}]}``
with the answer in another column (``solution``, ``answer``, ``ground_truth``); every other column
travels with the record (``extras``), as TRL passes them to reward functions.

GSM8K's own files (``openai/gsm8k``'s ``main`` JSONL)::

    {"question": "Natalia sold clips ...", "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips ... #### 72"}

``prompt_key: question``, ``answer_keys: [answer]`` (the ``gsm8k`` verifier reads the gold after
``####``), ``default_data_source: openai/gsm8k``; ``prompt_suffix`` adds the answer-format
instruction and ``chat_prompts`` makes the question a user message (recipe ``reasoning_grpo_gsm8k``).

Field names are dotted paths into each row (``reward_model.ground_truth``; a number indexes a list:
``solutions.0``). The answer path is the first of ``answer_keys`` that a row has.

Errors are one :class:`~embodied.errors.UserError` that names the file and the line (JSONL, counted
from 1) or row (parquet and JSON arrays, counted from 0): a missing file, a line that is not JSON,
a row that is not an object, a missing field (with the keys that exist there), a bad prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.errors import UserError, did_you_mean

#: A prompt as stored: text, or chat messages ``[{"role": ..., "content": ...}, ...]``.
PromptValue = str | list[dict[str, str]]
SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class DataConfig:
    """Where the fields of a row are (``data.*`` keys)."""

    prompt_key: str = "prompt"
    """Dotted path of the prompt (a string or a list of chat messages)."""
    answer_keys: list[str] = field(default_factory=lambda: ["reward_model.ground_truth", "solution", "answer", "ground_truth"])
    """Dotted paths tried in order for the ground-truth answer (veRL's first, then TRL's usual columns)."""
    data_source_key: str = "data_source"
    """Dotted path of the data source (it picks the verifier); rows without it get ``default_data_source``."""
    default_data_source: str = ""
    """Data source of rows without one (TRL data has none); empty: the reward verifier must be set."""
    extras_key: str = "extra_info"
    """Dotted path of veRL's per-row metadata, merged into ``extras`` (with TRL's other columns)."""
    uid_key: str = ""
    """Dotted path of a unique prompt id; empty: ``<file stem>/<row index>``."""
    chat_prompts: bool = False
    """Make a string prompt one user message (as veRL's GSM8K preprocessing writes it), so that
    ``policy.kwargs.chat_template: auto`` templates it for a model with a chat template."""
    prompt_suffix: str = ""
    """Text appended to every prompt (to a string prompt, or to the last message of a chat prompt):
    the answer-format instruction of raw data such as GSM8K's (``output the final answer after "####"``)."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset: its id (GRPO groups samples by it), text or messages, answer."""

    uid: str
    prompt: PromptValue
    ground_truth: str
    data_source: str
    extras: dict[str, Any]


def read_records(paths: str | Path | Sequence[str | Path], cfg: DataConfig | None = None) -> list[PromptRecord]:
    """All records of one or more files (``.jsonl``, ``.json`` with an array of rows, ``.parquet``)."""
    cfg = cfg or DataConfig()
    if not cfg.answer_keys:
        raise UserError("data.answer_keys is empty; give at least one dotted path to the ground-truth answer.")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise UserError("no dataset files given.")
    records: list[PromptRecord] = []
    for path in paths:
        path = Path(path)
        for where, row, index in _rows(path):
            records.append(_record(row, where, f"{path.stem}/{index}", cfg))
    seen: dict[str, int] = {}
    for i, record in enumerate(records):
        if record.uid in seen:
            raise UserError(
                f"records {seen[record.uid]} and {i} share the uid {record.uid!r}; GRPO groups samples by uid, "
                "so uids must be unique (fix data.uid_key, or leave it empty for file/row ids)."
            )
        seen[record.uid] = i
    return records


def _rows(path: Path) -> Iterator[tuple[str, Any, int]]:
    """(location for errors, row, 0-based row index) of every row of a file."""
    if not path.is_file():
        hint = f" ({path} is a directory)" if path.is_dir() else ""
        raise UserError(f"dataset file {str(path)!r} does not exist{hint}.")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        index = 0
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise UserError(f"{path}: line {number} is not valid JSON ({err.msg} at column {err.colno}).") from None
                yield f"{path}: line {number}", row, index
                index += 1
    elif suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise UserError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}).") from None
        if not isinstance(rows, list):
            raise UserError(f"{path} must hold a JSON array of rows, not a {type(rows).__name__}.")
        for index, row in enumerate(rows):
            yield f"{path}: row {index}", row, index
    elif suffix == ".parquet":
        for index, row in enumerate(_parquet_rows(path)):
            yield f"{path}: row {index}", row, index
    else:
        raise UserError(f"dataset file {str(path)!r} has an unknown type; use one of {', '.join(SUFFIXES)}.")


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading parquet needs pyarrow: pip install 'embodied[reasoning]'.") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError for damaged files
        raise UserError(f"{path} is not a readable parquet file: {err}") from None


def lookup(row: Any, dotted: str) -> Any:
    """The value at a dotted path (``reward_model.ground_truth``, ``solutions.0``); KeyError with a
    message naming the missing part and what exists there."""
    value = row
    walked = []
    for part in dotted.split("."):
        if isinstance(value, dict):
            if part not in value:
                where = f"under {'.'.join(walked)!r}" if walked else "in the row"
                keys = ", ".join(map(str, value)) or "(none)"
                raise KeyError(f"no key {part!r} {where}.{did_you_mean(part, map(str, value))} Keys there: {keys}")
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit():
            if not -len(value) <= int(part) < len(value):
                raise KeyError(f"{'.'.join(walked)!r} is a list of {len(value)}; index {part} is out of range")
            value = value[int(part)]
        else:
            raise KeyError(f"{'.'.join(walked) or 'the row'!r} is a {type(value).__name__}; it has no field {part!r}")
        walked.append(part)
        if value is None:  # parquet fills the fields a row lacks with nulls
            raise KeyError(f"{'.'.join(walked)!r} is null")
    return value


def _field(row: dict[str, Any], dotted: str, where: str, setting: str) -> Any:
    try:
        return lookup(row, dotted)
    except KeyError as err:
        raise UserError(f"{where}: no field {dotted!r}: {err.args[0]}. Set {setting} to where it is.") from None


def _record(row: Any, where: str, default_uid: str, cfg: DataConfig) -> PromptRecord:
    if not isinstance(row, dict):
        raise UserError(f"{where} is a {type(row).__name__}, not an object with fields.")
    prompt = _prompt(_field(row, cfg.prompt_key, where, "data.prompt_key"), where, cfg.prompt_key)
    if cfg.prompt_suffix:
        prompt = prompt + cfg.prompt_suffix if isinstance(prompt, str) else [
            *prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + cfg.prompt_suffix}]
    if cfg.chat_prompts and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    answer_key = next((key for key in cfg.answer_keys if _has(row, key)), None)
    if answer_key is None:
        reasons = "; ".join(f"{key}: {_why_missing(row, key)}" for key in cfg.answer_keys)
        raise UserError(
            f"{where}: no ground-truth answer in any of data.answer_keys ({reasons}). Row keys: "
            f"{', '.join(row) or '(none)'}. Set data.answer_keys to where the answer is."
        )
    answer = lookup(row, answer_key)
    if isinstance(answer, (list, dict)):
        raise UserError(
            f"{where}: field {answer_key!r} is {answer!r}, not a single answer; point data.answer_keys at one value "
            f"(for a list: '{answer_key}.0')."
        )
    data_source = cfg.default_data_source
    if _has(row, cfg.data_source_key):
        data_source = str(lookup(row, cfg.data_source_key))
    uid = str(_field(row, cfg.uid_key, where, "data.uid_key")) if cfg.uid_key else default_uid
    extras = {k: v for k, v in row.items() if k not in (cfg.prompt_key.split(".")[0], answer_key.split(".")[0])}
    if _has(row, cfg.extras_key) and isinstance(lookup(row, cfg.extras_key), dict):
        extras.pop(cfg.extras_key.split(".")[0], None)
        extras.update(lookup(row, cfg.extras_key))
    return PromptRecord(uid=uid, prompt=prompt, ground_truth=str(answer), data_source=data_source, extras=extras)


def _why_missing(row: dict[str, Any], dotted: str) -> str:
    try:
        lookup(row, dotted)
    except KeyError as err:
        return str(err.args[0])
    return "present"


def _has(row: dict[str, Any], dotted: str) -> bool:
    try:
        lookup(row, dotted)
    except KeyError:
        return False
    return True


def _prompt(value: Any, where: str, key: str) -> PromptValue:
    if isinstance(value, str):
        if not value:
            raise UserError(f"{where}: the prompt ({key!r}) is empty.")
        return value
    if isinstance(value, list) and value:
        for i, message in enumerate(value):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
                raise UserError(
                    f"{where}: message {i} of the prompt ({key!r}) is {message!r}; chat messages are "
                    "{'role': str, 'content': str}."
                )
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise UserError(f"{where}: the prompt ({key!r}) is {value!r}; it must be a string or a non-empty list of chat messages.")

