"""Errors that reach the user, their exit codes, and the one paragraph that explains a failure.

Every kind of failure has one class and one exit code (:class:`ExitCode`); ``docs/reliability.md``
lists them with what to do:

====  ==================  ==========================================================================
code  class               meaning
====  ==================  ==========================================================================
0                         success
1     (anything else)     an unexpected error: a bug. The full traceback is in the run's log.
2     :class:`UserError`  a mistake in what the user asked for (config key, recipe, run dir in use,
                          a checkpoint that does not fit the model). Nothing was written.
3     :class:`WorkerFailure`  a worker, env process or trainer rank raised or died;
                          :class:`EnvError`: the user's env raised or returned NaN/inf.
4     :class:`StorageError`   the disk is full or unwritable, or a checkpoint is corrupt.
5     :class:`RunTimeout`     a worker, channel or env process did not answer within its timeout
                          (the message names the seconds and the config key).
129   :class:`Terminated` stopped by SIGHUP (the terminal closed); 128 + the signal number.
130   (KeyboardInterrupt) interrupted with Ctrl-C (SIGINT).
141   (BrokenPipeError)   stdout's reader went away (``embodied config RECIPE | head``): quietly,
                          as a program the shell's SIGPIPE ended.
143   :class:`Terminated` stopped by SIGTERM (e.g. a scheduler's kill); 128 + the signal number.
====  ==================  ==========================================================================

A :class:`UserError` prints as its message alone. Every other failure prints as ONE paragraph
(:func:`format_failure`): what failed, where (group, rank, node, env index, seed when known), what
the run was doing, its last checkpoint, the exact command to resume, and the log file holding the
full traceback.
"""

from __future__ import annotations

import difflib
import errno
import re
import shlex
import signal
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, ClassVar


class ExitCode(IntEnum):
    """Process exit codes of the ``embodied`` command (see the module docstring)."""

    OK = 0
    BUG = 1
    USER = 2
    WORKER = 3
    STORAGE = 4
    TIMEOUT = 5
    SIGHUP = 129
    SIGINT = 130
    BROKEN_PIPE = 141
    SIGTERM = 143


class EmbodiedError(Exception):
    """Base of the failures this project raises on purpose. ``exit_code`` says which kind it is;
    ``where`` holds what is known about the place it happened (``group``, ``rank``, ``node``,
    ``pid``, ``env_index``, ``seed``, the worker's ``log`` file, ...), for :func:`format_failure`."""

    exit_code: ClassVar[int] = ExitCode.BUG
    #: The start of the failure paragraph (``"A worker failed"``).
    headline: ClassVar[str] = "The run failed"

    def __init__(self, *args: Any, where: Mapping[str, Any] | None = None) -> None:
        super().__init__(*args)
        self.where: dict[str, Any] = dict(where or {})

    @property
    def summary(self) -> str:
        """The message without any attached traceback (its first paragraph)."""
        return first_paragraph(str(self))

    def __reduce__(self) -> tuple:
        # Subclasses take other constructor arguments than ``args``: rebuild from args + state, so
        # the error survives pickling (multiprocessing, Ray) with ``where`` and every attribute.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[EmbodiedError], args: tuple, state: dict[str, Any]) -> EmbodiedError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class UserError(EmbodiedError):
    """A problem with the user's input; printed without a traceback, exit code 2."""

    exit_code = ExitCode.USER
    headline = "Invalid input"


class ConfigError(UserError):
    """A config key, value or recipe the schema does not accept."""


class WorkerFailure(EmbodiedError, RuntimeError):
    """A worker, env process or trainer rank raised or died (exit code 3)."""

    exit_code = ExitCode.WORKER
    headline = "A worker failed"


class EnvError(WorkerFailure):
    """The user's env failed: its constructor, ``reset`` or ``step`` raised, it returned NaN/inf
    (``env.nonfinite=error``), or its process died or hung (exit code 3; 5 for a hang).

    ``where`` names the env: ``env_id``, ``env_index`` (over the VecEnv that raised it; the env
    worker makes it global), ``seed`` (the seed the env was last reset with), and, from an env
    process, ``env_process`` and its ``log``. The paragraph says it is the env's failure, so a user
    does not hunt for it in Embodied or in the policy."""

    headline = "The env failed"

    def __init__(self, *args: Any, where: Mapping[str, Any] | None = None, detail: str | None = None,
                 appendix: str = "") -> None:
        """Either a plain message (``args``), or ``detail``: what went wrong, rendered after the
        env's name, index and seed as ``where`` holds them when the message is read (an env
        worker turns a chunk's index into one over all envs by updating ``where``);
        ``appendix`` follows (a worker's traceback)."""
        super().__init__(*(args or (detail,)), where=where)
        self.detail = detail
        self.appendix = appendix

    def __str__(self) -> str:
        if self.detail is None:
            return super().__str__() + self.appendix
        w = self.where
        name = f"env {w['env_id']}" if w.get("env_id") else "the env"
        at = ", ".join(f"{label} {w[key]}" for key, label in (("env_index", "env index"), ("seed", "seed"))
                       if w.get(key) is not None)
        return f"{name}{f' ({at})' if at else ''} {self.detail}{self.appendix}"


