"""``Channel``: a keyed FIFO from producers to the ranks of one consumer worker group.

``put(key, item)`` never waits for the consumer. ``get(key)`` / ``get_batch(key, n)`` block (with a
timeout) on the consumer rank that owns ``key``: ``route(key) -> rank`` decides which, so chunk i
of an env batch reaches the rollout rank that serves it.

The transport is picked per pair of endpoints and callers never see it:

* consumer in this process (local backend, or a worker sending to itself): the item is appended to
  the consumer's mailbox directly, no copy;
* consumer in another process on this machine: the item goes over a Unix socket straight into the
  consumer's mailbox (``socket_transport``: ~50 us a message, arrays sent out of band);
* consumer on another machine: one fire-and-forget Ray actor call to the consumer's host, which
  files the item in its mailbox (arrays through Ray's object store).
  There is no broker in between: one hop per message.
* GPU to GPU (NCCL) is the seam left for CUDA tensors: ``Transport`` is the place to add it.
"""

from __future__ import annotations

import itertools
import threading
import uuid
import zlib
from collections.abc import Callable
from typing import Any

from embodied.runtime.mailbox import local_mailbox
from embodied.runtime.socket_transport import outbox, this_host
from embodied.runtime.worker import WorkerGroup


def default_route(key: Any, num_ranks: int) -> int:
    """Ints go to ``key % num_ranks``; tuples by their first int; anything else by a stable hash."""
    if isinstance(key, int):
        return key % num_ranks
    if isinstance(key, tuple) and key and isinstance(key[0], int):
        return key[0] % num_ranks
    return zlib.crc32(repr(key).encode()) % num_ranks


class Channel:
    """A named, keyed FIFO whose consumers are the ranks of ``consumers``."""

    def __init__(
        self,
        name: str,
        consumers: WorkerGroup,
        route: Callable[[Any, int], int] = default_route,
        timeout_s: float | None = None,
        *,
        phase: bool = False,
        source: str | None = None,
    ) -> None:
        """``timeout_s``: longest wait of a ``get`` (default ``cluster.timeout_s``: one message;
        with ``phase``, ``cluster.phase_timeout_s``: items that take a whole phase to produce,
        such as a rollout's batch). ``source``: the producing worker group, named when a wait
        times out."""
        self.name = name
        self.group = consumers.name
        self.num_ranks = consumers.num_ranks
        self.route = route
        self.source = source
        if timeout_s is not None:
            self.timeout_s, self.timeout_key = timeout_s, "the timeout given to this channel"
        elif phase:
            self.timeout_s, self.timeout_key = consumers.phase_timeout_s, "cluster.phase_timeout_s"
        else:
            self.timeout_s, self.timeout_key = consumers.timeout_s, "cluster.timeout_s"
        self._endpoints = consumers.endpoints()
        self._init_producer()

    def _init_producer(self) -> None:
        self._producer = uuid.uuid4().hex
        self._seq: dict[Any, itertools.count] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for k in ("_producer", "_seq", "_lock"):
            state.pop(k)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_producer()  # each process that holds a copy is its own producer

    def owner(self, key: Any) -> int:
        rank = self.route(key, self.num_ranks)
        if not 0 <= rank < self.num_ranks:
            raise ValueError(f"channel {self.name!r}: route sent key {key!r} to rank {rank} of {self.num_ranks}")
        return rank

    def put(self, key: Any, item: Any) -> None:
        """Send ``item`` to the owner of ``key``; returns at once."""
        rank = self.owner(key)
        with self._lock:
            seq = next(self._seq.setdefault(key, itertools.count()))
        box = local_mailbox(self.group, rank)
        if box is not None:
            box.push(self.name, key, self._producer, seq, item)
            return
        endpoint = self._endpoints[rank]
        if endpoint.address is not None and endpoint.address[0] == this_host():
            try:
                outbox().send(endpoint.address[1], (self.name, key, self._producer, seq, item))
                return
            except OSError:
                pass  # the socket is gone (worker restarting?): Ray still reaches it
        endpoint.handle.push.remote(self.name, key, self._producer, seq, item)

    def get(self, key: Any, timeout_s: float | None = None) -> Any:
        """Pop the next item for ``key``; must be called on the rank that owns ``key``."""
        return self._get(key, None, timeout_s)

    def get_batch(self, key: Any, n: int, timeout_s: float | None = None) -> list[Any]:
        """Pop the next ``n`` items for ``key`` (waits until all ``n`` arrived)."""
        return self._get(key, n, timeout_s)

    def _get(self, key: Any, n: int | None, timeout_s: float | None) -> Any:
        if timeout_s is None:
            timeout_s, timeout_key = self.timeout_s, self.timeout_key
        else:
            timeout_key = "the timeout given to this get"
        return self._mailbox(key).get(self.name, key, n, timeout_s, timeout_key, self.source)

    def _mailbox(self, key: Any):
        rank = self.owner(key)
        box = local_mailbox(self.group, rank)
        if box is None:
            raise RuntimeError(
                f"channel {self.name!r}: get({key!r}) must run on {self.group}[rank {rank}], the owner of the key"
            )
        return box

    def __repr__(self) -> str:
        return f"Channel({self.name!r} -> {self.group} x{self.num_ranks})"
