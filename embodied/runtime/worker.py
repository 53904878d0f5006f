"""Workers and worker groups.

A worker is a plain Python class (subclass :class:`Worker`). :class:`WorkerGroup` makes N ranks of
it: Ray actors with per-rank CPU/GPU resources on the ``ray`` backend, or plain objects with one
thread each on the ``local`` backend (breakpoints work; tests run fast). The code of the worker is
the same in both. ``group.remote.method(*args)`` calls a method on every rank, ``group.on(0)`` on
the chosen ones; each call returns a :class:`~embodied.runtime.futures.GroupFuture`, whose waits
and errors :mod:`embodied.runtime.futures` describes.

On Ray every rank is an actor whose class is named after the worker class (process title
``ray::EnvWorker``, ``ray::EnvWorker.call`` while it runs a call) and whose actor name is
``<group>:<rank>`` (``env:0`` in ``ray list actors``; a group whose name is taken in this Ray
session, e.g. re-created in a notebook, becomes ``env#2:0``). Each actor sends its logging,
warnings and Python-level stdout/stderr to ``<run_dir>/logs/<group>-<rank>.log`` when the
cluster has a run dir (``embodied.logs``).
"""

from __future__ import annotations

import concurrent.futures as cf
import difflib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from embodied import logs
from embodied.errors import storage_error
from embodied.runtime.cluster import Cluster
from embodied.runtime.futures import (
    GroupFuture,
    Location,
    WorkerEnvError,
    WorkerError,
    WorkerTimeout,
    WorkerUserError,
    _died,
    _Failure,
    _no_answer,
    _resolve,
    wait_all,
)
from embodied.runtime.mailbox import Mailbox, close_mailbox, register_mailbox

__all__ = ["Endpoint", "GroupFuture", "Location", "RankResources", "Remote", "Worker", "WorkerEnvError", "WorkerError",
           "WorkerGroup", "WorkerTimeout", "WorkerUserError", "public_methods", "unknown_method", "wait_all"]

W = TypeVar("W", bound="Worker")


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

    def ping(self) -> _Failure | Location:
        """The construction failure, or where this rank runs."""
        return self.failure if self.failure is not None else Location.here(getattr(self, "log_path", None))

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        if self.failure is not None:
            return self.failure
        return _run(self.worker, method, args, kwargs)

    def push(self, channel: str, key: Any, producer: str, seq: int, item: Any) -> None:
        self.worker.mailbox.push(channel, key, producer, seq, item)


_RAY_HOST_BASE: Any = None
_RAY_HOSTS: dict[type, Any] = {}


def _ray_host_base() -> type:
    """The actor side of ``_Host`` on Ray: sends the process's output to its log, then
    constructs the worker; calls run one at a time in the default group, channel pushes in their
    own thread so a rank blocked in ``Channel.get`` still receives messages."""
    global _RAY_HOST_BASE
    if _RAY_HOST_BASE is None:
        import ray

        class RayHostBase(_Host):
            def __init__(self, cls: type, group: str, rank: int, world_size: int, args: tuple, kwargs: dict,
                         log_label: str, run_dir: str | None) -> None:
                self.inbox = None
                try:
                    log_path = logs.redirect_worker_output(log_label, run_dir)
                    self.log_path = str(log_path) if log_path is not None else None
                except OSError as exc:  # reported by ping() like a failed constructor
                    path = logs.worker_log_path(run_dir or ".", log_label)
                    self.failure = _Failure(storage_error("Opening the worker's log", path, exc))
                    return
                super().__init__(cls, group, rank, world_size, args, kwargs)
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

        _RAY_HOST_BASE = RayHostBase
    return _RAY_HOST_BASE


def _ray_host_class(cls: type) -> Any:
    """The Ray actor class hosting worker class ``cls``: named after it, so the actor's process
    title is ``ray::<cls name>`` and ``ray list actors`` shows that class (one per worker class;
    the behaviour is the shared base's)."""
    host = _RAY_HOSTS.get(cls)
    if host is None:
        import ray

        named = type(cls.__name__, (_ray_host_base(),), {"__qualname__": cls.__name__, "__module__": __name__})
        host = _RAY_HOSTS[cls] = ray.remote(concurrency_groups={"channel": 1})(named)
    return host


def _free_group_label(name: str, num_ranks: int) -> str:
    """A label for a group's Ray actor names (``<label>:<rank>``) that no live actor of this Ray
    session uses: ``name``, else ``name#2``, ``name#3``, ..."""
    import ray

    taken = set(ray.util.list_named_actors())
    k = 1
    while True:
        label = name if k == 1 else f"{name}#{k}"
        if not any(f"{label}:{rank}" in taken for rank in range(num_ranks)):
            return label
        k += 1


