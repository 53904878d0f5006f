"""Answer rules for reasoning rewards: pure functions from ``(response, ground_truth)`` to
``(correct, extracted prediction or None)``; :mod:`pipelines.reasoning.verifiers` registers them.

* ``exact``: the whole response against the gold after numeric normalisation (whitespace, a leading
  ``+``, thousands separators, trailing decimal zeros such as ``12.0``). Leading zeros are kept:
  ``"007" != "7"``, so digit-string answers (reversed sums) compare exactly.
* ``gsm8k``: veRL's GSM8K rule on the last 300 characters: ``strict`` takes the last ``#### N``,
  ``flexible`` the last number; commas and ``$`` dropped; string equality with the gold (whose own
  ``#### `` prefix and commas are dropped too).
* ``boxed``: the last ``\\boxed{...}`` / ``\\fbox{...}`` (brace-matched) against the gold (itself boxed
  or bare), both normalised Hendrycks-style (:func:`strip_string`: ``\\dfrac``/``\\tfrac``,
  ``\\frac12``, ``a/b``, ``0.5``/``.5``, units in ``\\text{ }``, ``\\left``/``\\right``, degrees,
  percent, ``x = ``, spaces).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

#: ``(response, ground_truth) -> (correct, prediction or None when nothing could be extracted)``.
Verifier = Callable[[str, str], tuple[bool, "str | None"]]


class UnparsableGold(ValueError):
    """The ground truth itself cannot be normalised: a data problem, counted apart from the model's."""


# -- exact -------------------------------------------------------------------------------------------

_GROUPED = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")  # 1,234 or 12,345.5
_DECIMAL = re.compile(r"-?\d*\.\d*")


def normalize_number(text: str) -> str:
    """Canonical text of a numeric answer; other text comes back with whitespace removed.

    ``" +1,234.50 "`` -> ``"1234.5"``; ``"12.0"`` -> ``"12"``; ``"-0"`` -> ``"0"``; leading zeros are
    kept (``"007"`` stays ``"007"``).
    """
    s = re.sub(r"\s+", "", text)
    if s.startswith("+"):
        s = s[1:]
    if _GROUPED.fullmatch(s):
        s = s.replace(",", "")
    if _DECIMAL.fullmatch(s) and any(c.isdigit() for c in s):
        s = s.rstrip("0").rstrip(".") if "." in s else s
        if s in ("", "-"):
            s = "0"
        if s.startswith("."):
            s = "0" + s
        if s.startswith("-."):
            s = "-0" + s[1:]
    if s == "-0":
        s = "0"
    return s


def verify_exact(response: str, ground_truth: str) -> tuple[bool, str | None]:
    """The whole response, normalised, equals the normalised gold."""
    gold = normalize_number(ground_truth)
    if not gold:
        raise UnparsableGold(f"ground truth {ground_truth!r} is empty")
    pred = normalize_number(response)
    if not pred:
        return False, None
    return pred == gold, pred


# -- gsm8k -------------------------------------------------------------------------------------------

GSM8K_CLIP_CHARS = 300  # veRL searches only the response's tail: long outputs are slow to regex
_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_GSM8K_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_GSM8K_GOLD = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def gsm8k_gold(ground_truth: str) -> str:
    """``"#### 1,234"`` or ``"1,234"`` -> ``"1234"``; UnparsableGold when no number remains."""
    text = ground_truth.split("####")[-1].strip().replace(",", "").replace("$", "")
    if not _GSM8K_GOLD.fullmatch(text):
        raise UnparsableGold(f"GSM8K ground truth {ground_truth!r} is not a number")
    return text


def extract_gsm8k(response: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The answer of a GSM8K-style response (veRL's rule), or None."""
    tail = response[-GSM8K_CLIP_CHARS:]
    if method == "strict":
        found = _GSM8K_STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    for candidate in reversed(_GSM8K_FLEXIBLE.findall(tail)):
        if candidate not in ("", "."):
            return candidate.replace(",", "").replace("$", "")
    return None


def make_gsm8k(method: Literal["strict", "flexible"]) -> Verifier:
    def verify_gsm8k(response: str, ground_truth: str) -> tuple[bool, str | None]:
        gold = gsm8k_gold(ground_truth)
        pred = extract_gsm8k(response, method)
        return (pred == gold if pred is not None else False), pred

    return verify_gsm8k


# -- boxed -------------------------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces matched), of ``\\boxed x``
    (up to a ``$``), or None when there is none or its braces do not close."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    command = "\\boxed" if rest.startswith("\\boxed") else "\\fbox"
    after = rest[len(command):]
    if after.startswith(" "):  # "\boxed 5$": the argument runs to the next dollar sign
        return after[1:].split("$")[0].strip()
    if not after.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(after):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return after[1:i]
    return None


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``, ``\\frac{1}2`` -> ``\\frac{1}{2}``."""
    head, *parts = s.split("\\frac")
    out = head
    for part in parts:
        out += "\\frac"
        if part.startswith("{"):
            closing = _closing_brace(part)
            if closing is None or closing + 1 >= len(part) or part[closing + 1] == "{":
                out += part
            else:  # "{1}2..." -> "{1}{2}..."
                out += part[: closing + 1] + "{" + part[closing + 1] + "}" + part[closing + 2:]
            continue
        if len(part) < 2:
            return s  # "\frac1" alone: leave the text as it was
        numerator, rest = part[0], part[1:]
        if rest.startswith("{"):
            out += "{" + numerator + "}" + rest
        else:
            out += "{" + numerator + "}{" + rest[0] + "}" + rest[1:]
    return out


def _closing_brace(s: str) -> int | None:
    depth = 0
    for i, char in enumerate(s):
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return i
    return None


def _fix_a_slash_b(s: str) -> str:
    """``"3/4"`` -> ``"\\frac{3}{4}"`` when both sides are integers."""
    match = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}" if match else s


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character argument)."""
    return re.sub(r"\\sqrt([^{\s\\])", r"\\sqrt{\1}", s)


def strip_string(text: str) -> str:
    """Hendrycks-style normalisation of a LaTeX answer (the MATH benchmark's ``is_equiv``)."""
    s = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    if "\\text{ " in s:  # "5 \text{ cm}": drop units written after a spaced \text{
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s.startswith("."):
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0].strip()) <= 2:  # "x = 5", "k=5"
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def verify_boxed(response: str, ground_truth: str) -> tuple[bool, str | None]:
    """Last boxed answer of the response, normalised, equals the normalised (boxed or bare) gold."""
    gold_text = last_boxed(ground_truth) if ("\\boxed" in ground_truth or "\\fbox" in ground_truth) else ground_truth
    gold = strip_string(gold_text) if gold_text is not None else ""
    if not gold:
        raise UnparsableGold(f"ground truth {ground_truth!r} has no answer after normalisation")
    boxed = last_boxed(response)
    if boxed is None:
        return False, None
    pred = strip_string(boxed)
    return pred == gold, pred
