"""What a call on a worker group gives back, and how it fails.

A call returns a :class:`GroupFuture`; :func:`wait_all` waits on several with a timeout and fails
fast: the first worker that raises (or dies) stops the wait with a :class:`WorkerError` naming the
group, the rank, the method, the node and pid, and the original exception. A wait on a call is
bounded by ``cluster.timeout_s``, or ``cluster.phase_timeout_s`` for a call that is a whole phase
of an iteration (:meth:`GroupFuture.as_phase`); a group's start by ``cluster.start_timeout_s``.
The timeout's message names the seconds and the key. The user's env failing inside a worker
(:class:`~embodied.errors.EnvError`) arrives as a :class:`WorkerEnvError`: "The env failed".

An exception inside a worker travels back as data (:class:`_Failure`: picklable, with its
traceback and where it happened); the driver turns it into the matching error here.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import re
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from embodied.errors import EnvError, ExitCode, UserError, WorkerFailure, exit_code_of, first_paragraph

#: the worker's log (a failure's traceback goes there too)
log = logging.getLogger("embodied.runtime.worker")

#: Attributes of an exception raised in a worker that are shipped to the driver as ``where``
#: entries of the :class:`WorkerError` (an env worker error's process index, an env's index/seed).
_WHERE_ATTRS = ("env_index", "seed", "worker_index")


class WorkerError(WorkerFailure):
    """A worker raised or died (exit code 3). ``group``, ``rank``, ``method`` say which; ``cause``
    is the original (its text when it was raised in another process); ``where`` also holds the
    ``node`` and ``pid`` of the rank and what the exception knew (``env_index``, ``seed``,
    ``env_process``)."""

    def __init__(
        self,
        group: str,
        rank: int,
        method: str,
        cause: BaseException | str,
        remote_tb: str = "",
        where: dict[str, Any] | None = None,
    ) -> None:
        self.group, self.rank, self.method = group, rank, method
        self.cause = cause
        self.remote_traceback = remote_tb
        what = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        self.what = what
        msg = f"worker {group}[rank {rank}] failed in {method}(): {what}"
        if remote_tb:
            msg += f"\n--- traceback in the worker ---\n{remote_tb.rstrip()}"
        super().__init__(msg, where={"group": group, "rank": rank, **(where or {})})

    @property
    def summary(self) -> str:
        return f"{self.method}() failed: {first_paragraph(self.what)}"


class WorkerUserError(UserError):
    """A user error (bad config, unknown env id) raised inside a worker."""


class WorkerEnvError(WorkerError):
    """The user's env failed inside a worker (an :class:`~embodied.errors.EnvError` there): it
    raised, returned NaN/inf, or its env process died or hung. Its paragraph reads "The env
    failed" with the env's own message (env id, index, seed), not a worker's or Embodied's bug."""

    headline = "The env failed"

    @property
    def summary(self) -> str:
        return first_paragraph(self.what)


class WorkerTimeout(WorkerError):
    """A worker did not answer within the timeout, or timed out waiting itself (exit code 5)."""

    exit_code = ExitCode.TIMEOUT
    headline = "Timed out"


@dataclass(frozen=True)
class Location:
    """Where a rank runs: its host name, process id, log file (None: no log file) and Ray node id
    (None outside Ray; tells apart nodes that share a host name)."""

    node: str
    pid: int
    log: str | None = None
    node_id: str | None = None

    @classmethod
    def here(cls, log: str | None = None) -> Location:
        return cls(socket.gethostname(), os.getpid(), log, _ray_node_id())


def _ray_node_id() -> str | None:
    """This process's Ray node id, when it is a Ray worker (or a connected driver)."""
    import sys

    ray = sys.modules.get("ray")  # never import Ray for this: the local backend does without it
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