@dataclass(frozen=True)
class Endpoint:
    """Where a rank receives channel messages: its Ray actor handle and, for same-machine
    producers, its socket address ``(host, path)``."""

    handle: Any
    address: tuple[str, str] | None


@dataclass
class RankResources:
    """Resources of one rank: CPUs (may be fractional to colocate), GPUs, env vars, custom Ray
    resources (``{"node_trainer": 1}``: only nodes that offer them) and the Ray node id to run on
    (None: any node that has the resources)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    env_vars: dict[str, str] = field(default_factory=dict)
    custom: dict[str, float] = field(default_factory=dict)
    node: str | None = None


def public_methods(cls: type) -> frozenset[str]:
    """The names of ``cls``'s public methods (what a worker group can call on its ranks)."""
    return frozenset(name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name, None)))


def unknown_method(cls: type, method: str, methods: frozenset[str]) -> str:
    """One sentence for a call of a method ``cls`` does not have, with the closest names."""
    close = difflib.get_close_matches(method, sorted(methods), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{cls.__name__} has no method {method!r}{hint}"


class Remote:
    """The methods of a worker group's ranks (all, or the chosen ones), as attributes: each
    returns a function that calls the method on those ranks and returns a :class:`GroupFuture`."""

    __slots__ = ("_group", "_ranks")

    def __init__(self, group: WorkerGroup, ranks: Sequence[int] | None) -> None:
        self._group = group
        self._ranks = ranks

    def __getattr__(self, method: str) -> Callable[..., GroupFuture]:
        group = self._group
        if method not in group.methods:
            raise AttributeError(unknown_method(group.cls, method, group.methods))
        return functools.partial(group._call, method, ranks=self._ranks)

    def __repr__(self) -> str:
        ranks = "all ranks" if self._ranks is None else f"ranks {list(self._ranks)}"
        return f"<remote {self._group.name} ({ranks})>"


class WorkerGroup(Generic[W]):
    """``num_ranks`` instances of a worker class, created on the cluster's backend.

    ``group.remote.method(*args)`` calls ``method`` on every rank, ``group.on(0).method(*args)``
    on the chosen ranks; each call returns a :class:`GroupFuture`. The methods are the worker
    class's public ones, listed when the group is built: a misspelt name fails at the call site,
    before anything is sent, and an editor follows ``group.remote.method`` to the worker's code.
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
        self.phase_timeout_s = cluster.cfg.phase_timeout_s
        self.start_timeout_s = cluster.cfg.start_timeout_s
        self.methods = public_methods(cls)
        """The worker class's public methods: what :attr:`remote` and :meth:`on` can call."""
        res = resources if resources is not None else RankResources()
        self.resources = list(res) if isinstance(res, Sequence) else [res] * num_ranks
        self._executors: list[cf.ThreadPoolExecutor] = []
        self._addresses: list[tuple[str, str] | None] | None = None
        self.actor_names: list[str] = []
        """Ray actor names of the ranks (``<group>:<rank>``; empty on the local backend)."""
        self.log_paths: list[Path | None] = [None] * num_ranks
        """Each rank's log file (Ray backend with a run dir; known once started), else None."""
        self.locations: list[Location | None] = [None] * num_ranks
        """Where each rank runs (known once the group started)."""
        if self.backend == "ray":
            self._hosts = self._start_actors(cls, args, kwargs)
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
            started = GroupFuture(self.name, "__init__", list(range(num_ranks)), pings, self.backend, self.start_timeout_s,
                                  timeout_key="cluster.start_timeout_s").wait()
        except WorkerTimeout as err:
            want = ", ".join(f"{r.num_cpus:g} CPU / {r.num_gpus:g} GPU"
                             + "".join(f" / {v:g} {k}" for k, v in r.custom.items())
                             + (f" on node {r.node}" if r.node else "") for r in self.resources)
            self.shutdown()
            raise WorkerTimeout(
                self.name, err.rank, "__init__",
                f"not started within {self.start_timeout_s:g} s (cluster.start_timeout_s). Its ranks ask for [{want}] and "
                f"the cluster has {cluster.num_cpus:g} CPUs / {cluster.num_gpus:g} GPUs in all: are enough free? A "
                "constructor that hangs (building an env or a model) looks the same: the rank's log says.",
            ) from None
        except BaseException:  # a rank failed to construct: stop the others too
            self.shutdown()
            raise
        self.locations = list(started)
        self.log_paths = [Path(loc.log) if loc.log else None for loc in self.locations]

    def _start_actors(self, cls: type, args: tuple, kwargs: dict) -> list[Any]:
        """One Ray actor per rank, named ``<label>:<rank>`` with a label free in this Ray session."""
        import ray

        host = _ray_host_class(cls)
        run_dir = self.cluster.run_dir
        for _ in range(10):  # another driver may take a free label between the look and the creation
            label = _free_group_label(self.name, self.num_ranks)
            hosts: list[Any] = []
            try:
                for rank, r in enumerate(self.resources):
                    log_label = f"{label}-{rank}"
                    placed = {}
                    if r.node is not None:  # the plan's node for this rank (a cluster of several)
                        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                        placed["scheduling_strategy"] = NodeAffinitySchedulingStrategy(r.node, soft=False)
                    hosts.append(host.options(
                        name=f"{label}:{rank}",
                        num_cpus=r.num_cpus,
                        num_gpus=r.num_gpus,
                        resources=dict(r.custom) or None,
                        max_concurrency=1,
                        runtime_env={"env_vars": r.env_vars} if r.env_vars else None,
                        **placed,
                    ).remote(cls, self.name, rank, self.num_ranks, args, kwargs, log_label,
                             str(run_dir) if run_dir is not None else None))
            except ValueError as err:  # ActorAlreadyExistsError: "The name ... is already taken"
                for h in hosts:
                    ray.kill(h)
                if "already taken" not in str(err):
                    raise
                continue
            self.actor_names = [f"{label}:{rank}" for rank in range(self.num_ranks)]
            return hosts
        raise RuntimeError(f"no free Ray actor name for worker group {self.name!r} after 10 tries")

    @property
    def remote(self) -> W:
        """Every rank's methods: ``group.remote.train(batch)`` calls ``train`` on every rank and
        returns a :class:`GroupFuture` (typed as the worker class so that editors and static
        walks follow the call to the method it runs)."""
        return cast(W, Remote(self, None))

    def on(self, *ranks: int) -> W:
        """The chosen ranks' methods: ``group.on(0).spaces()`` calls ``spaces`` on rank 0."""
        bad = [r for r in ranks if not 0 <= r < self.num_ranks]
        if not ranks or bad:
            raise ValueError(f"worker group {self.name} has ranks 0..{self.num_ranks - 1}; asked for {list(ranks)}")
        return cast(W, Remote(self, ranks))

    def _call(self, method: str, *args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> GroupFuture:
        """Send a call of ``method`` to ``ranks`` (None: every rank): what :class:`Remote` does for
        each attribute of :attr:`remote` and :meth:`on`."""
        if method not in self.methods:
            raise AttributeError(unknown_method(self.cls, method, self.methods))
        chosen = list(range(self.num_ranks)) if ranks is None else list(ranks)
        futures = []
        for rank in chosen:
            if self.backend == "ray":
                futures.append(self._hosts[rank].call.remote(method, args, kwargs))
            else:
                futures.append(self._executors[rank].submit(self._hosts[rank].call, method, args, kwargs))
        return GroupFuture(self.name, method, chosen, futures, self.backend, self.timeout_s,
                           [self.locations[r] for r in chosen], phase_timeout_s=self.phase_timeout_s)

    def endpoints(self) -> list[Endpoint]:
        """Per-rank addresses for channels (Ray handle and same-machine socket; None in-process)."""
        if self.backend != "ray":
            return [Endpoint(None, None)] * self.num_ranks
        if self._addresses is None:
            import ray

            try:
                self._addresses = ray.get([h.address.remote() for h in self._hosts], timeout=self.timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise WorkerTimeout(self.name, 0, "address", _no_answer(self.timeout_s, "cluster.timeout_s")) from None
        return [Endpoint(h, a) for h, a in zip(self._hosts, self._addresses)]

    def first_dead(self, method: str, timeout_s: float = 5.0) -> WorkerError | None:
        """The first rank whose process is gone, as the :class:`WorkerError` a call of ``method``
        on it gets (None: every rank answers or is busy; always None in-process). When ranks
        depend on each other (collectives), a survivor often reports the failure first: this
        names the rank that caused it."""
        if self.backend != "ray":
            return None
        import ray

        pings = [h.ping.remote() for h in self._hosts]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
        for rank, ref in enumerate(pings):
            if ref not in ready:
                continue  # busy in a call (or slow to answer): alive
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                future = GroupFuture(self.name, method, [rank], [ref], self.backend, timeout_s, [self.locations[rank]])
                return future.error(0, _died(str(err)))
        return None

    def shutdown(self) -> None:
        if self.backend == "ray":
            import ray

            for h in self._hosts:
                ray.kill(h)
        else:
            for rank, ex in enumerate(self._executors):
                # wake a rank blocked in a channel get: its thread would keep the process alive until
                # the get times out (a rank whose constructor failed has no worker, so no mailbox)
                worker = getattr(self._hosts[rank], "worker", None) if rank < len(self._hosts) else None
                if worker is not None:
                    close_mailbox(self.name, rank, worker.mailbox, f"worker group {self.name} was shut down")
                ex.shutdown(wait=False, cancel_futures=True)
        self._hosts = []

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name}, ranks={self.num_ranks}, backend={self.backend})"
