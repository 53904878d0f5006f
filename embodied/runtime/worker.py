"""Workers and worker groups.

A worker is a plain Python class (subclass :class:`Worker`). :class:`WorkerGroup` makes N ranks of
it: Ray actors with per-rank CPU/GPU resources on the ``ray`` backend, or plain objects with one
thread each on the ``local`` backend (breakpoints work; tests run fast). The code of the worker is
the same in both.

Calls return a :class:`GroupFuture`; :func:`wait_all` waits on several with a timeout and fails
fast: the first worker that raises (or dies) stops the wait with a :class:`WorkerError` naming the
group, the rank, the method and the original exception.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from embodied.errors import UserError
from embodied.runtime.cluster import Cluster
from embodied.runtime.mailbox import Mailbox, register_mailbox

W = TypeVar("W", bound="Worker")


class WorkerError(RuntimeError):
    """A worker raised or died. ``group``, ``rank``, ``method`` say which; ``cause`` is the original."""

    def __init__(self, group: str, rank: int, method: str, cause: BaseException | str, remote_tb: str = "") -> None:
        self.group, self.rank, self.method = group, rank, method
        self.cause = cause
        what = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        msg = f"worker {group}[rank {rank}] failed in {method}(): {what}"
        if remote_tb:
            msg += f"\n--- traceback in the worker ---\n{remote_tb.rstrip()}"
        super().__init__(msg)


class WorkerUserError(UserError):
    """A user error (bad config, unknown env id) raised inside a worker."""


class WorkerTimeout(WorkerError):
    """A worker did not answer within the timeout."""


class Worker:
    """Base class of every worker. ``rank``, ``world_size`` and ``group`` are set before
    ``__init__`` runs, so subclasses can use them there."""

    group: str
    rank: int
    world_size: int
    mailbox: Mailbox

    def _attach(self, group: str, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size
        self.mailbox = Mailbox()
        register_mailbox(group, rank, self.mailbox)


def _construct(cls: type[W], group: str, rank: int, world_size: int, args: tuple, kwargs: dict) -> W:
    obj = cls.__new__(cls)
    obj._attach(group, rank, world_size)
    obj.__init__(*args, **kwargs)
    return obj


class _Failure:
    """An exception captured inside a worker, shipped back as data (picklable, with its traceback)."""

    def __init__(self, exc: BaseException) -> None:
        self.type_name = type(exc).__name__
        self.message = str(exc)
        self.is_user_error = isinstance(exc, UserError)
        self.traceback = "".join(traceback.format_exception(exc))


def _run(obj: Any, method: str, args: tuple, kwargs: dict) -> Any:
    args = tuple(_resolve(a) for a in args)
    kwargs = {k: _resolve(v) for k, v in kwargs.items()}
    try:
        return getattr(obj, method)(*args, **kwargs)
    except Exception as exc:  # shipped to the driver, which raises a WorkerError
        return _Failure(exc)


class _Host:
    """What actually runs on a rank: constructs the worker and dispatches calls to it."""

    def __init__(self, cls: type, group: str, rank: int, world_size: int, args: tuple, kwargs: dict) -> None:
        self.failure: _Failure | None = None
        try:
            self.worker = _construct(cls, group, rank, world_size, args, kwargs)
        except Exception as exc:  # reported by ping()
            self.failure = _Failure(exc)

    def ping(self) -> Any:
        return self.failure if self.failure is not None else True

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        if self.failure is not None:
            return self.failure
        return _run(self.worker, method, args, kwargs)

    def push(self, channel: str, key: Any, producer: str, seq: int, item: Any) -> None:
        self.worker.mailbox.push(channel, key, producer, seq, item)


_RAY_HOST: Any = None


def _ray_host_class() -> Any:
    """The Ray actor class of ``_Host``: calls run one at a time in the default group, channel pushes
    in their own thread so a rank blocked in ``Channel.get`` still receives messages."""
    global _RAY_HOST
    if _RAY_HOST is None:
        import ray

        class RayHost(_Host):
            def __init__(self, *args: Any) -> None:
                super().__init__(*args)
                self.inbox = None
                if self.failure is None:
                    from embodied.runtime.socket_transport import SocketInbox

                    try:
                        self.inbox = SocketInbox(self.worker.mailbox)
                    except OSError:  # no Unix sockets here: channels fall back to Ray calls
                        self.inbox = None

            def address(self) -> tuple[str, str] | None:
                return self.inbox.address if self.inbox is not None else None

            @ray.method(concurrency_group="channel")
            def push(self, channel: str, key: Any, producer: str, seq: int, item: Any) -> None:
                super().push(channel, key, producer, seq, item)

        _RAY_HOST = ray.remote(concurrency_groups={"channel": 1})(RayHost)
    return _RAY_HOST


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
    _results: list[Any] | None = field(default=None, repr=False)

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


def _check(fut: GroupFuture, i: int, value: Any) -> Any:
    if isinstance(value, _Failure):
        err_cls = WorkerUserError if value.is_user_error else WorkerError
        if value.is_user_error:
            raise err_cls(f"{value.message} (raised in worker {fut.group}[rank {fut.ranks[i]}])")
        raise WorkerError(fut.group, fut.ranks[i], fut.method, f"{value.type_name}: {value.message}", value.traceback)
    return value


def wait_all(*futures: GroupFuture, timeout_s: float | None = None) -> None:
    """Wait until every call finished. Fails fast: the first failure (an exception in a worker, a
    dead worker, or the timeout) raises at once, without waiting for the others."""
    pending = [f for f in futures if f._results is None]
    if not pending:
        return
    timeout = timeout_s if timeout_s is not None else max(f.timeout_s for f in pending)
    deadline = time.monotonic() + timeout
    if pending[0].backend == "ray":
        _wait_ray(pending, deadline)
    else:
        _wait_local(pending, deadline)


def _owner(pending: list[GroupFuture], item: Any) -> tuple[GroupFuture, int]:
    for f in pending:
        for i, x in enumerate(f.futures):
            if x is item:
                return f, i
    raise KeyError(item)


def _wait_ray(pending: list[GroupFuture], deadline: float) -> None:
    import ray

    values: dict[int, Any] = {}
    waiting = [x for f in pending for x in f.futures]
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            f, i = _owner(pending, waiting[0])
            raise WorkerTimeout(f.group, f.ranks[i], f.method, f"no answer within the timeout")
        ready, waiting = ray.wait(waiting, num_returns=1, timeout=min(remaining, 5.0))
        for ref in ready:
            f, i = _owner(pending, ref)
            try:
                value = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                raise WorkerError(f.group, f.ranks[i], f.method, f"the worker process died ({err})") from None
            except ray.exceptions.RayError as err:
                raise WorkerError(f.group, f.ranks[i], f.method, str(err)) from None
            values[id(ref)] = _check(f, i, value)
    for f in pending:
        f._results = [values[id(x)] for x in f.futures]


def _wait_local(pending: list[GroupFuture], deadline: float) -> None:
    waiting = {x for f in pending for x in f.futures}
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            f, i = _owner(pending, next(iter(waiting)))
            raise WorkerTimeout(f.group, f.ranks[i], f.method, "no answer within the timeout")
        done, waiting = cf.wait(waiting, timeout=remaining, return_when=cf.FIRST_COMPLETED)
        for x in done:
            f, i = _owner(pending, x)
            _check(f, i, x.result())
    for f in pending:
        f._results = [_check(f, i, x.result()) for i, x in enumerate(f.futures)]


@dataclass(frozen=True)
class Endpoint:
    """Where a rank receives channel messages: its Ray actor handle and, for same-machine
    producers, its socket address ``(host, path)``."""

    handle: Any
    address: tuple[str, str] | None


@dataclass
class RankResources:
    """Resources of one rank: CPUs (may be fractional to colocate), GPUs, and env vars."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    env_vars: dict[str, str] = field(default_factory=dict)


