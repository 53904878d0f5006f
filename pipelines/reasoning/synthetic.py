"""A synthetic arithmetic task in veRL's schema, generated locally and deterministically.

Every problem ``a <op> b`` with operands of ``digits`` digits (``0 .. 10**digits - 1``) is
enumerated, shuffled by ``seed`` and split: the first ``test_size`` are held out, the rest (or the
first ``train_size`` of them) train. Held-out problems never appear in training, so test accuracy
measures generalisation. One row::

    {"data_source": "synthetic/arith",
     "prompt": [{"role": "user", "content": "47+85="}],
     "ability": "arithmetic",
     "reward_model": {"style": "rule", "ground_truth": "231"},
     "extra_info": {"split": "train", "index": 0, "a": 47, "b": 85, "op": "+", "result": 132, "reversed": true}}

With ``reverse_answer`` the answer is written least-significant digit first (132 -> "231"; 100 ->
"001"), which small transformers learn far more easily (Lee et al. 2023, *Teaching Arithmetic to
Small Transformers*): each digit depends only on digits already seen. The ``exact`` verifier
compares it digit for digit (leading zeros count).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from embodied.errors import UserError

DATA_SOURCE = "synthetic/arith"
_OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass
class ArithConfig:
    """Which arithmetic problems, and how they are split."""

    digits: int = 2
    """Operand digits: operands run over 0 .. 10**digits - 1."""
    operations: list[str] = field(default_factory=lambda: ["+"])
    """Operators among ``+``, ``-``, ``*``."""
    reverse_answer: bool = True
    """Write the answer's digits least-significant first (a minus sign stays in front)."""
    zero_pad: bool = False
    """Fixed-width numbers: operands padded with zeros to ``digits`` ("07+85="), answers to the
    widest result ("025" for 25 = 12+13 with 2 digits, before reversing)."""
    test_size: int = 500
    """Held-out problems."""
    train_size: int = 0
    """Training problems; 0: all the others."""
    seed: int = 0
    """Seed of the shuffle that splits the problems."""

    def validate(self) -> None:
        if not 1 <= self.digits <= 4:
            raise UserError(f"arith digits={self.digits} must be 1 to 4 (there are 10**(2*digits) problems per operator).")
        unknown = [op for op in self.operations if op not in _OPERATIONS]
        if unknown or not self.operations:
            raise UserError(f"arith operations={self.operations!r}: each must be one of {', '.join(_OPERATIONS)}.")
        total = len(self.operations) * 10 ** (2 * self.digits)
        if self.test_size < 1 or self.train_size < 0 or self.test_size + max(self.train_size, 1) > total:
            raise UserError(
                f"arith test_size={self.test_size} + train_size={self.train_size} does not fit the {total} problems "
                f"of {self.digits}-digit {self.operations}; lower them (train_size 0 takes all the rest)."
            )


def answer_text(result: int, reverse: bool, width: int = 0) -> str:
    """The answer as the model should write it: ``132`` -> ``"231"`` reversed; ``-12`` -> ``"-21"``;
    ``width`` pads the digits with zeros first (``25``, width 3 -> ``"025"`` -> ``"520"``)."""
    digits = str(abs(result)).zfill(width)
    sign = "-" if result < 0 else ""
    return sign + (digits[::-1] if reverse else digits)


def result_width(op: str, digits: int) -> int:
    """Digits of the widest result of ``op`` on ``digits``-digit operands (sign not counted)."""
    largest = 10**digits - 1
    return len(str(abs(_OPERATIONS[op](largest, largest if op != "-" else 0))))


def problem_row(a: int, op: str, b: int, split: str, index: int, cfg: ArithConfig) -> dict[str, Any]:
    """One veRL-schema row for ``a op b``."""
    result = _OPERATIONS[op](a, b)
    operand_width = cfg.digits if cfg.zero_pad else 0
    answer_width = result_width(op, cfg.digits) if cfg.zero_pad else 0
    prompt = f"{str(a).zfill(operand_width)}{op}{str(b).zfill(operand_width)}="
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": answer_text(result, cfg.reverse_answer, answer_width)},
        "extra_info": {
            "split": split, "index": index, "a": a, "b": b, "op": op, "result": result, "reversed": cfg.reverse_answer,
        },
    }


def make_arith_rows(cfg: ArithConfig) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}``, the same for the same config."""
    cfg.validate()
    size = 10**cfg.digits
    problems = [(a, op, b) for op in cfg.operations for a in range(size) for b in range(size)]
    random.Random(cfg.seed).shuffle(problems)
    test = problems[: cfg.test_size]
    train = problems[cfg.test_size :]
    if cfg.train_size:
        train = train[: cfg.train_size]
    return {
        split: [problem_row(a, op, b, split, i, cfg) for i, (a, op, b) in enumerate(chosen)]
        for split, chosen in (("train", train), ("test", test))
    }


def write_arith_dataset(
    directory: str | Path, cfg: ArithConfig | None = None, fmt: Literal["jsonl", "parquet"] = "jsonl"
) -> dict[str, Path]:
    """Write ``train.<fmt>`` and ``test.<fmt>`` to ``directory``; returns ``{"train": path, "test": path}``."""
    cfg = cfg or ArithConfig()
    if fmt not in ("jsonl", "parquet"):
        raise UserError(f"dataset format {fmt!r} must be 'jsonl' or 'parquet'.")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in make_arith_rows(cfg).items():
        path = directory / f"{split}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), path)
        paths[split] = path
    return paths
