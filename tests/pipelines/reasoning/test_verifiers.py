"""Verifiers on tables of tricky answers, the data_source dispatch, reward options (truncation,
DAPO's overlong penalty), error counting, and the spawned-process runner math_verify uses."""

from __future__ import annotations

import threading
import time

import pytest

from embodied.config import apply_overrides
from embodied.errors import UserError
from pipelines.reasoning.config import ReasoningConfig
from pipelines.reasoning.verifiers import (
    MATH_VERIFY_INSTALL,
    RewardConfig,
    RewardFunction,
    SpawnedFunction,
    UnparsableGold,
    VerifierTimeout,
    alarm_seconds,
    extract_gsm8k,
    last_boxed,
    make_gsm8k,
    math_verify_check,
    normalize_number,
    strip_string,
    verifier_name_for,
    verify_boxed,
    verify_exact,
)
from pipelines.recipes import load_recipe

# -- exact -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,gold,correct,pred",
    [
        ("42", "42", True, "42"),
        (" 42\n", "42", True, "42"),  # whitespace
        ("+42", "42", True, "42"),  # leading plus
        ("1,234", "1234", True, "1234"),  # thousands separators
        ("1,234,567.50", "1234567.5", True, "1234567.5"),
        ("12.0", "12", True, "12"),  # trailing .0
        ("12.", "12", True, "12"),
        ("-0", "0", True, "0"),
        (".5", "0.5", True, "0.5"),
        ("-.5", "-0.5", True, "-0.5"),
        ("12.01", "12", False, "12.01"),  # wrong but close
        ("41", "42", False, "41"),
        ("-42", "42", False, "-42"),
        ("001", "1", False, "001"),  # leading zeros count: reversed answers compare digit by digit
        ("001", "001", True, "001"),
        ("12,34", "1234", False, "12,34"),  # not a thousands grouping
        ("x = 4", "4", False, "x=4"),  # exact does not extract
        ("", "42", False, None),  # nothing to compare: an extraction failure
        ("   ", "42", False, None),
    ],
)
def test_exact(response: str, gold: str, correct: bool, pred: str | None) -> None:
    assert verify_exact(response, gold) == (correct, pred)


def test_exact_unparsable_gold() -> None:
    with pytest.raises(UnparsableGold):
        verify_exact("42", "  ")


def test_normalize_number_keeps_text() -> None:
    assert normalize_number("abc d") == "abcd"
    assert normalize_number("1,2") == "1,2"


# -- gsm8k ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response,gold,method,correct,pred",
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", "72", "strict", True, "72"),
        ("#### 1,234", "#### 1,234", "strict", True, "1234"),  # gold in GSM8K's own format
        ("#### $1,234", "1234", "strict", False, None),  # "$" before the number: strict finds nothing
        ("so 10 then #### 5 and later #### 7", "7", "strict", True, "7"),  # the last one
        ("The answer is 72.", "72", "strict", False, None),  # no ####
        ("The answer is 72.", "72", "flexible", False, "72."),  # veRL keeps the trailing dot
        ("The answer is 72", "72", "flexible", True, "72"),
        ("I got 70, no wait, 72", "72", "flexible", True, "72"),
        ("#### 72.5", "72", "strict", False, "72.5"),  # wrong but close
        ("#### -3", "-3", "strict", True, "-3"),
        ("#### 72", "72.0", "strict", False, "72"),  # string equality, as veRL
    ],
)
def test_gsm8k(response: str, gold: str, method: str, correct: bool, pred: str | None) -> None:
    assert make_gsm8k(method)(response, gold) == (correct, pred)


def test_gsm8k_reads_only_the_last_300_characters() -> None:
    response = "#### 72 " + "x" * 300
    assert extract_gsm8k(response) is None
    assert extract_gsm8k("x" * 300 + " #### 72") == "72"


@pytest.mark.parametrize("gold", ["seventy-two", "", "#### n/a"])
def test_gsm8k_unparsable_gold(gold: str) -> None:
    with pytest.raises(UnparsableGold):
        make_gsm8k("strict")("#### 72", gold)


# -- boxed ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,content",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one, nested braces
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$ done", "5"),
        ("\\boxed{\\frac{1}{2}", None),  # braces never close
        ("no box", None),
        ("\\boxed", None),
    ],
)
def test_last_boxed(text: str, content: str | None) -> None:
    assert last_boxed(text) == content


