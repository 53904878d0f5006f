"""The run's log files, what the terminal shows, and the names of worker processes.

Layout of ``<run_dir>/logs/``:

* ``driver.log``: everything the driver logs at DEBUG: Python logging of every library, captured
  ``warnings``, Ray's own loggers (e.g. its token-authentication notice), and the full traceback
  of a failure (:func:`log_failure`).
* ``<label>.log``: one per worker process: ``env-0.log`` (rank 0 of the ``env`` group, a Ray
  actor), ``env-0-shard1.log`` (the env process hosting shard 1 of that worker's vectorized
  env), ``driver-shard0.log`` (an env process of the driver, e.g. during evaluation). Each holds
  that process's logging, warnings and Python-level stdout/stderr.

The terminal shows INFO and above from the project's logger hierarchy (``embodied.*``: what a
user needs to follow the run) and errors of everything else except Ray's own loggers (a Ray
failure reaches the user as a ``WorkerError`` paragraph). ``EMBODIED_DEBUG=1`` (or
``open_run_log(..., debug=True)``) shows everything on the terminal too, and lets Ray stream the
workers' output to it.

Driver side::

    with open_run_log(run_dir) as run_log:       # before the Cluster starts
        try:
            ...
        except BaseException as exc:             # full traceback -> driver.log, one paragraph -> terminal
            return report_failure(exc, FailureContext(doing="...", run_dir=run_dir, checkpoint=...))

Worker side (the runtime calls these; see ``embodied.runtime.worker`` and
``envs.multiprocess.worker``): :func:`redirect_worker_output` with the worker's label sends the
process's output to ``<run_dir>/logs/<label>.log``, taking the run dir from ``EMBODIED_RUN_DIR``
(set by :func:`open_run_log`, passed on to every Ray worker by ``Cluster``) and exporting
``EMBODIED_LOG_LABEL`` so the env processes it starts name their logs after it
(:func:`child_label`). :func:`set_process_title` names a process for ``ps``/``top``/``htop``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import socket
import threading
import sys
import textwrap
import time
from pathlib import Path
from typing import TextIO

from embodied.errors import FailureContext, UserError, exit_code_of, format_failure

#: Env var holding the run dir, so every worker process knows where to write its log.
RUN_DIR_ENV = "EMBODIED_RUN_DIR"
#: Env var holding this process's log label; child processes derive theirs from it.
LABEL_ENV = "EMBODIED_LOG_LABEL"
#: ``EMBODIED_DEBUG=1`` shows everything on the terminal.
DEBUG_ENV = "EMBODIED_DEBUG"
#: The project's user-facing logger hierarchy: its INFO+ messages reach the terminal.
USER_LOGGER = "embodied"
LOG_DIR = "logs"
DRIVER_LOG = "driver.log"
#: The label of the driver process (its env processes log to ``driver-shard<i>.log``).
DRIVER_LABEL = "driver"

_FILE_FORMAT = "%(asctime)s %(levelname)-7s %(processName)s[%(process)d] %(name)s: %(message)s"
#: Loggers of Ray itself (the terminal shows them only in debug mode).
_RAY_LOGGERS = ("ray",)

log = logging.getLogger(__name__)


def debug_enabled() -> bool:
    """Whether ``EMBODIED_DEBUG`` asks for everything on the terminal."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def log_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/logs``."""
    return Path(run_dir) / LOG_DIR


def worker_log_path(run_dir: str | Path, label: str) -> Path:
    """The log file of the worker process labelled ``label`` (``<run_dir>/logs/<label>.log``)."""
    safe = "".join(c if c.isalnum() or c in "-_.#" else "_" for c in label)
    return log_dir(run_dir) / f"{safe}.log"