class StorageError(EmbodiedError):
    """Writing or reading the run's files failed: disk full, unwritable, corrupt (exit code 4).

    ``path`` is the file or dir concerned, ``free_bytes`` the free space of its file system when
    it could be measured (None otherwise)."""

    exit_code = ExitCode.STORAGE
    headline = "Storage failed"

    def __init__(self, message: str, path: str | Path, free_bytes: int | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.path = Path(path)
        self.free_bytes = free_bytes


class RunTimeout(EmbodiedError):
    """Something did not answer within its timeout (exit code 5)."""

    exit_code = ExitCode.TIMEOUT
    headline = "Timed out"


class Terminated(BaseException):
    """The process got a termination signal (SIGTERM, SIGHUP); exit code 128 + the signal.

    A ``BaseException`` like ``KeyboardInterrupt``, so ``except Exception`` blocks do not swallow
    it while ``finally`` blocks (closing workers, the cluster, the run's files) still run."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(f"stopped by {signal.Signals(self.signum).name}")

    def __reduce__(self) -> tuple:
        return Terminated, (self.signum,)


def storage_error(what: str, path: str | Path, err: OSError | None = None) -> StorageError:
    """A :class:`StorageError` for ``what`` failing on ``path``: names the path, the OS error and
    the free space left on the path's file system."""
    path = Path(path)
    free = free_bytes(path)
    cause = f": {err.strerror or err}" if err is not None else ""
    space = f"; {format_bytes(free)} free on its file system" if free is not None else ""
    hint = " Free some space (or point run.dir at a bigger disk) and resume." if err is not None and err.errno in (
        errno.ENOSPC, errno.EDQUOT) else ""
    return StorageError(f"{what} failed at {path}{cause}{space}.{hint}", path, free)


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the file system holding ``path`` (or its nearest existing parent)."""
    import shutil

    p = Path(path)
    for candidate in (p, *p.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def format_bytes(n: int) -> str:
    """``n`` bytes as a short human string (``"1.5 GiB"``)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def exit_code_of(exc: BaseException) -> int:
    """The process exit code for a failure ``exc`` (see :class:`ExitCode`)."""
    if isinstance(exc, EmbodiedError):
        return int(exc.exit_code)
    if isinstance(exc, Terminated):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.SIGINT
    if isinstance(exc, TimeoutError):  # e.g. a ChannelTimeout raised in the driver
        return ExitCode.TIMEOUT
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return ExitCode.STORAGE
    return ExitCode.BUG


@dataclass
class FailureContext:
    """What the runner knows when a failure reaches it (every field optional)."""

    doing: str | None = None
    """What the run was doing, e.g. ``"collecting rollouts in iteration 12"``."""
    run_dir: Path | None = None
    checkpoint: Path | None = None
    """The newest intact checkpoint (None: none saved yet)."""
    checkpoint_iteration: int | None = None
    log_path: Path | None = None
    """The log file that holds the full traceback (see ``embodied.logs.log_failure``)."""
    resume_command: str | None = None
    """The command that continues the run; default ``embodied train resume=RUN_DIR``."""


#: Order and wording of the ``where`` keys in a failure paragraph.
_WHERE_LABELS = (
    ("group", "worker group {}"),
    ("rank", "rank {}"),
    ("node", "node {}"),
    ("pid", "pid {}"),
    ("env_process", "env process {}"),
    ("env_id", "env {}"),
    ("env_index", "env index {}"),
    ("seed", "seed {}"),
)


def where_of(exc: BaseException) -> dict[str, Any]:
    """What ``exc`` says about where it happened (its ``where`` dict, plus the env process index
    of an env worker error)."""
    where = dict(getattr(exc, "where", None) or {})
    index = getattr(exc, "worker_index", None)
    if index is not None:
        where.setdefault("env_process", index)
    return where


def format_failure(exc: BaseException, context: FailureContext | None = None) -> str:
    """ONE paragraph for the terminal about failure ``exc``.

    A user error is its message. Anything else reads: what failed and its exit code; where; what
    the run was doing; the last checkpoint; the exact command to resume; the log with the full
    traceback. For example::

        A worker failed (exit code 3): interact() failed: ValueError: bad action. Where: worker
        group env, rank 0, node host-1, pid 4242, env index 3, seed 7. Its output is in
        runs/x/logs/env-0.log. It happened while collecting rollouts in iteration 12. Last checkpoint: runs/x/checkpoints/iter_000010
        (iteration 10). Resume with `embodied train resume=runs/x`. Full traceback in
        runs/x/logs/driver.log.
    """
    ctx = context or FailureContext()
    code = exit_code_of(exc)
    if isinstance(exc, UserError):
        return first_paragraph(str(exc))
    if isinstance(exc, EmbodiedError):
        headline, what = exc.headline, exc.summary
    elif isinstance(exc, Terminated):
        headline, what = "Stopped", str(exc)
    elif isinstance(exc, KeyboardInterrupt):
        headline, what = "Interrupted", "Ctrl-C (SIGINT)"
    elif code == ExitCode.TIMEOUT:
        headline, what = "Timed out", f"{type(exc).__name__}: {first_paragraph(str(exc))}"
    elif code == ExitCode.STORAGE:
        headline, what = "Storage failed", f"{type(exc).__name__}: {first_paragraph(str(exc))}"
    else:
        headline = "Unexpected error (a bug: please report it with the log file)"
        what = f"{type(exc).__name__}: {first_paragraph(str(exc))}"
    parts = [f"{headline} (exit code {code}): {_sentence(what)}"]
    where = where_of(exc)
    # what the message already says (an env error names its env, index and seed) is not repeated
    known = [text for key, label in _WHERE_LABELS if where.get(key) is not None
             and not _says(what, text := label.format(where[key]))]
    if known:
        parts.append("Where: " + ", ".join(known) + ".")
    if where.get("log"):
        parts.append(f"Its output is in {where['log']}.")
    if ctx.doing:
        parts.append(f"It happened while {_sentence(ctx.doing)}")
    command = ctx.resume_command or (resume_command(ctx.run_dir) if ctx.run_dir is not None else None)
    if ctx.checkpoint is not None:
        at = f" (iteration {ctx.checkpoint_iteration})" if ctx.checkpoint_iteration is not None else ""
        parts.append(f"Last checkpoint: {ctx.checkpoint}{at}.")
        if command:
            parts.append(f"Resume with `{command}`.")
    elif command:
        parts.append(f"No checkpoint was saved yet: `{command}` starts the run again from its beginning, in the same run dir.")
    if ctx.log_path is not None:
        parts.append(f"Full traceback in {ctx.log_path}.")
    return " ".join(parts)


def resume_command(run_dir: str | Path, *overrides: str) -> str:
    """``embodied train resume=RUN_DIR [overrides]``, quoted for a POSIX shell (a run dir with
    spaces or quotes pastes as it is)."""
    return " ".join(["embodied train", f"resume={shlex.quote(str(run_dir))}", *(shlex.quote(o) for o in overrides)])


def fill_paragraph(text: str, width: int = 100) -> str:
    """``text`` on lines of at most ``width`` characters, broken only at spaces and never inside a
    `backticked` command (a run dir with spaces stays on one line, so the command pastes whole);
    a word or command longer than a line gets a line of its own."""
    lines: list[str] = []
    line = ""
    for token in re.findall(r"\S*`[^`]*`\S*|\S+", text):
        if line and len(line) + 1 + len(token) > width:
            lines.append(line)
            line = token
        else:
            line = f"{line} {token}" if line else token
    if line:
        lines.append(line)
    return "\n".join(lines)


def _says(text: str, phrase: str) -> bool:
    """Whether ``text`` holds ``phrase`` as whole words (``seed 1`` is not in ``seed 10``)."""
    return re.search(rf"(?<![\w]){re.escape(phrase)}(?![\w])", text) is not None


def first_paragraph(text: str) -> str:
    """``text`` up to an attached traceback or its first blank line, on one line."""
    head = text.split("\n--- traceback", 1)[0].split("\n\n", 1)[0]
    return " ".join(head.split())


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


@contextmanager
def exit_on_signals(signals: Iterable[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, the given signals raise :class:`Terminated` in the main thread, so the
    run's ``finally`` blocks close workers and files and the process exits with 128 + signal.

    Only in the main thread (Python delivers signals there); elsewhere a no-op. The previous
    handlers come back on exit. ``embodied.runtime.Cluster`` keeps this handler when Ray's
    ``ray.init`` would replace it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, raise_terminated) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def closest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The up to ``n`` candidates closest to ``name`` (for "did you mean" hints)."""
    candidates = list(candidates)
    found = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    if not found:
        # Fall back to candidates sharing the last dotted component or a prefix.
        tail = name.rsplit(".", 1)[-1]
        found = [c for c in candidates if c.rsplit(".", 1)[-1] == tail or c.startswith(name)][:n]
    return found


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ' Did you mean ...?' sentence, or '' when nothing is close."""
    return _did_you_mean(closest(name, candidates))


def _did_you_mean(found: list[str]) -> str:
    return " Did you mean " + " or ".join(repr(f) for f in found) + "?" if found else ""


#: Other frameworks' words for a config key's words (cleanrl, SB3, RLlib, verl): ``learning_rate``
#: is ``lr`` here. Used in both directions; each entry is a set of words that name one setting.
KEY_SYNONYMS: tuple[frozenset[str], ...] = tuple(frozenset(s) for s in (
    {"lr", "learning_rate", "learningrate", "step_size"},
    {"gamma", "discount", "discount_factor"},
    {"gae_lambda", "lambda", "lam", "gae_lam"},
    {"clip_ratio", "clip_range", "clip_coef", "clip_param", "clip_eps", "clip"},
    {"entropy_coeff", "ent_coef", "entropy_coef", "entropy_weight", "ent_coeff"},
    {"vf_coef", "value_coef", "vf_loss_coeff", "value_loss_coef", "vf_coeff"},
    {"epochs", "n_epochs", "update_epochs", "num_epochs", "ppo_epochs"},
    {"num_minibatches", "n_minibatches", "minibatches"},
    {"rollout_steps", "num_steps", "n_steps", "horizon", "rollout_length"},
    {"total_env_steps", "total_timesteps", "total_steps", "timesteps", "num_env_steps"},
    {"num_envs", "n_envs", "num_env", "envs"},
    {"max_grad_norm", "grad_clip", "clip_grad_norm", "grad_norm"},
    {"norm_adv", "normalize_advantage", "norm_advantages", "normalize_advantages"},
    {"hidden_sizes", "net_arch", "hidden_dims", "layers"},
    {"max_episode_steps", "time_limit", "episode_length", "max_steps"},
))


def _words(key: str) -> list[str]:
    return [w for w in re.split(r"[_\-]+", key.lower()) if w]


def closest_keys(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The up to ``n`` dotted config keys closest to the unknown key ``name``.

    In order: a known synonym of its last part under the same prefix (``algo.learning_rate`` ->
    ``algo.lr``); a key whose last part is its initials or the other way round (``lr`` <->
    ``learning_rate``); keys spelled alike (:func:`closest`); keys under the same prefix sharing a
    word of the last part or starting with it (``algo.clip`` -> ``algo.clip_ratio``)."""
    candidates = list(candidates)
    prefix, _, tail = name.rpartition(".")
    here = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == prefix}
    found: list[str] = []

    def add(keys: Iterable[str]) -> None:
        for key in keys:
            if key not in found:
                found.append(key)

    low = tail.lower()
    for group in KEY_SYNONYMS:
        if low in group or low.replace("-", "_") in group:
            add(here[t] for t in sorted(group) if t in here and t != tail)
    words = _words(tail)
    initials = "".join(w[0] for w in words)
    add(c for t, c in here.items() if len(words) > 1 and t.lower() == initials
        or len(_words(t)) > 1 and "".join(w[0] for w in _words(t)) == low)
    if found:
        return found[:n]
    add(closest(name, candidates, n))
    if len(found) < n and words:
        shared = [c for t, c in here.items() if c not in found and (set(words) & set(_words(t)) or t.lower().startswith(low))]
        add(sorted(shared, key=lambda c: -difflib.SequenceMatcher(None, tail, c.rpartition(".")[2]).ratio()))
    return found[:n]


def did_you_mean_key(name: str, candidates: Iterable[str]) -> str:
    """A ' Did you mean ...?' sentence for an unknown config key (:func:`closest_keys`), or ''."""
    return _did_you_mean(closest_keys(name, candidates))
