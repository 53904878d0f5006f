"""Rule-based rewards for reasoning RL: answer verifiers, a data_source dispatch, and reward options.

Verifiers (registry :data:`VERIFIERS`; each maps ``(response, ground_truth)`` to
``(correct, extracted prediction or None)``):

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
* ``math_verify``: Hugging Face's math-verify (optional, ``pip install math-verify==0.9.0``), run in
  a spawned worker process with its own wall-clock timeout: math-verify's ``signal.alarm`` timeouts
  raise outside a process's main thread (Ray actors, thread pools), which other frameworks turned
  into silent all-zero scores. No process exists until the first call.

:class:`RewardFunction` turns responses into ``{score, acc, pred}`` (:class:`VerifierResult`) with
the verifier picked per sample from ``data_source`` (``auto``; :data:`DATA_SOURCE_VERIFIERS`, as
veRL's ``default_compute_score``) or fixed, and counts what went wrong instead of hiding it:
extraction failures (no answer found), gold answers that do not parse, verifier exceptions and
timeouts. Length options: ``mask_truncated`` (drop responses cut at the token limit from the loss,
TRL's ``mask_truncated_completions``) and DAPO's soft overlong penalty
``min(-(L - (L_max - buffer)) / buffer * factor, 0)``.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import multiprocessing
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from embodied.errors import UserError
from embodied.registry import Registry

#: ``(response, ground_truth) -> (correct, prediction or None when nothing could be extracted)``.
Verifier = Callable[[str, str], tuple[bool, "str | None"]]


class UnparsableGold(ValueError):
    """The ground truth itself cannot be normalised: a data problem, counted apart from the model's."""


class VerifierTimeout(RuntimeError):
    """A verifier ran past its wall-clock limit."""


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


# -- math_verify in a spawned process -----------------------------------------------------------------


class SpawnedFunction:
    """Calls ``module:function`` in a spawned child process, one call at a time, with a wall-clock
    timeout per call. The child starts on the first call; a call that times out kills it (the next
    call starts a fresh one). Exceptions in the child come back as the same-named error here:
    :class:`UnparsableGold`, else RuntimeError with the child's message.

    Signal-based timeouts inside the function work: the function runs in the child's main thread.
    """

    def __init__(self, target: str, timeout_s: float, startup_timeout_s: float = 120.0) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.restarts = 0
        self._process: Any = None
        self._conn: Any = None
        self._fresh = False

    def __call__(self, *args: Any) -> Any:
        if self._process is None or not self._process.is_alive():
            self._start()
        limit = self.timeout_s + (self.startup_timeout_s if self._fresh else 0.0)
        self._fresh = False
        self._conn.send(args)
        if not self._conn.poll(limit):
            self.close()
            raise VerifierTimeout(f"{self.target} took longer than {limit:g} s; its process was killed")
        try:
            status, value = self._conn.recv()
        except EOFError:
            self.close()
            raise RuntimeError(f"{self.target}: the worker process died") from None
        if status == "ok":
            return value
        kind, message = value
        if kind == UnparsableGold.__name__:
            raise UnparsableGold(message)
        if kind == "UserError":
            raise UserError(message)
        raise RuntimeError(f"{self.target} raised {kind}: {message}")

    def _start(self) -> None:
        self.close()
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, self.target), daemon=True, name="verifier")
        self._process.start()
        child.close()
        self._conn = parent
        self._fresh = True
        self.restarts += 1

    def close(self) -> None:
        """Stop the child process (if any)."""
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=10)
            self._process = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _serve(conn: Any, target: str) -> None:
    """The child's loop: receive argument tuples, send back ("ok", result) or ("error", (type, msg))."""
    module_name, _, name = target.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except Exception as err:  # reported on the first call
        function, startup_error = None, (type(err).__name__, f"cannot load {target}: {err}")
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        if function is None:
            conn.send(("error", startup_error))
            continue
        try:
            conn.send(("ok", function(*args)))
        except Exception as err:
            conn.send(("error", (type(err).__name__, str(err))))