@pytest.mark.parametrize(
    "raw,normalised",
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\frac1{2}", "\\frac{1}{2}"),
        ("\\frac{1}2", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        (".5", "\\frac{1}{2}"),  # ".5" -> "0.5" -> "\frac{1}{2}"
        ("x = 5", "5"),
        ("5 \\text{ cm}", "5"),  # units
        ("90^\\circ", "90"),
        ("50\\%", "50"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\$ 10", "10"),
        ("a/b", "a/b"),  # not integers: unchanged
    ],
)
def test_strip_string(raw: str, normalised: str) -> None:
    assert strip_string(raw) == normalised


@pytest.mark.parametrize(
    "response,gold,correct",
    [
        ("The answer is $\\boxed{\\dfrac{1}{2}}$.", "\\frac{1}{2}", True),
        ("\\boxed{0.5}", "\\frac12", True),
        ("\\boxed{1/2}", "\\boxed{\\frac{1}{2}}", True),  # gold itself boxed (a MATH solution)
        ("\\boxed{10 \\text{ cm}}", "10", True),
        ("\\boxed{x = 3}", "3", True),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),  # wrong but close
        ("\\boxed{0.50}", "\\frac{1}{2}", False),  # Hendrycks rewrites only exactly 0.5
        ("1/2", "\\frac{1}{2}", False),  # not boxed: nothing extracted
    ],
)
def test_boxed(response: str, gold: str, correct: bool) -> None:
    assert verify_boxed(response, gold)[0] is correct


def test_boxed_extraction_failure_and_unparsable_gold() -> None:
    assert verify_boxed("I think 1/2", "\\frac{1}{2}") == (False, None)
    with pytest.raises(UnparsableGold):
        verify_boxed("\\boxed{1}", "\\boxed{1")  # the gold's own box never closes


# -- dispatch and reward options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source,name",
    [
        ("synthetic/arith", "exact"),
        ("openai/gsm8k", "gsm8k"),
        ("lighteval/MATH", "boxed"),
        ("DigitalLearningGmbH/MATH-lighteval", "boxed"),
        ("HuggingFaceH4/MATH-500", "boxed"),
        ("aime2024", "boxed"),
    ],
)
def test_data_source_dispatch(source: str, name: str) -> None:
    assert verifier_name_for(source) == name


def test_unknown_data_source_says_what_to_set() -> None:
    with pytest.raises(UserError, match="reward.verifier"):
        verifier_name_for("my/dataset")
    with pytest.raises(UserError, match="Did you mean 'boxed'"):
        RewardFunction(RewardConfig(verifier="boxd"))


def test_reward_batch_scores_and_counts_every_failure() -> None:
    reward = RewardFunction(RewardConfig(correct_score=1.0, incorrect_score=-1.0))
    batch = reward(
        ["#### 72", "\\boxed{\\frac12}", "41", "no answer", "#### 3", ""],
        ["72", "0.5", "42", "#### 9", "not a number", "5"],
        ["openai/gsm8k", "lighteval/MATH", "synthetic/arith", "openai/gsm8k", "openai/gsm8k", "synthetic/x"],
    )
    assert batch.scores == [1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
    assert [r.acc for r in batch.results] == [True, True, False, False, False, False]
    assert [r.pred for r in batch.results] == ["72", "\\frac{1}{2}", "41", None, None, None]
    assert batch.metrics["reward/format_error_rate"] == pytest.approx(2 / 6)  # "no answer", ""
    assert batch.metrics["reward/gold_errors"] == 1.0 and "not a number" in batch.errors[0]
    assert batch.metrics["reward/verifier_errors"] == 0.0
    assert batch.metrics["reward/acc"] == pytest.approx(2 / 6)


def explode(response: str, gold: str) -> tuple[bool, str | None]:
    raise ZeroDivisionError("boom")


def last_word(response: str, gold: str) -> bool:
    return response.split()[-1] == gold


def test_custom_verifier_by_module_path_and_exceptions_are_counted() -> None:
    batch = RewardFunction(RewardConfig(verifier=f"{__name__}:last_word"))(["it is 7", "it is 8"], ["7", "7"], ["a", "b"])
    assert [r.acc for r in batch.results] == [True, False] and [r.pred for r in batch.results] == ["it is 7", "it is 8"]
    batch = RewardFunction(RewardConfig(verifier=f"{__name__}:explode"))(["1", "2"], ["1", "2"], ["x", "x"])
    assert batch.metrics["reward/verifier_errors"] == 2.0 and "ZeroDivisionError: boom" in batch.errors[0]
    assert [r.acc for r in batch.results] == [False, False] and batch.scores == [0.0, 0.0]
    with pytest.raises(UserError, match="cannot import"):
        RewardFunction(RewardConfig(verifier="no_such_module_xyz:fn"))
    with pytest.raises(UserError, match="has no function"):
        RewardFunction(RewardConfig(verifier=f"{__name__}:nothing_here"))


def test_truncated_responses_masked_and_overlong_penalty() -> None:
    # L_max 20, buffer 8: no penalty up to 12 tokens, then linear to -factor at 20.
    cfg = RewardConfig(max_response_length=20, overlong_buffer_len=8, overlong_penalty_factor=0.5, mask_truncated=True)
    reward = RewardFunction(cfg)
    batch = reward(["1", "1", "1", "2"], ["1"] * 4, ["synthetic/a"] * 4, response_lengths=[5, 12, 16, 20],
                   truncated=[False, False, False, True])
    assert batch.scores == pytest.approx([1.0, 1.0, 1.0 - 0.25, 0.0 - 0.5])
    assert batch.loss_mask == [True, True, True, False]
    assert batch.metrics["response/clipped_ratio"] == 0.25
    assert batch.metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.75 / 4)
    with pytest.raises(UserError, match="max_response_length"):
        RewardFunction(RewardConfig(overlong_buffer_len=8))