class _Failure:
    """An exception captured inside a worker, shipped back as data (picklable, with its traceback,
    where it happened and what the exception knew about it)."""

    def __init__(self, exc: BaseException) -> None:
        self.type_name = type(exc).__name__
        self.message = str(exc)
        self.is_user_error = isinstance(exc, UserError)
        self.is_env_error = isinstance(exc, EnvError)
        self.exit_code = exit_code_of(exc)  # a full disk in a worker is still a storage failure (4)
        self.traceback = "".join(traceback.format_exception(exc))
        here = Location.here()
        self.where: dict[str, Any] = {"node": here.node, "pid": here.pid}
        self.where.update(getattr(exc, "where", None) or {})
        for attr in _WHERE_ATTRS:
            value = getattr(exc, attr, None)
            if isinstance(value, (int, str)):
                self.where["env_process" if attr == "worker_index" else attr] = value
        # The worker's own log file keeps the traceback too (DEBUG: without a log file, Python
        # would print WARNING+ to stderr; the driver reports the failure).
        log.debug("raised %s: %s\n%s", self.type_name, self.message, self.traceback.rstrip())


@dataclass
class _LocalRef:
    """A local-backend result passed as an argument to another call (resolved before the call,
    like a Ray ObjectRef)."""

    future: cf.Future


def _resolve(value: Any) -> Any:
    if type(value).__name__ == "ObjectRef":  # a Ray result passed on with GroupFuture.handle()
        import ray

        return ray.get(value)
    if isinstance(value, _LocalRef):
        result = value.future.result()
        if isinstance(result, _Failure):
            raise RuntimeError(f"an input of this call failed: {result.type_name}: {result.message}")
        return result
    return value


@dataclass
class GroupFuture:
    """Pending results of one call on some ranks of a group."""

    group: str
    method: str
    ranks: list[int]
    futures: list[Any]
    backend: str
    timeout_s: float
    locations: list[Location | None] | None = field(default=None, repr=False)
    """Where each of ``ranks`` runs (None: not known yet)."""
    timeout_key: str = "cluster.timeout_s"
    """The config key of ``timeout_s``, named when the wait times out."""
    phase_timeout_s: float | None = field(default=None, repr=False)
    """``cluster.phase_timeout_s`` (see :meth:`as_phase`)."""
    _results: list[Any] | None = field(default=None, repr=False)

    def as_phase(self) -> GroupFuture:
        """Mark this call as a whole phase of an iteration (collecting rollouts, training,
        rebuilding envs): waits on it are bounded by ``cluster.phase_timeout_s`` instead of
        ``cluster.timeout_s``. Returns the future itself."""
        if self.phase_timeout_s is not None:
            self.timeout_s, self.timeout_key = self.phase_timeout_s, "cluster.phase_timeout_s"
        return self

    def wait(self, timeout_s: float | None = None) -> list[Any]:
        """Results in rank order; raises WorkerError if any rank failed."""
        wait_all(self, timeout_s=timeout_s)
        assert self._results is not None
        return self._results

    def result(self, timeout_s: float | None = None) -> Any:
        """The result of a single-rank call."""
        results = self.wait(timeout_s)
        if len(results) != 1:
            raise ValueError(f"{self.group}.{self.method} ran on {len(results)} ranks; use wait()")
        return results[0]

    def handle(self, index: int = 0) -> Any:
        """Pass the result of rank ``ranks[index]`` to another call without fetching it here
        (a Ray ObjectRef: zero-copy for numpy arrays and tensors)."""
        fut = self.futures[index]
        return fut if self.backend == "ray" else _LocalRef(fut)

    def where(self, i: int) -> dict[str, Any]:
        """The node, pid and log file of ``ranks[i]``, when known."""
        loc = self.locations[i] if self.locations is not None else None
        if loc is None:
            return {}
        return {"node": loc.node, "pid": loc.pid, **({"log": loc.log} if loc.log else {})}

    def error(self, i: int, what: str, cls: type[WorkerError] | None = None) -> WorkerError:
        """A :class:`WorkerError` (or ``cls``) for ``ranks[i]`` of this call."""
        return (cls or WorkerError)(self.group, self.ranks[i], self.method, what, where=self.where(i))