class WorkerGroup(Generic[W]):
    """``num_ranks`` instances of a worker class, created on the cluster's backend.

    ``group.call("method", *args, ranks=None)`` calls every rank (or the chosen ranks) and returns a
    :class:`GroupFuture`. ``group.method(*args)`` is a shortcut for calling every rank.
    """

    def __init__(
        self,
        cluster: Cluster,
        cls: type[W],
        num_ranks: int,
        *args: Any,
        name: str | None = None,
        resources: RankResources | Sequence[RankResources] | None = None,
        **kwargs: Any,
    ) -> None:
        if num_ranks < 1:
            raise ValueError("num_ranks must be >= 1")
        self.cluster = cluster
        self.cls = cls
        self.name = name or cls.__name__
        self.num_ranks = num_ranks
        self.backend = cluster.backend
        self.timeout_s = cluster.cfg.timeout_s
        res = resources if resources is not None else RankResources()
        self.resources = list(res) if isinstance(res, Sequence) else [res] * num_ranks
        self._executors: list[cf.ThreadPoolExecutor] = []
        self._addresses: list[tuple[str, str] | None] | None = None
        if self.backend == "ray":
            host = _ray_host_class()
            self._hosts = [
                host.options(
                    num_cpus=r.num_cpus,
                    num_gpus=r.num_gpus,
                    max_concurrency=1,
                    runtime_env={"env_vars": r.env_vars} if r.env_vars else None,
                ).remote(cls, self.name, rank, num_ranks, args, kwargs)
                for rank, r in enumerate(self.resources)
            ]
            pings = [h.ping.remote() for h in self._hosts]
        else:
            self._hosts = []
            for rank in range(num_ranks):
                ex = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-{rank}")
                self._executors.append(ex)
                self._hosts.append(ex.submit(_Host, cls, self.name, rank, num_ranks, args, kwargs).result())
            pings = [self._executors[r].submit(self._hosts[r].ping) for r in range(num_ranks)]
        # Construction errors surface here, naming the rank.
        try:
            GroupFuture(self.name, "__init__", list(range(num_ranks)), pings, self.backend, self.timeout_s).wait()
        except WorkerTimeout as err:
            want = ", ".join(f"{r.num_cpus:g} CPU / {r.num_gpus:g} GPU" for r in self.resources)
            raise WorkerTimeout(
                self.name, err.rank, "__init__",
                f"not started within {self.timeout_s:.0f} s. Its ranks ask for [{want}] and the cluster has "
                f"{cluster.num_cpus:g} CPUs / {cluster.num_gpus:g} GPUs in all: are enough free?",
            ) from None

    def call(self, method: str, *args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> GroupFuture:
        if not callable(getattr(self.cls, method, None)):
            raise AttributeError(f"{self.cls.__name__} has no method {method!r}")
        chosen = list(range(self.num_ranks)) if ranks is None else list(ranks)
        futures = []
        for rank in chosen:
            if self.backend == "ray":
                futures.append(self._hosts[rank].call.remote(method, args, kwargs))
            else:
                futures.append(self._executors[rank].submit(self._hosts[rank].call, method, args, kwargs))
        return GroupFuture(self.name, method, chosen, futures, self.backend, self.timeout_s)

    def call_per_rank(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> GroupFuture:
        """Call ``method`` on every rank with its own positional args."""
        futures = []
        for rank, args in enumerate(per_rank_args):
            if self.backend == "ray":
                futures.append(self._hosts[rank].call.remote(method, tuple(args), kwargs))
            else:
                futures.append(self._executors[rank].submit(self._hosts[rank].call, method, tuple(args), kwargs))
        return GroupFuture(self.name, method, list(range(len(futures))), futures, self.backend, self.timeout_s)

    def endpoints(self) -> list[Endpoint]:
        """Per-rank addresses for channels (Ray handle and same-machine socket; None in-process)."""
        if self.backend != "ray":
            return [Endpoint(None, None)] * self.num_ranks
        if self._addresses is None:
            import ray

            self._addresses = ray.get([h.address.remote() for h in self._hosts], timeout=self.timeout_s)
        return [Endpoint(h, a) for h, a in zip(self._hosts, self._addresses)]

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, *args, **kwargs)

    def shutdown(self) -> None:
        if self.backend == "ray":
            import ray

            for h in self._hosts:
                ray.kill(h)
        else:
            for ex in self._executors:
                ex.shutdown(wait=False, cancel_futures=True)
        self._hosts = []

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name}, ranks={self.num_ranks}, backend={self.backend})"

