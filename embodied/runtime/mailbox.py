"""The receiving end of channels: one ``Mailbox`` per worker rank, holding keyed FIFOs.

Messages carry (producer, sequence number) so each producer's messages to a key are delivered in
the order they were put, whatever order the transport delivers them in.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Any


class ChannelTimeout(TimeoutError):
    """No message arrived on a channel key within the timeout."""


class ChannelClosed(RuntimeError):
    """The receiving rank's group was shut down while a ``get`` waited on one of its channels."""


class Mailbox:
    def __init__(self) -> None:
        self._closed: str | None = None
        self._cond = threading.Condition()
        self._queues: dict[tuple[str, Any], deque] = defaultdict(deque)
        self._held: dict[tuple[str, Any, str], dict[int, Any]] = defaultdict(dict)
        self._next_seq: dict[tuple[str, Any, str], int] = defaultdict(int)

    def push(self, channel: str, key: Any, producer: str, seq: int, item: Any) -> None:
        with self._cond:
            stream = (channel, key, producer)
            held = self._held[stream]
            held[seq] = item
            queue = self._queues[(channel, key)]
            while self._next_seq[stream] in held:
                queue.append(held.pop(self._next_seq[stream]))
                self._next_seq[stream] += 1
            self._cond.notify_all()

    def get(self, channel: str, key: Any, n: int | None, timeout_s: float, timeout_key: str = "cluster.timeout_s",
            source: str | None = None) -> Any:
        """Pop one item (``n`` None) or a list of ``n`` items from ``(channel, key)``; a
        :class:`ChannelTimeout` naming ``timeout_key`` (the config key of ``timeout_s``) and the
        ``source`` (the producing worker group, when known) after ``timeout_s``."""
        want = 1 if n is None else n
        deadline = time.monotonic() + timeout_s
        with self._cond:
            queue = self._queues[(channel, key)]
            while len(queue) < want:
                if self._closed is not None:
                    raise ChannelClosed(f"channel {channel!r} key {key!r}: {self._closed}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    sender = f"worker group {source}" if source else "the worker that sends on it"
                    got = f" ({len(queue)} of {want} items came)" if want > 1 else ""
                    raise ChannelTimeout(
                        f"channel {channel!r} key {key!r}: no answer within {timeout_s:g} s ({timeout_key}){got}. "
                        f"{sender[0].upper() + sender[1:]} is stuck or dead (an env step or a policy that hangs, a "
                        f"deadlock): its log says more."
                        + (f" Raise {timeout_key} if it is just slow." if timeout_key.startswith("cluster.") else "")
                    )
                self._cond.wait(remaining)
            items = [queue.popleft() for _ in range(want)]
        return items[0] if n is None else items

    def close(self, reason: str) -> None:
        """Wake every waiting ``get`` (and fail later ones) with :class:`ChannelClosed` saying ``reason``."""
        with self._cond:
            self._closed = reason
            self._cond.notify_all()


_MAILBOXES: dict[tuple[str, int], Mailbox] = {}
_LOCK = threading.Lock()


def register_mailbox(group: str, rank: int, mailbox: Mailbox) -> None:
    with _LOCK:
        _MAILBOXES[(group, rank)] = mailbox


def close_mailbox(group: str, rank: int, mailbox: Mailbox, reason: str) -> None:
    """Close ``mailbox``, that of ``group[rank]`` in this process, whose group shut down: a thread
    blocked in one of its channel ``get`` calls ends now instead of at its timeout, which would
    otherwise keep the process alive that long (the interpreter joins those threads at exit). The
    name is freed only if a newer rank has not taken it."""
    with _LOCK:
        if _MAILBOXES.get((group, rank)) is mailbox:
            del _MAILBOXES[(group, rank)]
    mailbox.close(reason)


def local_mailbox(group: str, rank: int) -> Mailbox | None:
    """The mailbox of ``group[rank]`` if that rank lives in this process."""
    return _MAILBOXES.get((group, rank))