def _check(fut: GroupFuture, i: int, value: Any) -> Any:
    if isinstance(value, _Failure):
        if value.is_user_error:
            raise WorkerUserError(f"{value.message} (raised in worker {fut.group}[rank {fut.ranks[i]}])")
        where = {**fut.where(i), **value.where}
        if value.is_env_error:  # the env's message names it; a hang keeps its exit code (5)
            err: WorkerError = WorkerEnvError(fut.group, fut.ranks[i], fut.method, value.message, value.traceback, where)
            if value.exit_code == ExitCode.TIMEOUT:
                err.exit_code, err.headline = ExitCode.TIMEOUT, "Timed out"
            raise err
        err_cls = WorkerTimeout if value.exit_code == ExitCode.TIMEOUT else WorkerError
        err = err_cls(fut.group, fut.ranks[i], fut.method, f"{value.type_name}: {value.message}", value.traceback,
                      where=where)
        if value.exit_code == ExitCode.STORAGE:
            err.exit_code, err.headline = ExitCode.STORAGE, "Storage failed"
        raise err
    return value


def wait_all(*futures: GroupFuture, timeout_s: float | None = None) -> None:
    """Wait until every call finished. Fails fast: the first failure (an exception in a worker, a
    dead worker, or the timeout) raises at once, without waiting for the others."""
    pending = [f for f in futures if f._results is None]
    if not pending:
        return
    if timeout_s is not None:
        timeout, key = timeout_s, "the timeout given to this wait"
    else:
        longest = max(pending, key=lambda f: f.timeout_s)
        timeout, key = longest.timeout_s, longest.timeout_key
    deadline = time.monotonic() + timeout
    if pending[0].backend == "ray":
        _wait_ray(pending, deadline, _no_answer(timeout, key))
    else:
        _wait_local(pending, deadline, _no_answer(timeout, key))


def _owner(pending: list[GroupFuture], item: Any) -> tuple[GroupFuture, int]:
    for f in pending:
        for i, x in enumerate(f.futures):
            if x is item:
                return f, i
    raise KeyError(item)


def _no_answer(timeout_s: float, key: str) -> str:
    """The message of a wait that timed out after ``timeout_s``, the value of config ``key``."""
    hint = f"; raise {key} if it is slow" if key.startswith("cluster.") else ""
    return (f"no answer within {timeout_s:g} s ({key}). The worker is stuck (a hanging env or simulator, a "
            f"deadlock) or just slow: its log says which{hint}")


def _wait_ray(pending: list[GroupFuture], deadline: float, no_answer: str) -> None:
    import ray

    values: dict[int, Any] = {}
    waiting = [x for f in pending for x in f.futures]
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            f, i = _owner(pending, waiting[0])
            raise f.error(i, no_answer, WorkerTimeout)
        ready, waiting = ray.wait(waiting, num_returns=1, timeout=min(remaining, 5.0))
        for ref in ready:
            f, i = _owner(pending, ref)
            try:
                value = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                raise f.error(i, _died(str(err))) from None
            except ray.exceptions.RayError as err:
                raise f.error(i, str(err)) from None
            values[id(ref)] = _check(f, i, value)
    for f in pending:
        f._results = [values[id(x)] for x in f.futures]


def _died(ray_message: str) -> str:
    """What a dead actor's error says, in one sentence: Ray's exit detail without its advice."""
    text = first_paragraph(ray_message)
    found = re.search(r"Worker exit detail: (.+?)(?:\s+Some common causes|$)", text)
    detail = (found[1] if found else text).strip().rstrip(".")
    return (f"the worker process died ({detail}). A kill, the out-of-memory killer or a crash (SIGSEGV) are the usual "
            "causes: its log and dmesg say more")


def _wait_local(pending: list[GroupFuture], deadline: float, no_answer: str) -> None:
    waiting = {x for f in pending for x in f.futures}
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            f, i = _owner(pending, next(iter(waiting)))
            raise f.error(i, no_answer, WorkerTimeout)
        done, waiting = cf.wait(waiting, timeout=remaining, return_when=cf.FIRST_COMPLETED)
        for x in done:
            f, i = _owner(pending, x)
            _check(f, i, x.result())
    for f in pending:
        f._results = [_check(f, i, x.result()) for i, x in enumerate(f.futures)]