MATH_VERIFY_INSTALL = "pip install 'embodied[math-verify]' (or: pip install math-verify==0.9.0)"


def math_verify_check(response: str, ground_truth: str, timeout_s: float) -> tuple[bool, str | None]:
    """math-verify's parse + verify (runs in the worker process; its timeouts use signal.alarm)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_text = ground_truth if ("\\boxed" in ground_truth or "$" in ground_truth) else "\\boxed{" + ground_truth + "}"
    gold = parse(gold_text, extraction_config=[LatexExtractionConfig()], parsing_timeout=timeout_s)
    if not gold:
        raise UnparsableGold(f"math-verify cannot parse the ground truth {ground_truth!r}")
    pred = parse(
        response, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()], parsing_timeout=timeout_s
    )
    if not pred:
        return False, None
    correct = bool(verify(gold, pred, timeout_seconds=timeout_s))
    return correct, str(pred[-1])


class MathVerifyVerifier:
    """``math_verify`` through :class:`SpawnedFunction` (safe from any thread)."""

    def __init__(self, timeout_s: float) -> None:
        if importlib.util.find_spec("math_verify") is None:
            raise UserError(f"reward verifier 'math_verify' needs the math-verify package: {MATH_VERIFY_INSTALL}.")
        self.timeout_s = timeout_s
        # The child's own limit is timeout_s per parse/verify; the parent's wall clock allows both.
        self._call = SpawnedFunction(f"{__name__}:math_verify_check", timeout_s=3 * timeout_s + 5)

    def __call__(self, response: str, ground_truth: str) -> tuple[bool, str | None]:
        return self._call(response, ground_truth, self.timeout_s)

    def close(self) -> None:
        self._call.close()


# -- registries ------------------------------------------------------------------------------------------


@dataclass
class RewardConfig:
    """How responses are scored (the ``reward.*`` keys of a reasoning run)."""

    verifier: str = "auto"
    """``auto`` (by each sample's data_source, see DATA_SOURCE_VERIFIERS), a registered verifier
    (``exact``, ``gsm8k``, ``boxed``, ``math_verify``) or a user's ``module:function``."""
    gsm8k_method: Literal["strict", "flexible"] = "strict"
    """GSM8K extraction: ``strict`` (the last ``#### N``) or ``flexible`` (the last number)."""
    correct_score: float = 1.0
    """Reward of a correct answer."""
    incorrect_score: float = 0.0
    """Reward of a wrong or missing answer (RLinf uses -1 with a scale of 5)."""
    max_response_length: int = 0
    """L_max, the response token limit (the rollout's max_new_tokens); needed by the overlong penalty."""
    mask_truncated: bool = False
    """Responses cut at L_max (no EOS) are excluded from the loss (``loss_mask`` False)."""
    overlong_buffer_len: int = 0
    """DAPO soft overlong punishment over the last ``buffer`` tokens before L_max; 0 is off."""
    overlong_penalty_factor: float = 1.0
    """Penalty at L_max (linear from 0 at L_max - buffer)."""
    timeout_s: float = 5.0
    """Per-answer limit of the math_verify verifier (its parse and its verify each)."""

    def validate(self) -> None:
        if self.overlong_buffer_len < 0 or self.max_response_length < 0:
            raise UserError("reward.overlong_buffer_len and reward.max_response_length must be >= 0.")
        if self.overlong_buffer_len and not 0 < self.overlong_buffer_len <= self.max_response_length:
            raise UserError(
                f"reward.overlong_buffer_len={self.overlong_buffer_len} needs reward.max_response_length "
                f"(={self.max_response_length}) of at least the buffer: the penalty starts at L_max - buffer."
            )
        if self.timeout_s <= 0:
            raise UserError(f"reward.timeout_s={self.timeout_s} must be > 0.")


#: name -> factory(RewardConfig) -> Verifier
VERIFIERS: Registry[Callable[[RewardConfig], Verifier]] = Registry("verifier")
VERIFIERS.add("exact", lambda cfg: verify_exact, "Whole response vs gold after numeric normalisation.")
VERIFIERS.add("gsm8k", lambda cfg: make_gsm8k(cfg.gsm8k_method), "veRL's GSM8K '#### N' rule (strict/flexible).")
VERIFIERS.add("boxed", lambda cfg: verify_boxed, "Last \\boxed{} vs gold, Hendrycks-normalised.")
VERIFIERS.add("math_verify", lambda cfg: MathVerifyVerifier(cfg.timeout_s), "math-verify (optional) in a worker process.")

#: ``data_source`` patterns (fnmatch, case-insensitive), first match wins -> verifier name.
DATA_SOURCE_VERIFIERS: list[tuple[str, str]] = [
    ("synthetic/*", "exact"),
    ("openai/gsm8k", "gsm8k"),
    ("*gsm8k*", "gsm8k"),
    ("lighteval/math", "boxed"),
    ("digitallearninggmbh/math-lighteval", "boxed"),
    ("huggingfaceh4/math-500", "boxed"),
    ("*math*", "boxed"),
    ("*aime*", "boxed"),
]


def verifier_name_for(data_source: str) -> str:
    """The verifier of a ``data_source`` (veRL's default_compute_score dispatch)."""
    for pattern, name in DATA_SOURCE_VERIFIERS:
        if fnmatch.fnmatchcase(data_source.lower(), pattern):
            return name
    patterns = ", ".join(p for p, _ in DATA_SOURCE_VERIFIERS)
    raise UserError(
        f"no verifier is known for data_source {data_source!r} (known patterns: {patterns}); set "
        f"reward.verifier to one of {', '.join(VERIFIERS.names())}."
    )


def custom_verifier(target: str) -> Verifier:
    """A user's ``module:function`` taking ``(response, ground_truth)`` and returning ``correct``
    or ``(correct, prediction)`` (veRL's ``custom_reward_function``; runs in this process). With a
    bare ``correct`` the prediction is the whole response."""
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UserError(f"reward.verifier={target!r}: cannot import {module_name!r} ({err}).") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(f"reward.verifier={target!r}: module {module_name!r} has no function {name!r}.")

    def verify_custom(response: str, ground_truth: str) -> tuple[bool, str | None]:
        result = function(response, ground_truth)
        if isinstance(result, tuple):
            correct, pred = result
            return bool(correct), None if pred is None else str(pred)
        return bool(result), response  # a bare verdict: the whole response was the prediction

    return verify_custom


# -- scoring a batch ------------------------------------------------------------------------------------


@dataclass
class VerifierResult:
    """One response's reward: ``score`` (with any overlong penalty), ``acc`` (the answer is right),
    ``pred`` (the extracted answer, None when none was found)."""

    score: float
    acc: bool
    pred: str | None


@dataclass
class RewardBatch:
    """Rewards of B responses, and what went wrong while computing them."""

    results: list[VerifierResult]
    loss_mask: list[bool]
    """False for responses to exclude from the loss (truncated ones with ``mask_truncated``)."""
    metrics: dict[str, float]
    """``reward/mean``, ``reward/acc``, ``reward/format_error_rate`` (no answer extracted),
    ``reward/gold_errors``, ``reward/verifier_errors`` (exceptions and timeouts, counts),
    ``reward/overlong_penalty_mean``, ``response/clipped_ratio``."""
    errors: list[str] = field(default_factory=list)
    """The messages of gold and verifier errors (at most 10)."""

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.results]


