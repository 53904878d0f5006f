"""Rule-based rewards for reasoning RL: the verifier registry, a data_source dispatch, reward options.

Verifiers (registry :data:`VERIFIERS`; each maps ``(response, ground_truth)`` to
``(correct, extracted prediction or None)``): ``exact``, ``gsm8k`` and ``boxed`` are the pure rules
of :mod:`pipelines.reasoning.answer_rules`; ``math_verify`` is Hugging Face's math-verify in a
spawned worker process (:mod:`pipelines.reasoning.math_verifier`: its ``signal.alarm`` limits need
whole seconds and a main thread, which other frameworks turned into silent all-zero scores). No
process exists until the first call.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from embodied.errors import UserError
from embodied.registry import Registry
from pipelines.reasoning.answer_rules import (
    UnparsableGold,
    Verifier,
    extract_gsm8k,
    gsm8k_gold,
    last_boxed,
    make_gsm8k,
    normalize_number,
    strip_string,
    verify_boxed,
    verify_exact,
)
from pipelines.reasoning.math_verifier import (
    MATH_VERIFY_INSTALL,
    MathVerifyVerifier,
    SpawnedFunction,
    VerifierTimeout,
    alarm_seconds,
    math_verify_check,
)

__all__ = [
    "DATA_SOURCE_VERIFIERS", "MATH_VERIFY_INSTALL", "VERIFIERS", "MathVerifyVerifier", "RewardBatch", "RewardConfig",
    "RewardFunction", "SpawnedFunction", "UnparsableGold", "Verifier", "VerifierResult", "VerifierTimeout",
    "alarm_seconds", "custom_verifier", "extract_gsm8k", "gsm8k_gold", "last_boxed", "make_gsm8k",
    "math_verify_check", "normalize_number", "strip_string", "verifier_name_for", "verify_boxed", "verify_exact",
]

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
    """Per-answer limit of the math_verify verifier (its parse and its verify each), in seconds;
    math-verify's ``signal.alarm`` takes whole seconds, so it is rounded up (at least 1)."""

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
VERIFIERS.add("math_verify", lambda cfg: MathVerifyVerifier(cfg.timeout_s), "math-verify in a worker process (LaTeX and expressions, symbolic).")

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