class _StderrAtEmit(logging.StreamHandler):
    """A stream handler writing to whatever ``sys.stderr`` is when a record is emitted (so
    redirections made later, e.g. by pytest, are honoured)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self._fixed = stream

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: TextIO | None) -> None:
        self._fixed = value


class _LogFile(logging.FileHandler):
    """The driver's log file. A disk that fills up must not turn every later log line into a
    "--- Logging error ---" traceback on the terminal, nor the closing of the log into a new
    failure: records that cannot be written are dropped (the run's own StorageError says what
    happened) and the file is closed quietly."""

    failed = False
    """Whether a record could not be written (the file misses lines from then on)."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            self.failed = True  # dropped: the disk is full or gone
            return
        super().handleError(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:
            self.failed = True

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # the last flush hit a full disk
            self.failed = True
            self.stream = None  # type: ignore[assignment]


class _TerminalFilter(logging.Filter):
    """What the terminal shows: the project's INFO+ and other libraries' errors (not Ray's);
    everything in debug mode. A record logged with ``extra={"terminal": False}`` never shows
    (a traceback meant for the log file only)."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "terminal", True) is False:
            return False
        if self.debug:
            return True
        name = record.name
        if name == USER_LOGGER or name.startswith(USER_LOGGER + "."):
            return record.levelno >= logging.INFO
        if any(name == r or name.startswith(r + ".") for r in _RAY_LOGGERS):
            return False
        return record.levelno >= logging.ERROR


class _TerminalFormatter(logging.Formatter):
    """INFO as the bare message; warnings and errors prefixed with their level (and, outside
    the project's loggers, the logger's name)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno <= logging.INFO:
            return message
        level = record.levelname.lower()
        own = record.name == USER_LOGGER or record.name.startswith(USER_LOGGER + ".")
        prefix = f"{level}: " if own else f"{level} ({record.name}): "
        return prefix + message


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook`` while a run log is open: the thread's traceback to the log file,
    one warning line to the terminal."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "a thread"
    log = logging.getLogger(__name__)
    log.error("exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
              extra={"terminal": False})
    log.warning("background thread %s failed: %s: %s (traceback in the run's logs/driver.log)", name,
                args.exc_type.__name__, args.exc_value)


class RunLog:
    """The driver's log setup for one run (see :func:`open_run_log`). ``close`` undoes it."""

    def __init__(self, run_dir: str | Path, debug: bool, terminal: TextIO | None) -> None:
        self.run_dir = Path(run_dir)
        self.debug = debug
        self.path = log_dir(self.run_dir) / DRIVER_LOG
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = _LogFile(self.path, mode="a", encoding="utf-8", delay=False)
        self._file.setLevel(logging.DEBUG)
        self._file.setFormatter(logging.Formatter(_FILE_FORMAT))
        self._terminal = _StderrAtEmit(terminal)
        self._terminal.setLevel(logging.DEBUG)
        self._terminal.addFilter(_TerminalFilter(debug))
        self._terminal.setFormatter(_TerminalFormatter())
        root = logging.getLogger()
        self._root_level = root.level
        root.setLevel(logging.DEBUG)
        self._console_was_on = _console is not None and _console in root.handlers
        if self._console_was_on:
            root.removeHandler(_console)  # this run's terminal handler takes its place
        root.addHandler(self._file)
        root.addHandler(self._terminal)
        self._captured_warnings = _warnings_captured()
        logging.captureWarnings(True)
        self._env = {key: os.environ.get(key) for key in (RUN_DIR_ENV, LABEL_ENV)}
        os.environ[RUN_DIR_ENV] = str(self.run_dir.resolve())
        os.environ[LABEL_ENV] = DRIVER_LABEL
        self._ray_state: dict[str, tuple[int, bool, list[logging.Handler]]] = {}
        self._closed = False
        # a library's background thread that dies (TensorBoard's writer on a full disk) would print
        # its traceback on the terminal: the traceback goes to the log, one line to the terminal
        self._thread_hook = threading.excepthook
        threading.excepthook = _log_thread_exception
        logging.getLogger(__name__).debug(
            "run log opened: pid %d on %s, python %s, argv %s", os.getpid(), socket.gethostname(),
            sys.version.split()[0], sys.argv,
        )
        if "ray" in sys.modules:
            self.adopt_ray_loggers()

    @property
    def file_failed(self) -> bool:
        """Whether a line could not be written to ``driver.log`` (a full disk)."""
        return self._file.failed

    def adopt_ray_loggers(self) -> None:
        """Route Ray's own loggers (configured by ``import ray`` with a handler of their own that
        writes to the terminal) into this log instead. Called again by ``Cluster`` right before
        ``ray.init``; idempotent."""
        if self._closed:
            return
        import ray  # noqa: F401  (its import configures the "ray" logger; adopt after that)

        for name in _RAY_LOGGERS:
            logger = logging.getLogger(name)
            if name not in self._ray_state:
                self._ray_state[name] = (logger.level, logger.propagate, list(logger.handlers))
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True
            logger.setLevel(logging.DEBUG)

    def close(self) -> None:
        """Remove this run's handlers and restore the logging state found at open."""
        if self._closed:
            return
        self._closed = True
        global _current
        root = logging.getLogger()
        root.removeHandler(self._file)
        root.removeHandler(self._terminal)
        root.setLevel(self._root_level)
        if self._console_was_on and _console is not None:
            root.addHandler(_console)
        self._file.close()
        logging.captureWarnings(self._captured_warnings)
        if threading.excepthook is _log_thread_exception:
            threading.excepthook = self._thread_hook
        for name, (level, propagate, handlers) in self._ray_state.items():
            logger = logging.getLogger(name)
            logger.setLevel(level)
            logger.propagate = propagate
            for handler in handlers:
                logger.addHandler(handler)
        for key, value in self._env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if _current is self:
            _current = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_current: RunLog | None = None
_console: logging.Handler | None = None


def console_logging(debug: bool | None = None) -> None:
    """What the terminal shows when no run log is open (``embodied plan``, ``eval``, ``config``):
    the project's INFO+ and other libraries' errors, as in a run, without a log file. A run log
    opened later replaces it while it is open. Idempotent."""
    global _console
    root = logging.getLogger()
    if _console is None:
        _console = _StderrAtEmit()
        _console.setLevel(logging.DEBUG)
        _console.addFilter(_TerminalFilter(debug_enabled() if debug is None else debug))
        _console.setFormatter(_TerminalFormatter())
    if _console not in root.handlers and _current is None:
        root.addHandler(_console)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


def open_run_log(run_dir: str | Path, *, debug: bool | None = None, terminal: TextIO | None = None) -> RunLog:
    """Start the driver's log for a run: ``<run_dir>/logs/driver.log`` gets everything at DEBUG,
    the terminal (``terminal``, default ``sys.stderr``) what :class:`_TerminalFilter` lets
    through. ``debug`` (default: ``EMBODIED_DEBUG``) shows everything on the terminal too.

    Sets ``EMBODIED_RUN_DIR`` so worker processes started from now on write their own logs
    there. A run log already open is closed first (one run per driver process)."""
    global _current
    if _current is not None:
        _current.close()
    _current = RunLog(run_dir, debug_enabled() if debug is None else debug, terminal)
    return _current


def current_run_log() -> RunLog | None:
    """The run log open in this process, if any."""
    return _current


def log_failure(exc: BaseException, doing: str = "") -> Path | None:
    """Write the full traceback of ``exc`` (and of a worker, when the message carries one) to the
    driver log, not the terminal; returns the log's path to quote in the failure paragraph, or
    None when no run log is open."""
    run_log = _current
    if run_log is None:
        return None
    what = f"failure while {doing}" if doing else "failure"
    logging.getLogger(USER_LOGGER + ".failure").error(
        "%s: %s: %s", what, type(exc).__name__, exc, exc_info=(type(exc), exc, exc.__traceback__),
        extra={"terminal": False},
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    if run_log.file_failed:  # the run's disk is full: the traceback goes where there is room
        return write_traceback_file(exc)
    return run_log.path


def write_traceback_file(exc: BaseException) -> Path | None:
    """Write ``exc``'s full traceback to a new file in the temp dir (when no run log can hold
    it: before a run dir exists, or on a full disk); its path, or None if that fails too."""
    import tempfile
    import traceback

    try:
        fd, path = tempfile.mkstemp(prefix="embodied-error-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return Path(path)


def report_failure(exc: BaseException, context: FailureContext | None = None, *, prefix: str = "embodied: error: ",
                   stream: TextIO | None = None, width: int = 100) -> int:
    """End a run that failed with ``exc``: its full traceback to the driver log
    (:func:`log_failure`), ONE paragraph to the terminal (``stream``, default stderr; see
    ``embodied.errors.format_failure``, quoting the log), and the exit code to return
    (``embodied.errors.exit_code_of``)."""
    ctx = dataclasses.replace(context) if context is not None else FailureContext()
    if not isinstance(exc, UserError):
        path = log_failure(exc, ctx.doing or "")
        ctx.log_path = ctx.log_path or path
    paragraph = format_failure(exc, ctx)
    logging.getLogger(USER_LOGGER + ".failure").info("%s", paragraph, extra={"terminal": False})
    out = stream if stream is not None else sys.stderr
    # paths and the resume command stay whole (copy-pastable): break only at spaces
    out.write(textwrap.fill(paragraph, width=width, initial_indent=prefix, break_long_words=False,
                            break_on_hyphens=False) + "\n")
    out.flush()
    return exit_code_of(exc)


# --- worker processes ----------------------------------------------------------------------------


class _Tee:
    """A text stream writing to several streams (debug mode: the log file and the terminal)."""

    def __init__(self, *streams: TextIO) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for s in self._streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self._streams:
            s.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._streams[0].fileno()


def redirect_worker_output(label: str, run_dir: str | Path | None = None) -> Path | None:
    """Send this worker process's logging (DEBUG and up), captured ``warnings`` and Python-level
    stdout/stderr to ``<run_dir>/logs/<label>.log``; returns that path.

    ``run_dir`` defaults to ``EMBODIED_RUN_DIR``; without one nothing changes and None is
    returned (output then goes where the process's stdout/stderr go). Exports ``EMBODIED_RUN_DIR``
    and ``EMBODIED_LOG_LABEL`` so processes started by this one (env processes) log next to it.
    In debug mode (``EMBODIED_DEBUG``) the output also still goes to the old stdout/stderr."""
    run_dir = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return None
    path = worker_log_path(run_dir, label)
    path.parent.mkdir(parents=True, exist_ok=True)
    stream = open(path, "a", buffering=1, encoding="utf-8", errors="backslashreplace")
    os.environ[RUN_DIR_ENV] = str(Path(run_dir).resolve())
    os.environ[LABEL_ENV] = label
    multiprocessing.current_process().name = label  # the process name in every log line
    root = logging.getLogger()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    logging.captureWarnings(True)
    if debug_enabled():
        sys.stdout = _Tee(stream, sys.stdout)  # type: ignore[assignment]
        sys.stderr = _Tee(stream, sys.stderr)  # type: ignore[assignment]
    else:
        sys.stdout = sys.stderr = stream
    stream.write(f"--- {label}: pid {os.getpid()} on {socket.gethostname()}, {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
    return path


def child_label(suffix: str) -> str:
    """The log label of a process started by this one: ``<this process's label>-<suffix>``
    (``env-0-shard1``); ``main-<suffix>`` in a process without a label."""
    return f"{os.environ.get(LABEL_ENV) or 'main'}-{suffix}"


#: prctl(2) option that sets the calling thread's name (``/proc/self/comm``, 15 bytes).
_PR_SET_NAME = 15


def set_process_title(title: str, comm: str | None = None) -> None:
    """Name this process for ``ps``, ``top`` and ``htop`` (Linux; elsewhere a no-op).

    ``comm`` (default: ``title``; the kernel keeps 15 bytes) becomes ``/proc/self/comm`` through
    ``prctl(PR_SET_NAME)``: what ``ps -o comm``, ``ps -e``, ``top`` and ``pgrep`` show. ``title``
    overwrites the process's original command line (the argv area named by ``/proc/self/stat``,
    as setproctitle does; Python keeps its own copy of argv), which ``ps -f``, ``ps aux`` and
    ``htop`` show; a title longer than the original command line is cut to its length."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p((comm or title).encode()[:15]), 0, 0, 0)
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Fields after the command name (which may hold spaces); arg_start/arg_end are fields
        # 48 and 49 of proc(5), i.e. 45 and 46 counted from field 3.
        fields = stat[stat.rindex(b")") + 2 :].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return
    size = arg_end - arg_start
    if arg_start <= 0 or size < 2:
        return
    data = title.encode()[: size - 1]
    ctypes.memmove(arg_start, data + b"\0" * (size - len(data)), size)


def _warnings_captured() -> bool:
    """Whether ``logging.captureWarnings(True)`` is in effect (logging keeps the replaced
    ``warnings.showwarning`` while it is)."""
    return getattr(logging, "_warnings_showwarning", None) is not None