def test_reward_runs_from_threads() -> None:
    reward = RewardFunction()
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.extend(reward(["#### 72"], ["72"], ["openai/gsm8k"]).scores))
    thread.start()
    thread.join(10)
    assert results == [1.0]


# -- the spawned process and math_verify ----------------------------------------------------------------------------


def double(x: int) -> int:
    return 2 * x


def sleep_then_double(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return 2 * x


def raise_gold(x: int) -> int:
    raise UnparsableGold(f"gold {x} is bad")


def test_spawned_function_times_out_restarts_and_reports_errors() -> None:
    call = SpawnedFunction(f"{__name__}:sleep_then_double", timeout_s=1.0)
    try:
        assert call(3, 0.0) == 6  # from the main thread ...
        out: list[int] = []
        thread = threading.Thread(target=lambda: out.append(call(4, 0.0)))  # ... and from another thread
        thread.start()
        thread.join(60)
        assert out == [8]
        with pytest.raises(VerifierTimeout):
            call(5, 30.0)
        assert call(6, 0.0) == 12  # a fresh process after the kill
        assert call.restarts == 2
    finally:
        call.close()
    bad = SpawnedFunction(f"{__name__}:raise_gold", timeout_s=5.0)
    missing = SpawnedFunction("no_such_module_xyz:fn", timeout_s=5.0)
    try:
        with pytest.raises(UnparsableGold, match="gold 1 is bad"):
            bad(1)
        with pytest.raises(RuntimeError, match="cannot load"):
            missing()
    finally:
        bad.close()
        missing.close()


def test_math_verify_absent_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else find_spec(name, *a))
    with pytest.raises(UserError) as err:
        RewardFunction(RewardConfig(verifier="math_verify"))(["\\boxed{1}"], ["1"], ["x"])
    assert MATH_VERIFY_INSTALL in str(err.value)


def test_alarm_seconds_are_whole_and_at_least_one() -> None:
    assert [alarm_seconds(t) for t in (5.0, 5, 0.2, 2.5)] == [5, 5, 1, 3]
    assert all(type(alarm_seconds(t)) is int for t in (5.0, 0.2))
    with pytest.raises(ValueError, match="timeout_s"):
        alarm_seconds(0.0)


def test_math_verify_in_a_configured_run_scores_latex_answers() -> None:
    """The reward a run builds from its config (``reward.timeout_s=5`` arrives as the float 5.0),
    called from a worker thread as the local backend calls it."""
    pytest.importorskip("math_verify")
    _, data = load_recipe("reasoning_grpo")
    cfg = apply_overrides(ReasoningConfig, data, ["reward.verifier=math_verify", "reward.timeout_s=5"])
    assert cfg.reward.timeout_s == 5.0 and isinstance(cfg.reward.timeout_s, float)
    reward = RewardFunction(cfg.reward)
    try:
        responses = ["\\frac{1}{2}", "so the answer is $\\boxed{42}$", "\\boxed{41}", "0.5", "x = \\boxed{\\sqrt{4}}"]
        golds = ["0.5", "42", "42", "\\frac{1}{2}", "2"]
        results = []
        thread = threading.Thread(target=lambda: results.append(reward(responses, golds, ["math"] * 5)))
        thread.start()
        thread.join(120)
        batch = results[0]
        assert batch.errors == []
        assert [r.acc for r in batch.results] == [True, True, False, True, True]
        assert batch.metrics["reward/gold_errors"] == 0.0 and batch.metrics["reward/verifier_errors"] == 0.0
    finally:
        reward.close()


def test_math_verify_check_runs_in_a_thread_without_an_alarm() -> None:
    """Called in-process from a thread (no spawned process), the check still verifies: it passes no
    alarm there, where math-verify's signal.alarm would fail and parse nothing."""
    pytest.importorskip("math_verify")
    out: list[tuple[bool, str | None]] = []
    thread = threading.Thread(target=lambda: out.append(math_verify_check("$\\boxed{\\frac{1}{2}}$", "0.5", 5.0)))
    thread.start()
    thread.join(60)
    assert out and out[0][0] is True
    assert math_verify_check("\\boxed{42}", "42", 5.0)[0] is True  # the main thread, with an alarm of 5 s


def test_math_verify_scores_from_a_thread() -> None:
    pytest.importorskip("math_verify")
    reward = RewardFunction(RewardConfig(verifier="math_verify"))
    try:
        results = []
        responses = ["The answer is $\\boxed{\\frac{1}{2}}$", "\\boxed{0.5}", "answer: 7", "#### 1,234"]
        golds = ["0.5", "\\frac{1}{2}", "8", "1234"]

        def score() -> None:
            results.append(reward(responses, golds, ["math"] * 4))

        thread = threading.Thread(target=score)  # math-verify's signal.alarm would fail here in-process
        thread.start()
        thread.join(120)
        batch = results[0]
        assert [r.acc for r in batch.results] == [True, True, False, True]
        assert batch.metrics["reward/verifier_errors"] == 0.0
    finally:
        reward.close()