class RewardFunction:
    """Scores responses against ground truths; call :meth:`close` when done (math_verify's process)."""

    def __init__(self, cfg: RewardConfig | None = None) -> None:
        self.cfg = cfg or RewardConfig()
        self.cfg.validate()
        self._verifiers: dict[str, Verifier] = {}
        if ":" in self.cfg.verifier:
            self._verifiers[self.cfg.verifier] = custom_verifier(self.cfg.verifier)
        elif self.cfg.verifier != "auto":
            VERIFIERS.get(self.cfg.verifier)  # an unknown name fails now, with a did-you-mean

    def verifier(self, data_source: str) -> tuple[str, Verifier]:
        name = self.cfg.verifier if self.cfg.verifier != "auto" else verifier_name_for(data_source)
        if name not in self._verifiers:
            self._verifiers[name] = VERIFIERS.get(name)(self.cfg)
        return name, self._verifiers[name]

    def __call__(
        self,
        responses: Sequence[str],
        ground_truths: Sequence[str],
        data_sources: Sequence[str],
        response_lengths: Sequence[int] | None = None,
        truncated: Sequence[bool] | None = None,
    ) -> RewardBatch:
        """``responses`` (B texts, EOS removed), their golds and data sources; ``response_lengths``
        (tokens, EOS included) for the overlong penalty; ``truncated`` (no EOS) for masking."""
        count = len(responses)
        if not (len(ground_truths) == len(data_sources) == count):
            raise ValueError(
                f"RewardFunction: {count} responses, {len(ground_truths)} ground truths, {len(data_sources)} data sources"
            )
        for name, values in (("response_lengths", response_lengths), ("truncated", truncated)):
            if values is not None and len(values) != count:
                raise ValueError(f"RewardFunction: {name} has {len(values)} entries for {count} responses")
        if self.cfg.overlong_buffer_len and response_lengths is None:
            raise ValueError("RewardFunction: reward.overlong_buffer_len needs response_lengths")
        results, errors = [], []
        gold_errors = verifier_errors = missing = 0
        penalties = []
        for i in range(count):
            name, verify = self.verifier(data_sources[i])
            acc, pred = False, None
            try:
                acc, pred = verify(responses[i], str(ground_truths[i]))
            except UserError:
                raise
            except UnparsableGold as err:
                gold_errors += 1
                errors.append(f"sample {i} ({name}): {err}")
            except Exception as err:  # counted and reported, never silently scored 0
                verifier_errors += 1
                errors.append(f"sample {i} ({name}): {type(err).__name__}: {err}")
            else:
                missing += pred is None
            score = self.cfg.correct_score if acc else self.cfg.incorrect_score
            penalty = self._overlong_penalty(response_lengths[i]) if response_lengths is not None else 0.0
            penalties.append(penalty)
            results.append(VerifierResult(score=score + penalty, acc=bool(acc), pred=pred))
        clipped = [bool(t) for t in truncated] if truncated is not None else [False] * count
        loss_mask = [not (self.cfg.mask_truncated and c) for c in clipped]
        denominator = max(count, 1)
        metrics = {
            "reward/mean": sum(r.score for r in results) / denominator,
            "reward/acc": sum(r.acc for r in results) / denominator,
            "reward/format_error_rate": missing / denominator,
            "reward/gold_errors": float(gold_errors),
            "reward/verifier_errors": float(verifier_errors),
            "reward/overlong_penalty_mean": sum(penalties) / denominator,
            "response/clipped_ratio": sum(clipped) / denominator,
        }
        return RewardBatch(results=results, loss_mask=loss_mask, metrics=metrics, errors=errors[:10])

    def _overlong_penalty(self, length: int) -> float:
        """DAPO: ``min(-(L - (L_max - buffer)) / buffer * factor, 0)``; 0 when off."""
        buffer = self.cfg.overlong_buffer_len
        if not buffer:
            return 0.0
        expected = self.cfg.max_response_length - buffer
        return min(-(length - expected) / buffer * self.cfg.overlong_penalty_factor, 0.0)

    def close(self) -> None:
        for verify in self._verifiers.values():
            close = getattr(verify, "close", None)
            if close is not None:
                close()
        self._verifiers.clear()
