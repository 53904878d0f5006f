"""The ``math_verify`` verifier: Hugging Face's math-verify in a spawned worker process.

math-verify bounds its ``parse`` and ``verify`` with ``signal.alarm``, which takes a whole number of
seconds (a float raises TypeError) and works only in a process's main thread (elsewhere it raises
ValueError). math-verify catches both and returns an empty parse, so a float limit or a worker
thread (the local backend runs workers in threads; Ray actors may too) turns every answer into
"unparsable" and every reward into 0. Here:

* :class:`SpawnedFunction` runs the check in a child process's main thread, with a wall-clock limit
  per call that kills and replaces the child: no thread of any worker calls ``signal.alarm``.
* :func:`alarm_seconds` turns ``reward.timeout_s`` (a float in the config) into what
  ``signal.alarm`` takes: a whole number of seconds, rounded up, at least 1.
* :func:`math_verify_check` called outside a main thread passes no limit to math-verify (``None``
  turns its alarm off); the caller's own clock bounds it then (the SpawnedFunction's does).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import multiprocessing
import threading
from typing import Any

from embodied.errors import UserError
from pipelines.reasoning.answer_rules import UnparsableGold


class VerifierTimeout(RuntimeError):
    """A verifier ran past its wall-clock limit."""


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


def alarm_seconds(timeout_s: float) -> int:
    """``timeout_s`` as ``signal.alarm`` takes it: whole seconds, rounded up, at least 1
    (``5.0`` -> 5, ``0.2`` -> 1, ``2.5`` -> 3)."""
    if not timeout_s > 0:
        raise ValueError(f"alarm_seconds: timeout_s must be > 0 (got {timeout_s})")
    return max(1, math.ceil(timeout_s))


def math_verify_check(response: str, ground_truth: str, timeout_s: float) -> tuple[bool, str | None]:
    """math-verify's parse + verify of ``response`` against ``ground_truth`` (a gold without ``$`` or
    ``\\boxed`` is wrapped in ``\\boxed{}``): ``(correct, the last parsed answer or None)``.

    In a main thread math-verify bounds each parse and the verify by ``alarm_seconds(timeout_s)``;
    in any other thread it gets no limit (its alarm would fail there), and the caller's clock
    bounds the call."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    limit = alarm_seconds(timeout_s) if threading.current_thread() is threading.main_thread() else None
    gold_text = ground_truth if ("\\boxed" in ground_truth or "$" in ground_truth) else "\\boxed{" + ground_truth + "}"
    gold = parse(gold_text, extraction_config=[LatexExtractionConfig()], parsing_timeout=limit)
    if not gold:
        raise UnparsableGold(f"math-verify cannot parse the ground truth {ground_truth!r}")
    pred = parse(response, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()], parsing_timeout=limit)
    if not pred:
        return False, None
    correct = bool(verify(gold, pred, timeout_seconds=limit))
    return correct, str(pred[-1])


class MathVerifyVerifier:
    """``math_verify`` through :class:`SpawnedFunction` (safe from any thread)."""

    def __init__(self, timeout_s: float) -> None:
        if importlib.util.find_spec("math_verify") is None:
            raise UserError(f"reward verifier 'math_verify' needs the math-verify package: {MATH_VERIFY_INSTALL}.")
        self.timeout_s = alarm_seconds(timeout_s)
        # The child's own limit is timeout_s per parse and per verify; the parent's clock allows all three.
        self._call = SpawnedFunction(f"{__name__}:math_verify_check", timeout_s=3 * self.timeout_s + 5)

    def __call__(self, response: str, ground_truth: str) -> tuple[bool, str | None]:
        return self._call(response, ground_truth, self.timeout_s)

    def close(self) -> None:
        self._call.close()
